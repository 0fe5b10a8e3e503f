"""Live usage of a grant's slices, from its region file, as plain numbers for ps/top/metrics/dashboard.

The region's binary layout belongs to ``native/include/gpuslice/region.h`` and its Python reader to
:mod:`gpuslice.enforcer.region`; this module only turns what the reader returns into :class:`SliceUsage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.enforcer.region import RegionError, RegionSnapshot, read_region
from gpuslice.host import procs
from gpuslice.spec import Grant


@dataclass(frozen=True)
class Watched:
    """A grant as the node monitor watches it, whoever holds it (local ledger or Kubernetes node ledger).

    ``group``: the launched process group (leader pid, its start time; ``(0, 0)``: none), whose members
    count as the slice's processes before they touch the GPU."""

    grant: Grant
    owner: str
    region_file: str = ""
    created: float = 0.0
    command: str = ""
    group: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class SliceUsage:
    """One slice (grant × device): memory now/peak, refusals, and the pacer's cumulative counters."""

    device_uuid: str
    used: int = 0
    peak: int = 0
    oom_refusals: int = 0
    busy_ns: int = 0
    throttled_ns: int = 0
    launches: int = 0
    pids: tuple[int, ...] = ()
    # oom_policy=wait, summed over the slice's processes: allocations waiting now for the device to have
    # room, waits started, waits that timed out
    oom_waiting: int = 0
    oom_waits: int = 0
    oom_wait_timeouts: int = 0


@dataclass(frozen=True)
class GrantUsage:
    grant_id: str
    slices: dict[str, SliceUsage] = field(default_factory=dict)
    pids: tuple[int, ...] = ()
    readable: bool = False  # False: no region yet (no GPU process started) or unreadable
    error: str = ""


def read_grant_usage(watched: Watched) -> GrantUsage:
    """Usage of every slice of the watched grant; an absent region means nothing used yet."""
    grant, path = watched.grant, Path(watched.region_file)
    if not watched.region_file or not path.exists():
        return GrantUsage(grant.grant_id, {s.device_uuid: SliceUsage(s.device_uuid) for s in grant.slices})
    try:
        snapshot = read_region(path)
    except RegionError as exc:  # of an unknown version or not a region: say so, do not crash
        return GrantUsage(grant.grant_id, {s.device_uuid: SliceUsage(s.device_uuid) for s in grant.slices},
                          error=str(exc))
    return _usage_of(grant, snapshot)



def region_pids(watched: Watched) -> list[int]:
    """Live pids the enforcer recorded in the grant's region. The slice's own processes write the region, so
    this is a hint (is a spatial slice's MPS daemon still serving a client?), never proof that a process
    belongs to the slice: nothing is signalled or kept alive because a region lists it (issue 15)."""
    usage = read_grant_usage(watched)
    return [pid for pid in usage.pids if procs.alive(pid, 0)]

def _usage_of(grant: Grant, snap: RegionSnapshot) -> GrantUsage:
    live = [p for p in snap.processes if p.alive()]
    mine = {s.device_uuid for s in grant.slices}
    slices = {}
    for dev in snap.devices:
        if dev.uuid not in mine:
            continue
        slices[dev.uuid] = SliceUsage(
            device_uuid=dev.uuid, used=dev.used, peak=dev.peak, oom_refusals=dev.oom_refusals,
            busy_ns=sum(p.busy_ns.get(dev.uuid, 0) for p in snap.processes),
            throttled_ns=sum(p.throttled_ns.get(dev.uuid, 0) for p in snap.processes),
            launches=sum(p.launches.get(dev.uuid, 0) for p in snap.processes),
            pids=tuple(p.pid for p in live if p.used.get(dev.uuid) or p.contexts.get(dev.uuid)),
            # a process's waits are not per device: counted on every device it holds memory or a context on
            oom_waiting=sum(p.oom_waiting for p in live if p.used.get(dev.uuid) or p.contexts.get(dev.uuid)),
            oom_waits=sum(p.oom_waits for p in snap.processes if p.used.get(dev.uuid) or p.contexts.get(dev.uuid)),
            oom_wait_timeouts=sum(p.oom_wait_timeouts for p in snap.processes
                                  if p.used.get(dev.uuid) or p.contexts.get(dev.uuid)))
    for s in grant.slices:
        slices.setdefault(s.device_uuid, SliceUsage(s.device_uuid))
    return GrantUsage(grant.grant_id, slices, tuple(p.pid for p in live), readable=True)


def held_now(watched: Watched, *, same_pid_namespace: bool = True) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Per device of the grant: the bytes its *live* processes hold now (contexts included) and those
    processes' pids (as the region records them); what a live resize compares a lower limit with. Dead
    processes' leftovers are not counted: the enforcer reclaims them before it would refuse anything.
    ``same_pid_namespace=False`` (a container's region read from the node: its pids mean nothing here):
    every process record counts, dead or not, which can only over-state what is held."""
    held: dict[str, tuple[int, tuple[int, ...]]] = {s.device_uuid: (0, ()) for s in watched.grant.slices}
    if not watched.region_file or not Path(watched.region_file).exists():
        return held
    try:
        snap = read_region(watched.region_file)
    except RegionError:
        return held
    for p in snap.processes:
        if same_pid_namespace and not p.alive():
            continue
        for uuid, used in p.used.items():
            if uuid in held and used:
                total, pids = held[uuid]
                held[uuid] = (total + used, pids + (p.pid,))
    return held


def below_usage(watched: Watched, limits: dict[str, int], names: dict[str, str] | None = None, *,
                same_pid_namespace: bool = True) -> str:
    """"" when every new limit is at least what the grant's live processes hold on its device, else one
    line saying where and how much is in use (the refusal of a live resize without ``evict``)."""
    from gpuslice.spec import human_bytes

    names = names or {}
    over = []
    for uuid, (used, _pids) in held_now(watched, same_pid_namespace=same_pid_namespace).items():
        if uuid in limits and used > limits[uuid]:
            over.append(f"{human_bytes(limits[uuid])} on {names.get(uuid, uuid)} is below the "
                        f"{human_bytes(used)} the slice's processes hold now")
    return "; ".join(over)
