"""Talking to the agent over its Unix socket (JSON over HTTP), and choosing agent or ledger.

Socket API (all JSON; errors are ``{"error": kind, "message": text}`` with 4xx/5xx: 400 ``spec`` (with
``field``/``value``/``allowed``: a body that is not a JSON object names ``body``, a field of the wrong type,
range or size names that field), 403 ``forbidden`` (another user's grant, process or queue ticket; high priority the agent's ``--high-priority`` does not grant the caller), 404
``unknown_grant`` (with ``grant``), 409 ``nofit``, 413 ``spec`` (a body above 64 KiB, field ``body``), 503
``ledger`` (the ledger refuses for now: grants it lost still run), 500 ``internal`` (a defect, one line)).
Bounds (:mod:`gpuslice.local.apibody`, :data:`gpuslice.local.records.LIMITS`): bodies ≤ 64 KiB, nesting ≤ 8, no
``NaN``/``Infinity``, integers within 64 bits; ``owner`` ≤ 64, ``command`` ≤ 1024, ``policy`` ≤ 64 characters,
``devices`` ≤ 64 UUIDs of ≤ 96 characters; ``holder_pid`` and ``child_pid`` 1..4194304, ``holder_start`` and
``child_start`` 0..2^63-1, the holder a live process with that start time; ``uid`` -1..2^32-2; ``ticket`` 1..2^63-1
and the caller's own (the waiter's holder process). A bare number of ``request.memory`` is MiB. A GrantRecord is the grant in the one spelling of :mod:`gpuslice.spec.codec` (``grant``,
``exclusive``, ``slices`` of ``uuid``/``memory``/…) beside the record's own keys (``owner``, ``request``,
``created``, ``holder_pid``, ``holder_start``, ``child_pid``, ``child_start``, ``uid``, ``command``,
``slice_file``, ``region_file``, ``ending_since``, and ``mps_pipe_dir`` for a spatial grant, ``generation``
once resized, ``oom_policy``/``oom_wait_ms`` when not the default). An Ask's ``request`` may say
``"engine": "spatial"`` (MPS-backed; one device) or ``"engine": "auto"`` (gpuslice chooses as ``gpuslice run``
without ``--engine`` does: records.auto_request; a request with no "engine" is time-sliced, as before),
``"colocation": "preemptive"|"shared"|"tidal"``
and ``"tidal_schedule": "8-20:30,20-8:100"`` (issue 13; refusals name the field and what is allowed); an Ask may
carry ``"oom_policy": "return"|"kill"|"wait"`` and, with wait, ``"oom_wait_ms"`` (0..86400000).
The agent knows the caller from the kernel (``SO_PEERCRED``): a non-root caller's ``owner``/``uid`` are its
own whatever the body says, and ``holder_pid`` and ``child_pid`` must be its own processes (the reclaimer
ends the ``child_pid`` group once the holder is gone); a root caller's ``uid`` -1 (none given) records the holder
process's real uid as the grant's owner. The queue (``"wait": true``): a user orders their own
waiting requests (priority, then arrival); root's waiting requests hold back everyone's later or lower-priority
ones; a user's waiting request holds back no other user's; a user may have at most 16 requests waiting (the
17th is a 400 ``spec`` naming ``wait``; root is not limited) — :mod:`gpuslice.local.admission`.

=======  ========================  ==========================================================
POST     /v1/grants                body: Ask (+ ``"wait": bool, "ticket": int >= 1|null``) →
                                   201 GrantRecord, 202 Queued, 409 ``{"error": "nofit"}``
PATCH    /v1/grants/{id}           body ``{"child_pid": int >= 1, "child_start": int >= 0}`` → 200 GrantRecord
POST     /v1/grants/{id}/resize    body ``{"memory": "8GiB"|"50%", "compute": 0..100, "priority": "high"|"low",
                                   "mode": "hard"|"soft"|"off", "evict": bool}`` (at least one size) → 200
                                   GrantRecord + ``"evicted": [pid]``; 409 ``nofit`` (does not fit beside the
                                   other slices, or below what the slice holds now without ``evict``)
DELETE   /v1/grants/{id}           → 200 ``{"released": bool}``
DELETE   /v1/queue/{ticket}        → 200 ``{"cancelled": true}``
GET      /v1/devices               → the node's devices (a devices snapshot document)
GET      /v1/ping                  → ``{"ok": true}``
GET      /v1/grants                → ``{"grants": [GrantRecord], "waiters": [...]}``
GET      /v1/status                → the node view (devices, slices, usage) as ``gpuslice ps --json``
GET      /v1/history?since=<s>     → ``{"t": [...], "slices": {...}, "devices": {...}}`` samples after ``since``
                                   (seconds since the epoch, default 0)
GET      /metrics                  → Prometheus text exposition
GET      /                         → the dashboard page
=======  ========================  ==========================================================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import httpx

from gpuslice.local.errors import AgentError, UnknownGrant
from gpuslice.local.paths import SYSTEM_STATE_DIR, StateDir
from gpuslice.local.records import Ask, GrantRecord, Queued
from gpuslice.local.resize import Resized
from gpuslice.placement import NoFit
from gpuslice.spec import Device, Resize

TIMEOUT_S = 30.0


class GrantService(Protocol):
    """What ``gpuslice run`` needs: the agent client and the local ledger both provide it."""

    def acquire(self, ask: Ask, *, wait: bool = False, ticket: int | None = None) -> GrantRecord | Queued: ...
    def set_child(self, grant_id: str, child_pid: int, child_start: int) -> GrantRecord: ...
    def release(self, grant_id: str) -> bool: ...
    def resize(self, grant_id: str, change: Resize) -> Resized: ...
    def cancel(self, ticket: int) -> None: ...


def find_agent_socket(state: StateDir) -> Path | None:
    """The socket of a running agent: this state dir's, else the system one (agent running as root)."""
    candidates = [state.socket]
    if not os.environ.get("GPUSLICE_STATE_DIR"):
        candidates.append(StateDir(SYSTEM_STATE_DIR).socket)
    for path in candidates:
        if path.exists() and _answers(path):
            return path
    return None


def _answers(path: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=2.0) as http:
            return http.get("http://agent/v1/ping").status_code == 200
    except httpx.HTTPError:
        return False


class AgentClient:
    """The socket API as Python calls; raises the same errors as the ledger."""

    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)),
                                  base_url="http://agent", timeout=TIMEOUT_S)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        try:
            reply = self._http.request(method, url, json=body)
        except httpx.HTTPError as exc:
            raise AgentError(f"agent at {self.socket_path} did not answer {method} {url}: {exc}") from None
        try:
            data = reply.json()
        except ValueError:
            raise AgentError(f"agent answered {method} {url} with {reply.status_code}: {reply.text[:200]}") from None
        if reply.status_code >= 400:
            _raise(reply.status_code, data, f"{method} {url}")
        return reply.status_code, data

    def acquire(self, ask: Ask, *, wait: bool = False, ticket: int | None = None) -> GrantRecord | Queued:
        code, data = self._call("POST", "/v1/grants", {**ask.to_json(), "wait": wait, "ticket": ticket})
        return Queued.from_json(data) if code == 202 else GrantRecord.from_json(data)

    def set_child(self, grant_id: str, child_pid: int, child_start: int) -> GrantRecord:
        _, data = self._call("PATCH", f"/v1/grants/{grant_id}", {"child_pid": child_pid, "child_start": child_start})
        return GrantRecord.from_json(data)

    def resize(self, grant_id: str, change: Resize) -> Resized:
        _, data = self._call("POST", f"/v1/grants/{grant_id}/resize", change.to_json())
        return Resized(GrantRecord.from_json(data), tuple(int(p) for p in data.get("evicted", ())))

    def release(self, grant_id: str) -> bool:
        _, data = self._call("DELETE", f"/v1/grants/{grant_id}")
        return bool(data.get("released"))

    def cancel(self, ticket: int) -> None:
        self._call("DELETE", f"/v1/queue/{ticket}")

    def devices(self) -> list[Device]:
        from gpuslice.host.devices import parse_snapshot

        return parse_snapshot(self._call("GET", "/v1/devices")[1], "agent /v1/devices")

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")[1]

    def grants(self) -> dict[str, Any]:
        return self._call("GET", "/v1/grants")[1]


def _raise(code: int, data: Any, what: str) -> None:
    kind = data.get("error") if isinstance(data, dict) else None
    message = data.get("message", str(data)) if isinstance(data, dict) else str(data)
    if kind == "nofit":
        raise NoFit(message)
    if kind == "unknown_grant":
        raise UnknownGrant(data.get("grant", "?"))
    if kind == "spec":
        from gpuslice.spec import SpecError

        raise SpecError(data.get("field", "request"), data.get("value"), data.get("allowed", message))
    raise AgentError(f"agent refused {what} ({code}): {message}")
