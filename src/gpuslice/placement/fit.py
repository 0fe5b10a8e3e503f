"""Fit: which devices and nodes can take a request, as [nodes, devices] masks over a :class:`Fleet`.

Every scorer starts from these masks; the refusal messages (:mod:`.whynot`) explain them. Nothing here
ranks anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from gpuslice.placement.fleet import ENGINE_CODE, Fleet
from gpuslice.placement.model import TaskShape


def static_array(fleet: Fleet, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
    """Arrays that depend only on the fleet's devices (per memory amount, per model list): built once."""
    value = fleet._static_cache.get(key)
    if value is None:
        if len(fleet._static_cache) > 256:
            fleet._static_cache.clear()
        value = fleet._static_cache[key] = make()
    return value


def model_mask(fleet: Fleet, models: Sequence[str]) -> np.ndarray:
    """[N, G] True where the device's model is allowed (kinds are few, so test each kind once)."""
    if not models:
        return fleet.valid

    def make() -> np.ndarray:
        allowed = np.array([k.matches(models) for k in fleet.kinds] or [False], bool)
        return fleet.valid & allowed[fleet.kind]
    return static_array(fleet, ("models", tuple(models)), make)


def memory_need(fleet: Fleet, shape: TaskShape) -> np.ndarray:
    """[N, G] bytes the request needs on each device: percent resolves per device, None = whole memory."""
    memory = shape.memory
    if memory is None:
        return fleet.mem_total
    if memory.bytes is not None:
        return static_array(fleet, ("bytes", memory.bytes),
                            lambda: np.full(fleet.mem_total.shape, memory.bytes, np.int64))
    # Same rounding as MemoryAmount.resolve (floor), so the slices we emit equal what a caller resolves.
    return static_array(fleet, ("percent", memory.percent),
                        lambda: (fleet.mem_total * memory.percent // 100).astype(np.int64))


@dataclass
class Fit:
    shape: TaskShape
    need: np.ndarray  # [N, G] bytes per device
    dev_ok: np.ndarray  # [N, G] device can take (its part of) the request
    node_ok: np.ndarray  # [N]


def whole_cap(fleet: Fleet) -> np.ndarray:
    """[N, G] the memory a grant holding the device whole may have (DeviceState.whole_capacity)."""
    return static_array(fleet, ("whole_cap",), lambda: np.maximum(fleet.mem_cap, fleet.mem_total))


def usable_count(fleet: Fleet, dev_ok: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """[N] (or [C] for ``rows``) how many of the ok devices one multi-device request can use together:
    every whole GPU, and at most one MIG instance per card."""
    counts = dev_ok.sum(axis=1)
    mig = fleet.has_mig if rows is None else fleet.has_mig[rows]
    for c in np.flatnonzero(mig & (counts > 1)):
        i = int(c if rows is None else rows[c])
        parents = fleet.parent[i][dev_ok[c]]
        counts[c] = int((parents < 0).sum()) + len(set(parents[parents >= 0].tolist()))
    return counts


def engine_ok(fleet: Fleet, shape: TaskShape) -> np.ndarray:
    """[N, G] the device takes a slice of the shape's engine: it has no slices, or slices of that engine."""
    return (fleet.slots_used == 0) | (fleet.engine == ENGINE_CODE[shape.engine])


def fit_shape(fleet: Fleet, shape: TaskShape) -> Fit:
    """The devices that can take one device's part of ``shape`` and the nodes that can take all of it."""
    need = memory_need(fleet, shape)
    model_ok = model_mask(fleet, shape.models)
    if shape.whole:
        dev_ok = model_ok & (fleet.slots_used == 0) & ~fleet.excl & (need <= whole_cap(fleet))
    else:
        # The free memory and compute go through reused work arrays: [N, G] int64 temporaries cost more in
        # page faults than in arithmetic at 5,000 × 8 (Fleet.scratch).
        free = np.subtract(fleet.mem_cap, fleet.mem_used, out=fleet.scratch("fit-free", need.shape, np.int64))
        dev_ok = free >= need
        dev_ok &= np.less_equal(fleet.comp_used, 100 - shape.compute)
        dev_ok &= model_ok
        dev_ok &= ~fleet.excl
        dev_ok &= fleet.slots_used < fleet.split
        dev_ok &= engine_ok(fleet, shape)
    node_ok = dev_ok.any(axis=1) if shape.count <= 1 else usable_count(fleet, dev_ok) >= shape.count
    node_ok = (node_ok & (fleet.cpu_total - fleet.cpu_used >= shape.cpu_milli)
               & (fleet.hm_total - fleet.hm_used >= shape.host_memory))
    return Fit(shape, need, dev_ok, node_ok)


__all__ = ["Fit", "engine_ok", "fit_shape", "memory_need", "model_mask", "static_array", "usable_count", "whole_cap"]
