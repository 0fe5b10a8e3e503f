"""List, then watch from the list's resourceVersion, until told to stop: the loop behind the extender's node
cache and its pod usage."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator

log = logging.getLogger("gpuslice.extender")


def follow(what: str, refresh: Callable[[], str],
           watch: Callable[[str], Iterator[tuple[str, dict[str, Any]]]] | None,
           handle: Callable[[str, dict[str, Any]], None], stop: threading.Event, poll_interval: float) -> None:
    """``refresh()`` (a full list; returns its resourceVersion), then ``handle(type, object)`` for each watch event
    after it; list again when the watch ends or fails (the API server restarts, a resourceVersion expires), or
    every ``poll_interval`` seconds when there is no ``watch``."""
    while not stop.is_set():
        try:
            rv = refresh()
            if watch is None:
                stop.wait(poll_interval)
                continue
            for kind, obj in watch(rv):
                if stop.is_set():
                    return
                if kind == "ERROR":
                    break
                handle(kind, obj)
        except Exception as exc:  # the API server restarts, a watch expires: relist
            log.warning("%s: %s; relisting", what, exc)
            stop.wait(min(poll_interval, 1.0))
