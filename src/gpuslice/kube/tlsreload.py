"""TLS for the webhook that follows its certificate files: renewed certificates are served without a restart.

uvicorn reads ``--tls-cert``/``--tls-key`` once. cert-manager (or the chart's job, or an operator) renews
the Secret, the kubelet swaps the mounted files, and a server that loaded them once keeps serving the
old certificate until it expires — then the API server can no longer call the webhook. Here the
listening :class:`ssl.SSLContext` has a server-name callback, run by OpenSSL at every handshake (with or
without SNI): it checks the files' identity (inode, size, mtime; at most every ``interval`` seconds) and,
when they changed, builds a fresh context from them and hands the connection that context. A pair that
does not load (mid-rotation: a new certificate with the old key) keeps the previous context and is tried
again at the next handshake, so the server never serves nothing.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from typing import Callable

log = logging.getLogger("gpuslice.tls")


class ReloadingTLS:
    """``build()`` makes a server context from the files (it reads them each time it is called)."""

    def __init__(self, certfile: str, keyfile: str | None, build: Callable[[], ssl.SSLContext], *,
                 interval: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.certfile, self.keyfile = certfile, keyfile
        self.build = build
        self.interval = interval
        self.clock = clock
        self.reloads = 0
        self._lock = threading.Lock()
        self._stamp = self._files()
        self._current = build()  # raises at startup when the files are bad: nothing to fall back to
        self._checked = clock()

    def _files(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.certfile, self.keyfile or self.certfile):
            st = os.stat(path)  # follows the Secret volume's ..data symlink swap
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def listening_context(self) -> ssl.SSLContext:
        """The context to listen with: every handshake goes through :meth:`_pick`."""
        ctx = self.build()
        ctx.sni_callback = self._pick
        return ctx

    def current(self) -> ssl.SSLContext:
        """The context new connections get, after looking at the files if ``interval`` has passed."""
        with self._lock:
            now = self.clock()
            if now - self._checked >= self.interval:
                self._checked = now
                self._refresh()
            return self._current

    def _refresh(self) -> None:
        try:
            stamp = self._files()
        except OSError as exc:  # a file missing for a moment during a swap: keep serving the last pair
            log.warning("TLS files %s / %s: %s; keeping the loaded certificate", self.certfile, self.keyfile, exc)
            return
        if stamp == self._stamp:
            return
        try:
            fresh = self.build()
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("TLS files %s / %s changed but do not load (%s); keeping the loaded certificate, "
                        "retrying", self.certfile, self.keyfile, exc)
            return  # the stamp stays old: the next check tries again
        self._current, self._stamp = fresh, stamp
        self.reloads += 1
        log.info("TLS certificate reloaded from %s (%d)", self.certfile, self.reloads)

    def _pick(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        conn.context = self.current()
