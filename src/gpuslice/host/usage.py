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
            pids=tuple(p.pid for p in live if p.used.get(dev.uuid) or p.contexts.get(dev.uuid)))
    for s in grant.slices:
        slices.setdefault(s.device_uuid, SliceUsage(s.device_uuid))
    return GrantUsage(grant.grant_id, slices, tuple(p.pid for p in live), readable=True)
