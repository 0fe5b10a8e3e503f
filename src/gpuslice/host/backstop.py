"""The out-of-process backstop: each slice's device memory as NVML sees it, held to the slice's limit.

The enforcer lives inside the slice's processes, so a process can step around it: a statically linked program,
one that clears ``LD_PRELOAD`` or is started with ``env -i``, processes of one slice that rewrite their shared
region together (each then holds up to the whole limit). NVML's per-process device memory
(``nvmlDeviceGetComputeRunningProcesses``) is the driver's own count, which no process can forge. The node
agent (local: ``gpuslice agent``; Kubernetes: ``gpuslice kube-agent``) calls :meth:`Backstop.check` every
sample with each slice's limit and the processes it can prove are the slice's (local: the launcher's lineage
and the grant's marker in processes of its owner; Kubernetes: the container's cgroup), and:

* sums NVML's bytes of the slice's processes on each device; a slice above ``limit + tolerance`` (tolerance:
  ``max(tolerance_bytes, tolerance_ratio × limit)``, default 256 MiB or 2 %, for memory the driver keeps per
  context beyond what the enforcer counts) is **reported** at once (``ps``, metrics, dashboard, the log) and,
  with the ``kill`` policy (default), its processes on that device are **killed** (SIGKILL through a pidfd
  checked against the start time read *before* membership was proven, so a pid freed and reused after the
  proof is never signalled) once it has stayed above for ``grace`` seconds (default 5) — a burst shorter than
  the grace is reported only;
* reports the GPU processes that belong to no slice (``unattributed``): nothing placed them, nothing limits
  them; they are shown, never killed.

Detection time is at most one sample interval plus NVML's own refresh; the action follows ``grace`` later
(measured on the GPU by ``bench/backstop_detection.sh``). Policies: ``kill`` (report, then kill after the
grace), ``report`` (report only), ``off``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from gpuslice.host import procs
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.backstop")

POLICIES = ("kill", "report", "off")
PROCESSES_ENV = "GPUSLICE_GPU_PROCESSES"  # a JSON file standing in for NVML (machines without a GPU, tests)
MiB = 1 << 20


@dataclass(frozen=True)
class GpuProcess:
    """One process on one device as NVML reports it (``used`` in bytes; None = NVML did not say)."""

    device_uuid: str
    pid: int
    used: int | None


ProcessMemory = Callable[[], list[GpuProcess]]


@dataclass(frozen=True)
class Tracked:
    """One slice as the backstop holds it: its grant, device and limit."""

    grant_id: str
    device_uuid: str
    limit: int
    owner: str = ""


# GPU pids -> the grant each provably belongs to (pids of no grant left out). Asked only about the processes
# NVML lists, so proving membership costs a few /proc reads per GPU process, not per process of the node.
Attribute = Callable[[Sequence[int]], dict[int, str]]


@dataclass(frozen=True)
class Policy:
    action: str = "kill"
    grace: float = 5.0
    tolerance_bytes: int = 256 * MiB
    tolerance_ratio: float = 0.02

    def __post_init__(self) -> None:
        if self.action not in POLICIES:
            raise SpecError("backstop", self.action, " or ".join(POLICIES))
        if not 0 <= self.grace < 86400:
            raise SpecError("backstop_grace", self.grace, "seconds from 0 to 86400")
        if not 0 <= self.tolerance_bytes <= 1 << 40:
            raise SpecError("backstop_tolerance", self.tolerance_bytes, "bytes from 0 to 1 TiB")

    @classmethod
    def from_options(cls, action: str, grace: float, tolerance: str) -> "Policy":
        """From the agents' ``--backstop``, ``--backstop-grace`` and ``--backstop-tolerance`` (a size: ``256MiB``);
        :class:`SpecError` naming the option's field otherwise."""
        import math

        from gpuslice.spec import parse_bytes

        if not isinstance(grace, (int, float)) or not math.isfinite(grace):
            raise SpecError("backstop_grace", grace, "seconds from 0 to 86400")
        return cls(action=action, grace=float(grace),
                   tolerance_bytes=parse_bytes(tolerance, "backstop_tolerance", allow_zero=True))

    def allowed(self, limit: int) -> int:
        """What a slice may show in NVML before it counts as over its limit."""
        return limit + max(self.tolerance_bytes, int(limit * self.tolerance_ratio))


@dataclass(frozen=True)
class Overrun:
    """A slice above its limit in NVML's count."""

    grant_id: str
    device_uuid: str
    used: int
    limit: int
    allowed: int
    over_for: float  # seconds it has been above ``allowed``
    action: str  # "reported", "killed" or "kill failed"
    pids: tuple[int, ...]
    owner: str = ""


@dataclass(frozen=True)
class Stranger:
    """A GPU process that belongs to no slice."""

    device_uuid: str
    pid: int
    used: int | None
    uid: int | None
    command: str


@dataclass(frozen=True)
class BackstopReport:
    policy: str
    overruns: tuple[Overrun, ...] = ()
    unattributed: tuple[Stranger, ...] = ()
    seen: dict[tuple[str, str], int] = field(default_factory=dict)  # (grant, device) -> NVML bytes
    error: str = ""
    kills: int = 0  # processes killed by this check
    kills_total: dict[tuple[str, str], int] = field(default_factory=dict)  # (grant, device) -> since the start

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "overruns": [asdict(o) for o in self.overruns],
                "unattributed": [asdict(s) for s in self.unattributed], "error": self.error, "kills": self.kills,
                "kills_total": [{"grant": g, "device": d, "kills": n} for (g, d), n in sorted(self.kills_total.items())]}


class Backstop:
    """Keeps, per slice and device, since when it is above its limit, and acts on it by ``policy``."""

    def __init__(self, source: ProcessMemory | None, policy: Policy = Policy(),
                 kill: Callable[[int, int], bool] | None = None, clock: Callable[[], float] = time.monotonic,
                 start_of: Callable[[int], int] = procs.start_time):
        self.source = source
        self.policy = policy
        self.kill = kill or kill_exact  # (pid, start time) -> signalled
        self.start_of = start_of  # pid -> start time, 0 when gone
        self.clock = clock
        self._over_since: dict[tuple[str, str], float] = {}
        self.kills_total: dict[tuple[str, str], int] = {}

    def check(self, slices: Sequence[Tracked], attribute: Attribute) -> BackstopReport:
        if self.policy.action == "off" or self.source is None:
            return BackstopReport("off" if self.policy.action == "off" else "off (no per-process memory source)")
        try:
            found = self.source()
            # each process as it is before its membership is proven: only that process may be killed for it
            starts = {p.pid: self.start_of(p.pid) for p in found}
            grant_of = attribute(sorted(starts)) if found else {}
        except Exception as exc:  # NVML away for a moment: say so, act on nothing
            return BackstopReport(self.policy.action, error=f"per-process device memory unavailable: {exc}")
        now = self.clock()
        by_key = {(s.grant_id, s.device_uuid): s for s in slices}
        seen: dict[tuple[str, str], int] = {}
        on_device: dict[tuple[str, str], list[int]] = {}
        strangers = []
        for p in found:
            slice_ = by_key.get((grant_of.get(p.pid, ""), p.device_uuid))
            if slice_ is None:  # of no slice, or on a device its slice does not hold
                strangers.append(_stranger(p))
                continue
            key = (slice_.grant_id, slice_.device_uuid)
            seen[key] = seen.get(key, 0) + (p.used or 0)
            on_device.setdefault(key, []).append(p.pid)
        overruns, kills = [], 0
        for s in slices:
            key = (s.grant_id, s.device_uuid)
            used, allowed = seen.get(key, 0), self.policy.allowed(s.limit)
            if used <= allowed:
                self._over_since.pop(key, None)
                continue
            since = self._over_since.setdefault(key, now)
            action = "reported"
            if self.policy.action == "kill" and now - since >= self.policy.grace:
                done = [pid for pid in on_device.get(key, []) if starts[pid] and self.kill(pid, starts[pid])]
                kills += len(done)
                self.kills_total[key] = self.kills_total.get(key, 0) + len(done)
                action = "killed" if done else "kill failed"
                log.warning("backstop: slice %s on %s uses %d bytes in NVML's count, above its %d-byte limit (+%d "
                            "tolerance) for %.1f s: killed %s", s.grant_id, s.device_uuid, used, s.limit,
                            allowed - s.limit, now - since, done)
            elif since == now:
                log.warning("backstop: slice %s on %s uses %d bytes in NVML's count, above its %d-byte limit (+%d "
                            "tolerance)%s", s.grant_id, s.device_uuid, used, s.limit, allowed - s.limit,
                            f"; killed in {self.policy.grace:g} s if it stays" if self.policy.action == "kill" else "")
            overruns.append(Overrun(s.grant_id, s.device_uuid, used, s.limit, allowed, now - since, action,
                                    tuple(sorted(on_device.get(key, []))), s.owner))
        live = {(s.grant_id, s.device_uuid) for s in slices}
        self._over_since = {k: v for k, v in self._over_since.items() if k in live}
        return BackstopReport(self.policy.action, tuple(overruns), tuple(strangers), seen, kills=kills,
                              kills_total=dict(self.kills_total))


def _stranger(p: GpuProcess) -> Stranger:
    try:
        command = (procs.PROC / str(p.pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        command = ""
    return Stranger(p.device_uuid, p.pid, p.used, procs.real_uid(p.pid), command.strip()[:200])


def kill_exact(pid: int, start: int) -> bool:
    """SIGKILL ``pid`` only if it is still the process that started at ``start`` (checked through a pidfd)."""
    return procs.signal_exact(pid, start, signal.SIGKILL)


# ------------------------------------------------------------------------------------------ sources
def nvml_source(device_uuids: Iterable[str]) -> ProcessMemory:
    """Per-process device memory of these devices (or MIG instances) from NVML (compute and MPS processes)."""
    import pynvml

    pynvml.nvmlInit()
    handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in device_uuids}

    def read() -> list[GpuProcess]:
        out = []
        for uuid, handle in handles.items():
            seen = set()
            for call in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetMPSComputeRunningProcesses):
                try:
                    infos = call(handle)
                except pynvml.NVMLError_NotSupported:
                    continue
                for info in infos:
                    if info.pid in seen:
                        continue
                    seen.add(info.pid)
                    used = info.usedGpuMemory
                    out.append(GpuProcess(uuid, int(info.pid), int(used) if isinstance(used, int) else None))
        return out

    return read


def file_source(path: str | os.PathLike[str]) -> ProcessMemory:
    """Per-process device memory from a JSON file ``[{"uuid": …, "pid": …, "used": bytes}, …]``, read at every
    check (``$GPUSLICE_GPU_PROCESSES``: machines without a GPU, where a devices snapshot stands in for NVML)."""
    from gpuslice.spec.files import open_regular

    def read() -> list[GpuProcess]:
        with os.fdopen(open_regular(path, follow=True), "rb") as f:
            data = json.loads(f.read(1 << 20))
        return [GpuProcess(str(d["uuid"]), int(d["pid"]), None if d.get("used") is None else int(d["used"]))
                for d in data]

    return read


def default_source(device_uuids: Sequence[str]) -> ProcessMemory | None:
    """``$GPUSLICE_GPU_PROCESSES`` when set; else NVML unless devices come from a snapshot (no GPU: None)."""
    given = os.environ.get(PROCESSES_ENV)
    if given:
        return file_source(Path(given))
    if os.environ.get("GPUSLICE_DEVICE_SNAPSHOT"):
        return None
    try:
        return nvml_source(device_uuids)
    except Exception as exc:  # no NVML: the backstop says it is off, the agent runs on
        log.warning("backstop: NVML per-process memory unavailable (%s); the backstop is off", exc)
        return None
