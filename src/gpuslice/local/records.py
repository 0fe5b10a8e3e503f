"""Plain records of local mode: what a caller asks the ledger for, a recorded grant, a queue ticket.

They travel as JSON over the agent's socket and sit in the ledger; ``to_json``/``from_json`` are exact
inverses, and the request, slices and grant inside are spelled by :mod:`gpuslice.spec.codec` as on every
other wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from gpuslice.host.usage import Watched
from gpuslice.spec import (
    Colocation, Engine, Grant, HoldsGrant, Priority, Request, SpecError, grant_from_json, grant_to_json,
    request_from_json, request_to_json, whole_number,
)


# The socket API's bounds (documented in gpuslice.local.client): what one grant request may carry.
PID_MAX = 1 << 22  # Linux's largest pid_max (PID_MAX_LIMIT on 64-bit)
MAX_TICKS = 2**63 - 1  # a start time in clock ticks since boot (SQLite's INTEGER)
MAX_UID = 2**32 - 2  # uid_t; -1 = unknown
MAX_OWNER = 64
MAX_COMMAND = 1024  # `gpuslice run` sends at most 500 characters of the command line
MAX_POLICY = 64
MAX_DEVICE_LIST = 64
MAX_UUID = 96
# what a holder must be (the agent checks it before the ledger, the ledger again for a root caller's ask without uid)
LIVE_HOLDER = "the pid of a live process, with its start time in holder_start (field 22 of /proc/<pid>/stat)"
LIMITS = {"holder_pid": f"1..{PID_MAX}", "holder_start": f"0..{MAX_TICKS}", "uid": f"-1..{MAX_UID}",
          "owner": f"{MAX_OWNER} characters", "command": f"{MAX_COMMAND} characters",
          "policy": f"{MAX_POLICY} characters", "devices": f"{MAX_DEVICE_LIST} UUIDs of {MAX_UUID} characters"}


@dataclass(frozen=True)
class OomPolicy:
    """What the slice's enforcer does when memory runs out (the slice file's ``oom_policy``): ``return`` the
    error, ``kill`` the process (at the limit), or ``wait`` up to ``wait_ms`` for the *device* to have room
    when the slice has room but the card is full (None: the enforcer's 30 s)."""

    policy: str = "return"
    wait_ms: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in ("return", "kill", "wait"):
            raise SpecError("oom_policy", self.policy, "return, kill or wait")
        if self.wait_ms is not None:
            whole_number("oom_wait_ms", self.wait_ms, 0, 86_400_000)
            if self.policy != "wait":
                raise SpecError("oom_wait_ms", self.wait_ms, "none unless oom_policy is wait")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"oom_policy": self.policy} if self.policy != "return" else {}
        return {**out, "oom_wait_ms": self.wait_ms} if self.wait_ms is not None else out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OomPolicy":
        policy = data.get("oom_policy", "return")
        if not isinstance(policy, str):
            raise SpecError("oom_policy", policy, "return, kill or wait")
        wait = data.get("oom_wait_ms")
        return cls(policy, None if wait is None else whole_number("oom_wait_ms", wait, 0, 86_400_000))


@dataclass(frozen=True)
class Ask:
    """A request plus who asks: the holder process (pid + start time) keeps the grant alive.

    ``engine_auto``: the engine was left to gpuslice (``gpuslice run`` without ``--engine``, ``"engine": "auto"``
    in a socket API request): ``request.engine`` is the one :func:`auto_request` prefers, and the ledger takes the
    other where only that one fits (the device runs it) and timeslice on a node without MPS. On the wire the
    request says ``"engine": "auto"`` (:func:`auto_json`): an agent that predates it refuses it, naming the field."""

    request: Request
    owner: str
    holder_pid: int
    holder_start: int
    uid: int = -1
    devices: tuple[str, ...] = ()  # restrict placement to these device UUIDs (empty: any)
    command: str = ""
    policy: str = "binpack"
    oom: OomPolicy = field(default_factory=lambda: OomPolicy())
    engine_auto: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"request": request_to_json(self.request), "owner": self.owner, "holder_pid": self.holder_pid,
                "holder_start": self.holder_start, "uid": self.uid, "devices": list(self.devices),
                "command": self.command, "policy": self.policy, **self.oom.to_json()} | \
            ({"request": auto_json(self.request)} if self.engine_auto else {})

    @classmethod
    def from_json(cls, data: Any) -> "Ask":
        """An Ask from the socket API, every field typed and bounded (the limits are in :data:`LIMITS`)."""
        if not isinstance(data, dict):
            raise SpecError("ask", data, "an object with request, owner, holder_pid, holder_start")
        for key in ("owner", "holder_pid", "holder_start"):
            if key not in data:
                raise SpecError(key, None, f"field {key} in the grant request")
        devices = data.get("devices") or []
        if not isinstance(devices, list) or len(devices) > MAX_DEVICE_LIST \
                or not all(isinstance(d, str) and 0 < len(d) <= MAX_UUID and d.isascii() for d in devices):
            raise SpecError("devices", devices, f"a list of at most {MAX_DEVICE_LIST} device UUIDs "
                                                f"(each at most {MAX_UUID} characters)")
        request, auto = _request_and_auto(data)
        return cls(request=request, engine_auto=auto,
                   owner=bounded_text("owner", data["owner"], MAX_OWNER),
                   holder_pid=whole_number("holder_pid", data["holder_pid"], 1, PID_MAX),
                   holder_start=whole_number("holder_start", data["holder_start"], 0, MAX_TICKS),
                   uid=whole_number("uid", data.get("uid", -1), -1, MAX_UID),
                   devices=tuple(devices), command=bounded_text("command", data.get("command", ""), MAX_COMMAND),
                   policy=bounded_text("policy", data.get("policy", "binpack"), MAX_POLICY), oom=OomPolicy.from_json(data))


ENGINE_AUTO = "auto"  # the engine left to gpuslice: a front end's word (CLI, socket API), never on a slice's wire


def auto_request(fields: Mapping[str, Any]) -> Request:
    """The request an engine left to gpuslice means, from its fields as given (the CLI's options, a socket API
    request; any "engine" among them is ignored). ``spatial`` when it names a priority (high or low) and takes
    one device with no compute share of its own and no exclusivity, co-locating ``preemptive`` (the default):
    issue 13's pair, a server and a trainer given only priorities, whose time-sliced form costs the server a
    context switch per gap and the trainer most of its time (README Limits; H100 2026-12-06: the trainer at 0.32
    of its idle bound beside a decoder) where MPS runs both at once, the low one a below-normal client on 60 %
    of the SMs. ``timeslice`` for anything else: a slice that names no priority keeps exact, paced shares. Where a
    spatial one may go (not beside another user's daemon; at low priority only beside its own server) is the
    ledger's to say, at placement (``ledger.SpatialRoom``)."""
    request = Request.from_mapping({k: v for k, v in fields.items() if k != "engine"})
    named = fields.get("priority") is not None
    if named and request.count == 1 and request.compute == 0 and not request.exclusive \
            and request.colocation is Colocation.PREEMPTIVE:
        return replace(request, engine=Engine.SPATIAL)
    return request


def auto_json(request: Request) -> dict[str, Any]:
    """The wire form of a request whose engine is left to gpuslice (``request.engine``: the one
    :func:`auto_request` preferred): ``"engine": "auto"``, and the priority only where the choice took it as
    named (:func:`auto_request` of this gives ``request`` back: a low priority the choice did not count as named
    is the default anyway)."""
    data = {**request_to_json(request), "engine": ENGINE_AUTO}
    if request.engine is Engine.TIMESLICE and request.priority is Priority.LOW:
        del data["priority"]
    return data


def _request_and_auto(data: dict) -> tuple[Request, bool]:
    """An Ask's request, and whether its engine is left to gpuslice (``"engine": "auto"``)."""
    raw = data.get("request", {})
    if isinstance(raw, dict) and isinstance(raw.get("engine"), str) and raw["engine"].strip().lower() == ENGINE_AUTO:
        return auto_request({k: v for k, v in raw.items() if v is not None}), True
    return request_from_json(raw), False


def bounded_text(field_name: str, value: Any, limit: int) -> str:
    """``value`` if it is a string of at most ``limit`` characters without NUL that UTF-8 can carry (a lone
    surrogate from JSON's ``\\udcff`` cannot: stored, it made every answer that held it fail, ``ps`` and the
    dashboard for every user: helper 42); SpecError naming the field."""
    if not isinstance(value, str) or len(value) > limit or "\0" in value or not _utf8(value):
        raise SpecError(field_name, ascii(value) if isinstance(value, str) else value,
                        f"a string of at most {limit} characters, valid Unicode, no NUL")
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class GrantRecord(HoldsGrant):
    """One grant as the ledger holds it: the :class:`Grant` and who holds it, how, where its files are."""

    grant: Grant
    owner: str
    request: Request
    created: float
    holder_pid: int
    holder_start: int
    child_pid: int = 0
    child_start: int = 0
    uid: int = -1
    command: str = ""
    slice_file: str = ""
    region_file: str = ""
    # When the reclaimer found the holder gone and sent SIGTERM to the slice's processes (0: not yet);
    # SIGKILL follows once $GPUSLICE_KILL_GRACE has passed since then.
    ending_since: float = 0.0
    mps_pipe_dir: str = ""  # a spatial grant: its device's MPS daemon (CUDA_MPS_PIPE_DIRECTORY)
    generation: int = 0  # live resizes so far: the slice file's generation= (0: never resized)
    oom: OomPolicy = field(default_factory=lambda: OomPolicy())

    @property
    def marker(self) -> str:
        """The environment entry every process of the launched command carries (``GPUSLICE_SLICE=<path>``):
        the slice file's path names the state dir and the grant, so it belongs to this grant alone."""
        return f"GPUSLICE_SLICE={self.slice_file}" if self.slice_file else ""

    def watched(self) -> Watched:
        """The grant as the node monitor watches it."""
        return Watched(grant=self.grant, owner=self.owner, region_file=self.region_file, created=self.created,
                       command=self.command, group=(self.child_pid, self.child_start))

    def to_json(self) -> dict[str, Any]:
        return {**grant_to_json(self.grant), "owner": self.owner, "request": request_to_json(self.request),
                "created": self.created, "holder_pid": self.holder_pid, "holder_start": self.holder_start,
                "child_pid": self.child_pid, "child_start": self.child_start, "uid": self.uid,
                "command": self.command, "slice_file": self.slice_file, "region_file": self.region_file,
                "ending_since": self.ending_since, **({"mps_pipe_dir": self.mps_pipe_dir} if self.mps_pipe_dir else {}),
                **({"generation": self.generation} if self.generation else {}), **self.oom.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> "GrantRecord":
        if not isinstance(data, dict):
            raise SpecError("grant record", data, "an object")
        return cls(grant=grant_from_json(data), owner=str(data["owner"]), request=request_from_json(data["request"]),
                   created=float(data["created"]), holder_pid=int(data["holder_pid"]),
                   holder_start=int(data["holder_start"]), child_pid=int(data.get("child_pid", 0)),
                   child_start=int(data.get("child_start", 0)), uid=int(data.get("uid", -1)),
                   command=data.get("command", ""), slice_file=data.get("slice_file", ""),
                   region_file=data.get("region_file", ""), ending_since=float(data.get("ending_since", 0.0)),
                   mps_pipe_dir=str(data.get("mps_pipe_dir", "")), generation=int(data.get("generation", 0)),
                   oom=OomPolicy.from_json(data))


@dataclass(frozen=True)
class Queued:
    """A waiting request: its ticket, its place in the queue (1 = next) and why it does not fit now."""

    ticket: int
    position: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"ticket": self.ticket, "position": self.position, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Queued":
        return cls(ticket=int(data["ticket"]), position=int(data["position"]), reason=str(data["reason"]))


@dataclass(frozen=True)
class Waiter:
    ticket: int
    priority: int
    enqueued: float
    pid: int
    pid_start: int
    owner: str
    request: Request = field(compare=False)
    devices: tuple[str, ...] = ()  # its --device restriction (empty: any)
    # the user who queued it (the caller the agent identified, as a grant's ``uid``); -1 in rows of ledgers
    # before schema 3. Never read again from the holder process: a holder that execs a setuid program shows
    # another effective uid, and its ticket passed for root's (issue 15)
    uid: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"ticket": self.ticket, "priority": self.priority, "enqueued": self.enqueued, "pid": self.pid,
                "owner": self.owner, "uid": self.uid, "request": request_to_json(self.request),
                "devices": list(self.devices)}
