"""``gpuslice agent``: the node daemon.

It owns one :class:`Ledger`, samples every grant's region each ``interval`` seconds into a
:class:`History`, reclaims stale grants, and serves two faces of one state:

* the Unix socket (``<state>/agent.sock``, mode 0666): the full JSON API of :mod:`gpuslice.local.client`.
  The kernel tells the agent who connected (``SO_PEERCRED``): a non-root caller's grants are recorded
  under its own uid and user name, its holder process must be its own, and it may change or release
  only its own grants and queue tickets;
* HTTP on ``host:port`` (localhost by default): read-only — the dashboard, ``/metrics``, status, history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import pwd
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuslice.spec.files import write_atomic
from gpuslice.spec.errors import GpusliceError
from gpuslice.host import procs
from gpuslice.host.backstop import Backstop, Policy, Tracked, default_source
from gpuslice.host.devices import snapshot_json
from gpuslice.local.admission import HighPriorityPolicy, user_name
from gpuslice.local.apibody import MAX_INT, BodyTooLarge, printable, read_json_object
from gpuslice.local.errors import AgentError, Forbidden, LedgerError, UnknownGrant
from gpuslice.host.history import History
from gpuslice.local.ledger import Ledger, queued_by, recorded_pids
from gpuslice.local.membership import attribute
from gpuslice.host.metrics import exposition
from gpuslice.host.monitor import Monitor, NodeView, with_backstop
from gpuslice.local.paths import StateDir
from gpuslice.local.records import LIVE_HOLDER, MAX_TICKS, PID_MAX, Ask, GrantRecord
from gpuslice.placement import NoFit
from gpuslice.spec import Device, Priority, Resize, SpecError, whole_number


log = logging.getLogger("gpuslice.agent")


@dataclass
class AgentConfig:
    state: StateDir
    host: str = "127.0.0.1"
    port: int = 9477
    interval: float = 1.0
    reclaim_every: float = 5.0
    history_points: int = 600
    backstop: Policy = field(default_factory=Policy)
    high_priority: HighPriorityPolicy = field(default_factory=HighPriorityPolicy)


class Agent:
    """The state behind both faces. Ledger calls run in threads, one at a time (one SQLite connection)."""

    def __init__(self, config: AgentConfig, devices: list[Device]):
        self.config = config
        self.devices = devices
        self.ledger = Ledger(config.state, devices, region_pids=recorded_pids)
        config.state.prepare_device_state(u for d in devices for u in (d.uuid, *(m.uuid for m in d.mig_instances)))
        self.reconcile_rosters()  # grants from before this agent (or before the roster existed) are listed now
        self.monitor = Monitor(devices, self.ledger.node_name, device_state_dir=config.state.device_state,
                               mps=self.ledger.mps)
        uuids = [u for d in devices for u in ((m.uuid for m in d.mig_instances) if d.mig_instances else (d.uuid,))]
        self.backstop = Backstop(default_source(uuids) if config.backstop.action != "off" else None, config.backstop)
        self.history = History(config.history_points)
        self.latest: NodeView | None = None
        self._lock = threading.Lock()

    def reconcile_rosters(self) -> None:
        """The devices' policy rosters and slice record files brought in line with the ledger; what changed is
        logged."""
        self.ledger.reconcile_rosters().log(log)
        self.ledger.reconcile_records().log(log)

    def locked(self, fn, *args, **kwargs):
        with self._lock:
            return fn(*args, **kwargs)

    async def call(self, fn, *args, **kwargs):
        return await asyncio.to_thread(self.locked, fn, *args, **kwargs)

    def sample_once(self) -> NodeView:
        with self._lock:
            grants, waiters = self.ledger.grants(), self.ledger.waiters()
            view = self.monitor.sample([g.watched() for g in grants], waiters)
            view = replace(view, errors=(*view.errors, *self.ledger.problems()))
            tracked = [Tracked(g.grant_id, s.device_uuid, s.memory_limit, g.owner) for g in grants for s in g.slices]
            view = with_backstop(view, self.backstop.check(tracked, lambda pids: attribute(grants, pids)))
            self.latest = view
            self.history.add(view)
        return view

    async def run_sampler(self) -> None:
        """Reclaim and sample forever. A pass that fails is logged and the next one runs: one exception (a
        tenant's connection flood had made /proc unreadable with EMFILE) used to end the task for good,
        leaving the agent granting with no reclaimer, monitor or backstop."""
        last_reclaim = 0.0
        while True:
            try:
                if time.monotonic() - last_reclaim >= self.config.reclaim_every:
                    await self.call(self.ledger.reclaim)
                    await self.call(self.reconcile_rosters)
                    last_reclaim = time.monotonic()
                await asyncio.to_thread(self.sample_once)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one pass
                log.warning("reclaim/sample pass failed, next in %.1f s: %s", self.config.interval, exc)
            await asyncio.sleep(self.config.interval)


# ------------------------------------------------------------------------------------------ callers
@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int

    @property
    def privileged(self) -> bool:
        return self.uid in (0, os.geteuid())

    @property
    def groups(self) -> list[int]:
        """Its primary and supplementary groups (the kernel reports the primary one)."""
        try:
            return os.getgrouplist(pwd.getpwuid(self.uid).pw_name, self.gid)
        except KeyError:
            return [self.gid]

    @property
    def user(self) -> str:
        return user_name(self.uid)


MAX_CONNECTIONS_PER_USER = 32  # open socket connections of one non-root uid; more are closed at once
HEAD_TIMEOUT = 10.0  # seconds a new connection may take to send its first request's head


class _PeerProtocol(H11Protocol):
    """uvicorn's h11 protocol that puts the socket peer's credentials into each request's scope, and bounds
    what one user's connections may hold: at most MAX_CONNECTIONS_PER_USER at a time (root is not
    counted), and a first request head within HEAD_TIMEOUT (a tenant that opened connections and sent
    partial heads had exhausted the agent's file descriptors, attacker's review of issue 15)."""

    open_by_uid: dict[int, int] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer = Peer(*struct.unpack("3i", raw))
        self._counted = peer.uid if peer is not None and peer.uid != 0 else None
        if self._counted is not None:
            held = self.open_by_uid.get(self._counted, 0)
            self.open_by_uid[self._counted] = held + 1
            if held >= MAX_CONNECTIONS_PER_USER:
                transport.close()
                return
        self._head_timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self._head_late)
        app = self.app

        async def with_peer(scope, receive, send):
            scope["gpuslice.peer"] = peer
            await app(scope, receive, send)

        self.app = with_peer

    def _head_late(self) -> None:
        if self.cycle is None:  # no request has begun on this connection
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
        uid = getattr(self, "_counted", None)
        if uid is not None:
            left = self.open_by_uid.get(uid, 1) - 1
            if left > 0:
                self.open_by_uid[uid] = left
            else:
                self.open_by_uid.pop(uid, None)
            self._counted = None
        super().connection_lost(exc)


def _peer(request: HttpRequest) -> Peer | None:
    return request.scope.get("gpuslice.peer")


def _owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


def _checked_ask(ask: Ask, peer: Peer | None) -> Ask:
    """A non-root caller asks for itself: its uid and name, a holder process it owns. Whoever asks, the holder
    is a live process with that start time (a grant held by nobody would only be reclaimed at once)."""
    mine = peer is None or peer.privileged
    if not mine and not _owned_by(ask.holder_pid, peer.uid):
        raise Forbidden(f"holder_pid {ask.holder_pid} is not a process of user {peer.user}")
    if not ask.holder_start or not procs.alive(ask.holder_pid, ask.holder_start):
        raise SpecError("holder_pid", ask.holder_pid, LIVE_HOLDER)
    return ask if mine else replace(ask, uid=peer.uid, owner=peer.user)


def _may_ask(policy: HighPriorityPolicy, peer: Peer | None, priority: Priority | None) -> None:
    """High priority slows other users' low-priority slices down: only who the agent's policy names may ask."""
    if priority is not Priority.HIGH or peer is None or peer.privileged:
        return
    if not policy.allows(peer.uid, peer.groups):
        raise Forbidden(f"priority high is not allowed for user {peer.user}: this agent allows it for "
                        f"{policy.describe()} (gpuslice agent --high-priority); ask for priority low")


def _may_change(peer: Peer | None, grant: GrantRecord) -> None:
    if peer is not None and not peer.privileged and peer.uid != grant.uid:
        raise Forbidden(f"grant {grant.grant_id} belongs to {grant.owner}, not to {peer.user}")


# ------------------------------------------------------------------------------------------ handlers
def _error(code: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": kind, "message": message, **extra}, status_code=code)


async def _body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object, bounded and checked (:mod:`gpuslice.local.apibody`)."""
    return await read_json_object(request)


def _whole(data: dict[str, Any], key: str, low: int, high: int = MAX_INT, *, default: int | None = None) -> int | None:
    """``data[key]`` as a JSON whole number from ``low`` to ``high`` (absent or null: ``default``)."""
    value = data.get(key)
    if value is None:
        return default
    return whole_number(key, value, low, high, allowed=f"a whole number from {low} to {high}"
                        + (" or null" if default is None else ""))


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(key, value, "true or false (a JSON boolean)")
    return value


def _seconds_query(request: HttpRequest, key: str) -> float:
    """A query parameter in seconds since the epoch (absent: 0)."""
    text = request.query_params.get(key, "") or "0"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise SpecError(key, text, "a time in seconds since the epoch, at least 0, like 1767000000.5")
    return value


def _guard(handler):
    async def wrapped(request: HttpRequest) -> Response:
        try:
            return await handler(request)
        except NoFit as exc:
            return _error(409, "nofit", exc.reason)
        except UnknownGrant as exc:
            return _error(404, "unknown_grant", str(exc), grant=exc.grant_id)
        except SpecError as exc:
            code = 413 if isinstance(exc, BodyTooLarge) else 400
            return _error(code, "spec", str(exc), field=exc.field, value=printable(exc.value), allowed=exc.allowed)
        except Forbidden as exc:
            return _error(403, "forbidden", str(exc))
        except LedgerError as exc:  # the ledger refuses for now (lost grants, a locked file): say why
            return _error(503, "ledger", str(exc))
        except GpusliceError as exc:
            return _error(500, "internal", str(exc))
        except Exception as exc:  # a defect: logged here, one line to the caller, the connection kept
            log.exception("agent: %s %s failed", request.method, request.url.path)
            return _error(500, "internal", f"{type(exc).__name__}: {str(exc)[:200]}")
    return wrapped


def build_apps(agent: Agent) -> tuple[Starlette, Starlette]:
    """(socket app with the full API, HTTP app read-only)."""
    read_only = _read_routes(agent)
    return Starlette(routes=read_only + _write_routes(agent)), Starlette(routes=read_only)


def _write_routes(agent: Agent) -> list[Route]:
    """The socket API's changes: callers are known by SO_PEERCRED and may change only what is theirs."""

    async def post_grant(request: HttpRequest) -> Response:
        data = await _body(request)
        ask = _checked_ask(Ask.from_json(data), _peer(request))
        _may_ask(agent.config.high_priority, _peer(request), ask.request.priority)
        wait, ticket = _flag(data, "wait"), _whole(data, "ticket", 1)
        result = await agent.call(agent.ledger.acquire, ask, wait=wait, ticket=ticket)
        if isinstance(result, GrantRecord):
            await asyncio.to_thread(agent.sample_once)
            return JSONResponse(result.to_json(), status_code=201)
        return JSONResponse(result.to_json(), status_code=202)

    async def patch_grant(request: HttpRequest) -> Response:
        data = await _body(request)
        child_pid = _whole(data, "child_pid", 1, PID_MAX)
        child_start = _whole(data, "child_start", 0, MAX_TICKS, default=0)
        if child_pid is None:
            raise SpecError("child_pid", None, f"the pid of the launched command (a whole number from 1 to {PID_MAX})")
        peer = _peer(request)
        _may_change(peer, await agent.call(agent.ledger.grant, request.path_params["grant_id"]))
        if peer is not None and not peer.privileged and not _owned_by(child_pid, peer.uid):
            # the reclaimer ends this process group when the holder dies: it must be the caller's own
            raise Forbidden(f"child_pid {child_pid} is not a process of user {peer.user}")
        record = await agent.call(agent.ledger.set_child, request.path_params["grant_id"], child_pid, child_start)
        return JSONResponse(record.to_json())

    async def resize_grant(request: HttpRequest) -> Response:
        change = Resize.from_mapping(await _body(request))
        grant_id = request.path_params["grant_id"]
        _may_change(_peer(request), await agent.call(agent.ledger.grant, grant_id))
        _may_ask(agent.config.high_priority, _peer(request), change.priority)
        done = await agent.call(agent.ledger.resize, grant_id, change)
        await asyncio.to_thread(agent.sample_once)  # ps/top/metrics/dashboard show the new limits at once
        return JSONResponse(done.to_json())

    async def delete_grant(request: HttpRequest) -> Response:
        try:
            _may_change(_peer(request), await agent.call(agent.ledger.grant, request.path_params["grant_id"]))
        except UnknownGrant:
            return JSONResponse({"released": False})
        released = await agent.call(agent.ledger.release, request.path_params["grant_id"])
        await asyncio.to_thread(agent.sample_once)
        return JSONResponse({"released": released})

    async def delete_ticket(request: HttpRequest) -> Response:
        peer = _peer(request)
        ticket = whole_number("ticket", request.path_params["ticket"], 1, MAX_INT)
        waiters = await agent.call(agent.ledger.waiters)
        mine = [w for w in waiters if w.ticket == ticket]
        if peer is not None and not peer.privileged and mine and queued_by(mine[0]) != peer.uid:
            raise Forbidden(f"queue ticket {ticket} is not a request of user {peer.user}")
        await agent.call(agent.ledger.cancel, ticket)
        return JSONResponse({"cancelled": True})

    return [
        Route("/v1/grants", _guard(post_grant), methods=["POST"]),
        Route("/v1/grants/{grant_id}", _guard(patch_grant), methods=["PATCH"]),
        Route("/v1/grants/{grant_id}/resize", _guard(resize_grant), methods=["POST"]),
        Route("/v1/grants/{grant_id}", _guard(delete_grant), methods=["DELETE"]),
        Route("/v1/queue/{ticket:int}", _guard(delete_ticket), methods=["DELETE"]),
    ]


def _read_routes(agent: Agent) -> list[Route]:
    """What the socket and the HTTP port both serve: the dashboard, metrics, status, devices, grants."""

    async def ping(request: HttpRequest) -> Response:
        return JSONResponse({"ok": True, "pid": os.getpid()})

    async def devices(request: HttpRequest) -> Response:
        return JSONResponse(snapshot_json(agent.devices, f"gpuslice agent on {agent.ledger.node_name}"))

    async def grants(request: HttpRequest) -> Response:
        records = await agent.call(agent.ledger.grants)
        waiters = await agent.call(agent.ledger.waiters)
        return JSONResponse({"grants": [g.to_json() for g in records], "waiters": [w.to_json() for w in waiters]})

    async def status(request: HttpRequest) -> Response:
        view = agent.latest or await asyncio.to_thread(agent.sample_once)
        return JSONResponse(view.to_json())

    async def history(request: HttpRequest) -> Response:
        since = _seconds_query(request, "since")
        with agent._lock:
            data = agent.history.to_json(since)
        return JSONResponse(data)

    async def metrics(request: HttpRequest) -> Response:
        body = exposition(lambda: agent.latest)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(request: HttpRequest) -> Response:
        return Response(_asset("dashboard.html"), media_type="text/html; charset=utf-8")

    async def script(request: HttpRequest) -> Response:
        return Response(_asset("dashboard.js"), media_type="application/javascript")

    return [
        Route("/", _guard(page)), Route("/dashboard.js", _guard(script)), Route("/metrics", _guard(metrics)),
        Route("/v1/ping", _guard(ping)), Route("/v1/devices", _guard(devices)), Route("/v1/status", _guard(status)),
        Route("/v1/history", _guard(history)), Route("/v1/grants", _guard(grants), methods=["GET"]),
    ]


def _asset(name: str) -> bytes:
    return (resources.files("gpuslice.local") / "dashboard" / name).read_bytes()


# ------------------------------------------------------------------------------------------ serving
def _raise_fd_limit() -> None:
    """Open files up to the hard limit: the agent holds a socket per client and reads /proc for each sample."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: the agent stops both servers together."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve(config: AgentConfig, devices: list[Device], ready: threading.Event | None = None) -> None:
    """Run the agent until SIGINT/SIGTERM."""
    sock = config.state.socket
    _refuse_second_agent(sock)
    agent = Agent(config, devices)
    socket_app, http_app = build_apps(agent)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()  # a stale socket of an agent that died
    tcp = _bind_tcp(config.host, config.port) if config.port >= 0 else None
    _raise_fd_limit()
    servers = [_Server(uvicorn.Config(socket_app, uds=str(sock), log_level="warning", lifespan="off",
                                      http=_PeerProtocol, limit_concurrency=1024))]
    if tcp is not None:
        config.port = tcp.getsockname()[1]
        servers.append(_Server(uvicorn.Config(http_app, log_level="warning", lifespan="off")))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: [setattr(s, "should_exit", True) for s in servers])
    sampler = asyncio.create_task(agent.run_sampler())
    tasks = [asyncio.create_task(servers[0].serve())]
    if tcp is not None:
        tasks.append(asyncio.create_task(servers[1].serve(sockets=[tcp])))
    try:
        await _announce(servers, tasks, config, sock, ready)
        await asyncio.gather(*tasks)
    finally:
        sampler.cancel()
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        with contextlib.suppress(FileNotFoundError):
            config.state.agent_info.unlink()


def _bind_tcp(host: str, port: int) -> socket.socket:
    """The dashboard's listening socket, bound here so a busy port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tcp = socket.socket(family, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        tcp.bind((host, port))
    except OSError as exc:
        tcp.close()
        raise AgentError(f"cannot listen on http://{host}:{port}/ ({exc.strerror}); choose another port with "
                         "--port, 0 for any free one, or -1 for no HTTP") from None
    return tcp


def _refuse_second_agent(sock: Path) -> None:
    from gpuslice.local.client import _answers

    if sock.exists() and _answers(sock):
        raise AgentError(f"an agent already serves {sock}; stop it first (its pid is in {sock.parent / 'agent.json'})")


async def _announce(servers: list[_Server], tasks: list[asyncio.Task], config: AgentConfig, sock: Path,
                    ready: threading.Event | None) -> None:
    while not all(s.started for s in servers):
        if any(t.done() for t in tasks) or any(s.should_exit for s in servers):
            return  # a server failed to start (gather re-raises its error) or we are stopping
        await asyncio.sleep(0.02)
    os.chmod(sock, 0o666)
    port = config.port
    info = {"pid": os.getpid(), "socket": str(sock), "dashboard": f"http://{config.host}:{port}/" if port >= 0 else ""}
    write_atomic(config.state.agent_info, json.dumps(info))  # clients poll for it: never half a file
    print(f"gpuslice agent: socket {sock}; dashboard and /metrics on {info['dashboard'] or '(off)'}", flush=True)
    if ready is not None:
        ready.set()
