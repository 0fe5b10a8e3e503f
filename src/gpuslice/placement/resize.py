"""Whether a granted slice may take a new size where it is (a live resize): pure, like all of placement.

The grant's slices leave the node's books, the resized ones must then fit beside everyone else by the same
rules a new slice meets (memory limits add up to at most ``memory_total × memory_scaling``, compute shares to
100 %; a device held whole by the grant may use its physical memory); nothing moves. The caller holds the
node's ledger lock across the check and the record, so two resizes or a resize and a new grant can never
both take the last free bytes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuslice.placement.model import NodeState, NoFit, apply, release
from gpuslice.spec import Engine, Grant, Resize, Slice, SpecError, human_bytes


def resized_slices(grant: Grant, change: Resize, memory_totals: Mapping[str, int]) -> tuple[Slice, ...]:
    """The slices of ``grant`` after ``change`` (a percent resolves against each device's memory in
    ``memory_totals``). What cannot be resized live is refused naming the field: a spatial slice (MPS fixes
    a client's SM share and pinned memory when the client starts) and the memory or compute of a grant of
    whole devices (it has all of them; its priority and mode may change)."""
    if any(s.engine is Engine.SPATIAL for s in grant.slices):
        raise SpecError("engine", "spatial", "a time-sliced grant: a spatial slice's MPS share and memory limit are "
                        "fixed when its processes start")
    if grant.exclusive and (change.compute is not None or change.memory is not None):
        raise SpecError("exclusive", True, "a shared grant: a grant of whole devices has all of their memory and "
                        "compute (priority and mode may change)")
    return tuple(change.applied(s, memory_totals.get(s.device_uuid, s.memory_limit)) for s in grant.slices)


def resize(node: NodeState, old: Sequence[Slice], new: Sequence[Slice], *, exclusive: bool = False,
           names: Mapping[str, str] | None = None) -> NodeState:
    """The node after slices ``old`` (granted on it) became ``new`` (the same devices, in the same order).

    Raises :class:`NoFit` naming the device (``names`` maps UUIDs to what a person calls them), what the
    resize asks and what is free beside the other slices; :class:`SpecError` if ``new`` moves a slice."""
    if [s.device_uuid for s in old] != [s.device_uuid for s in new]:
        raise SpecError("slices", [s.device_uuid for s in new], "the devices the grant holds (a resize moves nothing)")
    names = names or {}
    without = release(node, old, exclusive=exclusive)
    for s in new:
        d = without.device(s.device_uuid)
        name = names.get(s.device_uuid, s.device_uuid)
        room = d.whole_capacity if exclusive else d.free_memory
        if s.memory_limit > room:
            raise NoFit(f"memory: {human_bytes(s.memory_limit)} on {name} does not fit; "
                        f"{human_bytes(room)} is free there beside the other slices"
                        + (f" (memory scaling {d.memory_scaling:g})" if d.memory_scaling != 1 else ""))
        if not exclusive and s.compute > d.free_compute:
            raise NoFit(f"compute: {s.compute}% on {name} does not fit; {d.free_compute}% is free there "
                        "beside the other slices")
    return apply(without, new, exclusive=exclusive)
