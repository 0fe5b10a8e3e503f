"""Live resize of a local grant: the recorded request and eviction (``Ledger.resize`` checks and records)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from gpuslice.host import procs
from gpuslice.host.usage import held_now
from gpuslice.local.records import GrantRecord
from gpuslice.spec import Request, Resize


@dataclass(frozen=True)
class Resized:
    """A recorded resize: the grant as it is now, and the pids ended because they held more than the new size."""

    record: GrantRecord
    evicted: tuple[int, ...] = ()
    live_share: tuple[str, ...] = ()  # devices whose roster carries the new share (running pacers: within 100 ms)

    def to_json(self) -> dict:
        return {**self.record.to_json(), "evicted": list(self.evicted), "live_share": list(self.live_share)}


def resized_request(request: Request, change: Resize) -> Request:
    """The request as the ledger records it after ``change`` (ps shows it)."""
    return replace(request, memory=request.memory if change.memory is None else change.memory,
                   compute=request.compute if change.compute is None else change.compute,
                   priority=request.priority if change.priority is None else change.priority,
                   mode=request.mode if change.mode is None else change.mode)


def share_live(record: GrantRecord) -> tuple[str, ...]:
    """The devices whose roster now carries the slice's new compute share, mode and priority: ``write_grant_files``
    wrote them (``gpuslice.enforcer.policy``), and the device's running pacers take them within 100 ms. Pacing on
    or off (a share of 0 or 100 %, mode ``off``) is decided when a process starts."""
    paced = (s for s in record.slices if 0 < s.compute < 100 and s.mode.value != "off")
    return tuple(dict.fromkeys(s.device_uuid for s in paced))


def evict(record: GrantRecord, limits: dict[str, int]) -> tuple[int, ...]:
    """SIGTERM the grant's live processes that hold memory on a device whose new limit is below the slice's
    use there: the region says which pids hold it, but only those proven to be the grant's
    (:func:`gpuslice.local.ledger.slice_processes`: lineage, or the marker and the owner's uid) are
    signalled, through their start time: a pid a tenant planted in the region is never one of them."""
    from gpuslice.local.ledger import slice_processes

    held = held_now(record.watched())
    holders = {pid for uuid, (used, pids) in held.items() if used > limits.get(uuid, used) for pid in pids}
    ours = slice_processes(record, procs.all_stats()).ours
    ended = []
    for s in ours:
        if s.pid in holders and procs.signal_exact(s.pid, s.start, signal.SIGTERM):
            ended.append(s.pid)
    return tuple(sorted(ended))
