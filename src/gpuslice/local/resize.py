"""Live resize of a local grant: the new slices, the recorded request, and eviction (``Ledger.resize``)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from typing import Callable

from gpuslice.host import procs
from gpuslice.host.usage import held_now
from gpuslice.local.records import GrantRecord
from gpuslice.placement import NodeState
from gpuslice.spec import Engine, Request, Resize, Slice, SpecError


@dataclass(frozen=True)
class Resized:
    """A recorded resize: the grant as it is now, and the pids ended because they held more than the new size."""

    record: GrantRecord
    evicted: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {**self.record.to_json(), "evicted": list(self.evicted)}


def resized_slices(record: GrantRecord, change: Resize, empty: NodeState) -> tuple[Slice, ...]:
    """The grant's slices after ``change`` (a percent resolves against each device's memory)."""
    if any(s.engine is Engine.SPATIAL for s in record.slices):
        # MPS fixes a client's SM share and pinned memory limit when the client starts.
        raise SpecError("engine", "spatial", "a time-sliced grant: a spatial slice's MPS share and memory limit are "
                        "fixed when its processes start")
    if record.exclusive and (change.compute is not None or change.memory is not None):
        raise SpecError("exclusive", True, "a shared grant: a grant of whole devices has all of their memory and "
                        "compute (priority and mode may change)")
    totals = {d.uuid: d.memory_total for d in empty.devices}
    return tuple(change.applied(s, totals.get(s.device_uuid, s.memory_limit)) for s in record.slices)


def resized_request(request: Request, change: Resize) -> Request:
    """The request as the ledger records it after ``change`` (ps shows it)."""
    return replace(request, memory=request.memory if change.memory is None else change.memory,
                   compute=request.compute if change.compute is None else change.compute,
                   priority=request.priority if change.priority is None else change.priority,
                   mode=request.mode if change.mode is None else change.mode)


def evict(record: GrantRecord, limits: dict[str, int], region_pids: Callable[[GrantRecord], list[int]]) -> tuple[int, ...]:
    """SIGTERM the grant's live processes that hold memory on a device whose new limit is below the slice's
    use there: only processes proven to be the grant's (:func:`gpuslice.local.ledger.slice_processes`'s rule:
    the enforcer recorded them in the grant's region and they still run with the same start time)."""
    from gpuslice.local.ledger import slice_processes

    held = held_now(record.watched())
    holders = {pid for uuid, (used, pids) in held.items() if used > limits.get(uuid, used) for pid in pids}
    ours = slice_processes(record, procs.all_stats(), region_pids).ours
    ended = []
    for s in ours:
        if s.pid in holders and procs.signal_exact(s.pid, s.start, signal.SIGTERM):
            ended.append(s.pid)
    return tuple(sorted(ended))
