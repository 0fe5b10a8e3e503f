"""The node view: devices, grants and live usage joined into one plain structure, sampled over time.

``Monitor.sample()`` reads the ledger's grants, every grant's region (memory) and the compute state each slice's
pacers keep in its record file, ``<state>/devices/<stem>.slices/<grant>`` (:mod:`gpuslice.enforcer.devstate`; a
file its tenant spoiled is named among the view's errors and skipped). Compute
*achieved* is the pacer's own measurement over its last 1-s window when it has one; otherwise the
slice's busy time over wall time across the samples of the last ``RATE_WINDOW_S`` seconds (at least
two samples; none on a slice's first sample) — a window, not the last interval, so that fast sampling
(the dashboard's 0.2 s) does not turn the step-wise busy counters into a jumpy line. ``ps``, ``top``,
the metrics and the dashboard all render a :class:`NodeView`.

A spatial slice (MPS) is not paced, so the pacer measures nothing for it: its compute achieved is
``None`` (shown as ``-``), its ``engine`` says ``spatial`` and ``mps`` the state of its device's daemon
(``running``, ``fault``, ``down``); the node view lists the daemons (``mps``) and puts a line in ``errors``
for each one that is not running.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from gpuslice.enforcer import devstate as compute_state
from gpuslice.enforcer.region import wait_budget
from gpuslice.host import procs
from gpuslice.host.mpsfleet import DaemonStatus, MpsDaemons
from gpuslice.host.usage import GrantUsage, Watched, read_grant_usage
from gpuslice.spec import Device, Engine, Priority

if TYPE_CHECKING:
    from gpuslice.host.backstop import BackstopReport

UsageReader = Callable[[Watched], GrantUsage]
RATE_WINDOW_S = 2.0  # busy-time rates average over about this long
REGION_WAIT_S = 0.05  # what one sample waits, all regions together, for seqlocks held odd (one region's timeout)


class Waiting(Protocol):
    """A queued request as the monitor shows it (local mode's waiters)."""

    enqueued: float
    devices: tuple[str, ...]

    def to_json(self) -> dict[str, Any]: ...


RECENT_FAULT_S = 600.0  # how long a fault the node side acted on stays among the view's errors

@dataclass(frozen=True)
class SliceView:
    grant_id: str
    owner: str
    device_uuid: str
    device_index: int
    memory_limit: int
    memory_used: int
    memory_peak: int
    compute_set: int
    compute_achieved: float | None
    throttled_seconds: float
    oom_refusals: int
    priority: str
    mode: str
    pids: tuple[int, ...]
    age_seconds: float
    command: str
    exclusive: bool = False
    memory_seen: int | None = None  # the slice's processes' device memory as NVML counts it (the backstop)
    engine: str = "timeslice"
    mps: str = ""  # spatial: the state of the device's MPS daemon (running | fault | down | none)
    oom_waiting: int = 0  # oom_policy=wait: allocations waiting now for the device to have room
    oom_waits: int = 0
    oom_wait_timeouts: int = 0
    colocation: str = "preemptive"  # preemptive | shared | tidal (issue 13)


@dataclass(frozen=True)
class DeviceView:
    uuid: str
    index: int
    name: str
    memory_total: int
    memory_granted: int
    memory_used: int
    compute_granted: int
    compute_achieved: float | None
    slices: int
    held_whole: bool = False  # given whole to one grant: all of its memory and compute are held


@dataclass(frozen=True)
class NodeView:
    time: float
    node: str
    devices: tuple[DeviceView, ...]
    slices: tuple[SliceView, ...]
    waiters: tuple[dict[str, Any], ...] = ()
    errors: tuple[str, ...] = field(default=())
    # The backstop's last check (gpuslice.host.backstop.BackstopReport.to_json): policy, slices over their
    # limit in NVML's count and what was done, GPU processes of no slice. Empty: no backstop runs here.
    backstop: dict[str, Any] = field(default_factory=dict)
    mps: tuple[dict[str, Any], ...] = ()  # the node's MPS daemons (DaemonStatus.to_json)
    mps_faults: int = 0  # daemon faults the node side acted on since its state dir was made

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def with_backstop(view: NodeView, report: "BackstopReport") -> NodeView:
    """``view`` with the backstop's findings: each slice's NVML-counted memory, the overruns, the strangers."""
    slices = tuple(replace(s, memory_seen=report.seen.get((s.grant_id, s.device_uuid), 0 if not report.error else None))
                   for s in view.slices) if report.policy in ("kill", "report") else view.slices
    errors = view.errors + ((f"backstop: {report.error}",) if report.error else ())
    return replace(view, slices=slices, errors=errors, backstop=report.to_json())


class Monitor:
    """Turns (devices, grants, regions) into NodeViews; keeps the last busy counters for rates."""

    def __init__(self, devices: Sequence[Device], node: str, read_usage: UsageReader = read_grant_usage,
                 device_state_dir: Path | None = None, mps: MpsDaemons | None = None):
        self.devices = list(devices)
        self.node = node
        self.read_usage = read_usage
        self.device_state_dir = device_state_dir
        self.mps = mps
        # device (or MIG instance) UUID -> the card's index
        self._index = {u: d.index for d in self.devices for u in (d.uuid, *(m.uuid for m in d.mig_instances))}
        self._last: dict[tuple[str, str], deque[tuple[float, int]]] = {}  # (grant, device) -> [(t, busy_ns)]

    def sample(self, grants: Sequence[Watched], waiters: Sequence[Waiting] = (),
               now: float | None = None) -> NodeView:
        now = time.time() if now is None else now
        slices: list[SliceView] = []
        errors: list[str] = []
        seen: set[tuple[str, str]] = set()
        paced = self._compute(errors)
        daemons, mps_faults = self._daemons(errors, now)
        stats = procs.all_stats() if grants else []
        with wait_budget(REGION_WAIT_S):  # one budget for every region of the sample (region.wait_budget)
            for watched in grants:
                slices += self._slices(watched, paced, stats, now, errors, seen)
        slices = [_with_daemon(s, daemons) for s in slices]
        self._last = {k: v for k, v in self._last.items() if k in seen}
        return NodeView(time=now, node=self.node, devices=tuple(self._devices(slices)), slices=tuple(slices),
                        waiters=tuple(self._waiters(waiters, now)), errors=tuple(errors),
                        mps=tuple(d.to_json() for d in daemons), mps_faults=mps_faults)

    def _daemons(self, errors: list[str], now: float) -> tuple[list[DaemonStatus], int]:
        """The MPS daemons of spatial slices and how many faults were acted on; a line in ``errors`` for each
        daemon that is not running and for each fault acted on in the last RECENT_FAULT_S seconds (a faulted
        daemon's clients fail within seconds and it is restarted or retired with them: its state alone
        would rarely show it)."""
        if self.mps is None:
            return [], 0
        daemons = self.mps.status()
        for d in daemons:
            if d.state != "running":
                why = f": {d.faults[-1]}" if d.faults else ""
                errors.append(f"MPS daemon of {d.device}{_uid(d.uid)}: {d.state}{why}")
        total, events = self.mps.fault_history()
        done = {"fault": "restarted", "died": "found dead and started again", "retired": "stopped with its slices"}
        for e in events:
            if 0 <= now - e.at <= RECENT_FAULT_S:
                errors.append(f"MPS daemon of {e.device}{_uid(e.uid)}: {done.get(e.reason, e.reason)} after a fault "
                              f"{now - e.at:.0f} s ago: {e.faults[-1] if e.faults else '-'}")
        return daemons, total

    def _slices(self, watched: Watched, paced: dict[tuple[str, str], compute_state.SliceCompute],
                stats: list[procs.ProcStat], now: float, errors: list[str],
                seen: set[tuple[str, str]]) -> list[SliceView]:
        """The views of one watched grant's slices (one per device)."""
        grant, usage = watched.grant, self.read_usage(watched)
        # GPU processes from the region, plus the launched process group (processes not on the GPU yet)
        pids = tuple(sorted(set(usage.pids) | set(procs.group_members(*watched.group, stats))))
        if usage.error:
            errors.append(f"{grant.grant_id}: {usage.error}")
        out = []
        for s in grant.slices:
            u = usage.slices.get(s.device_uuid)
            key = (grant.grant_id, s.device_uuid)
            seen.add(key)
            pc = paced.get(key)
            busy = max(u.busy_ns if u else 0, int(pc.busy_total_s * 1e9) if pc else 0)
            rate = self._rate(key, now, busy) if usage.readable or pc else None
            achieved = pc.achieved_share if pc and pc.achieved_share is not None else rate
            if s.engine is Engine.SPATIAL:
                achieved = None  # not paced: the pacer measures nothing, and MPS shares SMs, not time
            throttled = max((u.throttled_ns if u else 0) / 1e9, pc.throttled_total_s if pc else 0.0)
            out.append(SliceView(
                grant_id=grant.grant_id, owner=watched.owner, device_uuid=s.device_uuid,
                device_index=self._index.get(s.device_uuid, -1), memory_limit=s.memory_limit,
                memory_used=u.used if u else 0, memory_peak=u.peak if u else 0, compute_set=s.compute,
                compute_achieved=achieved, throttled_seconds=throttled,
                oom_refusals=u.oom_refusals if u else 0, priority=Priority(s.priority).name.lower(),
                mode=s.mode.value, pids=pids, age_seconds=max(0.0, now - watched.created),
                command=watched.command, exclusive=grant.exclusive, engine=s.engine.value,
                oom_waiting=u.oom_waiting if u else 0, oom_waits=u.oom_waits if u else 0,
                oom_wait_timeouts=u.oom_wait_timeouts if u else 0,
                colocation=s.colocation.value))
        return out

    def _waiters(self, waiters: Sequence[Waiting], now: float) -> list[dict[str, Any]]:
        """The queue in order (priority, then arrival) with each request's place and age."""
        return [{**w.to_json(), "position": i, "age_seconds": max(0.0, now - w.enqueued),
                 "device_indexes": [self._index.get(u, -1) for u in w.devices]}
                for i, w in enumerate(waiters, 1)]

    def _compute(self, errors: list[str]) -> dict[tuple[str, str], compute_state.SliceCompute]:
        """The pacer's per-slice compute state, keyed (grant, device or MIG instance UUID); empty without record
        folders. A file that cannot be read (each slice's tenant writes its own) is named in ``errors``."""
        if self.device_state_dir is None:
            return {}
        found = {}
        for uuid in self._index:
            folder = self.device_state_dir / compute_state.records_folder_name(uuid)
            if not folder.is_dir():  # none yet (or not a folder: the reader would refuse it)
                continue
            try:
                state = compute_state.read_device_state(folder)
            except compute_state.DeviceStateError as exc:
                errors.append(str(exc))
                continue
            errors.extend(state.problems)
            found.update({(s.grant, uuid): s for s in state.slices})
        return found

    def _rate(self, key: tuple[str, str], now: float, busy_ns: int) -> float | None:
        """Busy time over wall time since the newest sample at least RATE_WINDOW_S old (or the oldest)."""
        ring = self._last.setdefault(key, deque())
        if ring and now <= ring[-1][0]:
            return None
        if ring and busy_ns < ring[-1][1]:  # the counter went back (a new region): start again
            ring.clear()
        ring.append((now, busy_ns))
        while len(ring) > 2 and now - ring[1][0] >= RATE_WINDOW_S:
            ring.popleft()
        if len(ring) < 2:
            return None
        t0, busy0 = ring[0]
        return min(100.0, (busy_ns - busy0) / ((now - t0) * 1e9) * 100.0)

    def _devices(self, slices: list[SliceView]) -> list[DeviceView]:
        out = []
        for d in self.devices:
            mine = [s for s in slices if s.device_index == d.index]
            rates = [s.compute_achieved for s in mine if s.compute_achieved is not None]
            whole = any(s.exclusive for s in mine)
            out.append(DeviceView(
                uuid=d.uuid, index=d.index, name=d.name, memory_total=d.memory_total,
                memory_granted=sum(s.memory_limit for s in mine), memory_used=sum(s.memory_used for s in mine),
                compute_granted=100 if whole else min(100, sum(s.compute_set for s in mine)),
                compute_achieved=min(100.0, sum(rates)) if rates else None, slices=len(mine), held_whole=whole))
        return out


def _with_daemon(view: SliceView, daemons: Sequence[DaemonStatus]) -> SliceView:
    """A spatial slice's view with its device's daemon state (the worst of its users' daemons)."""
    if view.engine != Engine.SPATIAL.value:
        return view
    states = [d.state for d in daemons if d.device == view.device_uuid]
    worst = next((s for s in ("down", "fault", "running") if s in states), "none")
    return replace(view, mps=worst)


def _uid(uid: int) -> str:
    return "" if uid < 0 else f" (uid {uid})"


def view_from_json(data: dict[str, Any]) -> NodeView:
    """Inverse of NodeView.to_json (for ``ps`` reading the agent's /v1/status)."""
    return NodeView(
        time=data["time"], node=data["node"],
        devices=tuple(DeviceView(**d) for d in data["devices"]),
        slices=tuple(SliceView(**{**s, "pids": tuple(s["pids"])}) for s in data["slices"]),
        waiters=tuple(data.get("waiters", ())), errors=tuple(data.get("errors", ())),
        backstop=dict(data.get("backstop") or {}), mps=tuple(data.get("mps", ())),
        mps_faults=int(data.get("mps_faults", 0)))
