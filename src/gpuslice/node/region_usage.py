"""Live usage of a grant's slices, from its region file, as plain numbers for ps/top/metrics/dashboard.

The region's binary layout belongs to ``native/include/gpuslice/region.h`` and its Python reader to
``gpuslice.node.region``; this module only turns what the reader returns into :class:`SliceUsage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.node import procs
from gpuslice.node.records import GrantRecord

UNLIMITED = 2**64 - 1


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


def read_grant_usage(grant: GrantRecord) -> GrantUsage:
    """Usage of every slice of ``grant``; an absent region means nothing used yet."""
    path = Path(grant.region_file)
    if not grant.region_file or not path.exists():
        return GrantUsage(grant.grant_id, {s.device_uuid: SliceUsage(s.device_uuid) for s in grant.slices})
    try:
        snapshot = _read(path)
    except Exception as exc:  # a region being created or of an unknown version: say so, do not crash
        return GrantUsage(grant.grant_id, {s.device_uuid: SliceUsage(s.device_uuid) for s in grant.slices},
                          error=str(exc))
    return _usage_of(grant, snapshot)


def region_pids(grant: GrantRecord) -> list[int]:
    """Live pids the enforcer recorded in the grant's region (liveness evidence for the ledger)."""
    usage = read_grant_usage(grant)
    return [pid for pid in usage.pids if procs.alive(pid, 0)]


def _usage_of(grant: GrantRecord, snap) -> GrantUsage:
    live = [p for p in snap.procs if p.pid > 0 and procs.alive(p.pid, p.start_time)]
    slices = {}
    for i, dev in enumerate(snap.devices):
        if dev.uuid not in {s.device_uuid for s in grant.slices}:
            continue
        slices[dev.uuid] = SliceUsage(
            device_uuid=dev.uuid, used=dev.used, peak=dev.peak, oom_refusals=dev.oom_refusals,
            busy_ns=sum(p.busy_ns[i] for p in snap.procs if p.pid > 0),
            throttled_ns=sum(p.throttled_ns[i] for p in snap.procs if p.pid > 0),
            launches=sum(p.launches[i] for p in snap.procs if p.pid > 0),
            pids=tuple(p.pid for p in live if p.used[i] or p.contexts[i]))
    for s in grant.slices:
        slices.setdefault(s.device_uuid, SliceUsage(s.device_uuid))
    return GrantUsage(grant.grant_id, slices, tuple(p.pid for p in live), readable=True)


def _read(path: Path):
    try:
        from gpuslice.node import region
    except ImportError:  # TEMPORARY until node/region.py lands; then only region.read_region
        return _read_v1(path)
    return region.read_region(path)


# ---- TEMPORARY minimal reader of region.h version 1 (seqlock-consistent copy); replaced by node/region.py
@dataclass(frozen=True)
class _Dev:
    uuid: str
    limit: int
    used: int
    peak: int
    oom_refusals: int


@dataclass(frozen=True)
class _Proc:
    pid: int
    start_time: int
    used: tuple[int, ...]
    contexts: tuple[int, ...]
    launches: tuple[int, ...]
    throttled_ns: tuple[int, ...]
    busy_ns: tuple[int, ...]


@dataclass(frozen=True)
class _Snap:
    devices: tuple[_Dev, ...]
    procs: tuple[_Proc, ...]


def _read_v1(path: Path) -> _Snap:
    import struct
    import time as _time

    for _ in range(100):
        data = path.read_bytes()
        if len(data) < 128 or data[:8] != b"GSREGION":
            raise ValueError(f"{path}: not a gpuslice region (bad magic)")
        version, header, size, ndev, nproc, dsize, psize, seq, count = struct.unpack_from("<IIQIIIIQI", data, 8)
        if version != 1:
            raise ValueError(f"{path}: region version {version} is not known (this reader knows 1)")
        if seq % 2 == 0 and len(data) >= size:
            break
        _time.sleep(0.001)
    devs = []
    for i in range(min(count, ndev)):
        off = header + i * dsize
        uuid = data[off:off + 64].split(b"\0", 1)[0].decode(errors="replace")
        limit, used, peak, oom = struct.unpack_from("<QQQQ", data, off + 64)
        devs.append(_Dev(uuid, limit, used, peak, oom))
    procs_ = []
    base = header + ndev * dsize
    for i in range(nproc):
        off = base + i * psize
        pid, state, start = struct.unpack_from("<iIQ", data, off)
        if pid <= 0:
            continue
        arr = lambda o, fmt: struct.unpack_from(f"<16{fmt}", data, off + o)  # noqa: E731
        procs_.append(_Proc(pid, start, arr(32, "Q"), arr(288, "I"), arr(352, "Q"), arr(480, "Q"), arr(608, "Q")))
    return _Snap(tuple(devs), tuple(procs_))
