"""Why not: the refusal messages of :class:`~gpuslice.placement.NoFit` and of the extender's filter.

Each message says what the request needs and what is free where it came closest, so a person can tell
a full cluster from a request no node could ever take. Read-only over a :class:`Fit`; decides nothing.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from gpuslice.placement.fit import Fit, engine_ok, model_mask, usable_count
from gpuslice.placement.fleet import UNTRACKED, Fleet
from gpuslice.placement.model import describe_free
from gpuslice.spec import human_bytes


def _need_text(fit: Fit, i: int, j: int | None = None) -> str:
    shape = fit.shape
    if shape.memory is None:
        mem = "whole memory"
    elif shape.memory.bytes is not None:
        mem = human_bytes(shape.memory.bytes)
    else:
        mem = f"{shape.memory.percent:g}% of memory"
        if j is not None:
            mem += f" ({human_bytes(int(fit.need[i, j]))})"
    if shape.whole:
        per = f"{shape.count} idle device(s)"
    else:
        per = "1 device" if shape.count == 1 else f"{shape.count} distinct devices"
    extra = f", compute {shape.compute}%" if shape.compute else ""
    extra += f", {shape.engine.value} engine" if shape.engine.value != "timeslice" else ""
    return f"needs {mem}{extra} on {per}"


def _other_engine(fleet: Fleet, fit: Fit, rows: slice | int) -> bool:
    """Devices (of ``rows``) would take the request but for their slices' engine."""
    shape = fit.shape
    room = (model_mask(fleet, shape.models)[rows] & ~fleet.excl[rows] & (fleet.slots_used[rows] < fleet.split[rows])
            & (fleet.mem_cap[rows] - fleet.mem_used[rows] >= fit.need[rows])
            & (100 - fleet.comp_used[rows] >= shape.compute))
    return bool((room & ~engine_ok(fleet, shape)[rows]).any())


def _engine_text(fit: Fit) -> str:
    other = "spatial" if fit.shape.engine.value == "timeslice" else "timeslice"
    return f"devices with room run {other} slices (a device runs one engine at a time)"


def _host_short(fleet: Fleet, fit: Fit, i: int) -> str | None:
    """Node i's CPU or host memory is what it lacks (None when both suffice or are not tracked)."""
    shape = fit.shape
    if fleet.cpu_total[i] != UNTRACKED and fleet.cpu_total[i] - fleet.cpu_used[i] < shape.cpu_milli:
        return f"CPU: needs {shape.cpu_milli}m, {int(fleet.cpu_total[i] - fleet.cpu_used[i])}m free"
    if fleet.hm_total[i] != UNTRACKED and fleet.hm_total[i] - fleet.hm_used[i] < shape.host_memory:
        return f"host memory: needs {human_bytes(shape.host_memory)}, " \
               f"{human_bytes(int(fleet.hm_total[i] - fleet.hm_used[i]))} free"
    return None


def why_not_node(fleet: Fleet, fit: Fit, i: int) -> str:
    """Why node row i cannot take the request of ``fit``."""
    shape = fit.shape
    short = _host_short(fleet, fit, i)
    if short is not None:
        return short
    model_ok = model_mask(fleet, shape.models)[i]
    if not model_ok.any():
        present = sorted({d.model for d in fleet.static[i]}) or ["none"]
        return f"no device of model {'|'.join(shape.models)} (has {', '.join(present)})"
    if shape.whole:
        idle = int(usable_count(fleet, fit.dev_ok[i:i + 1], np.array([i]))[0])
        return f"{_need_text(fit, i)}; {idle} idle device(s) of a matching model"
    if shape.count > 1 and fit.dev_ok[i].any():
        room = int(usable_count(fleet, fit.dev_ok[i:i + 1], np.array([i]))[0])
        return f"{_need_text(fit, i)}; {room} device(s) with room (one MIG instance per card counts)"
    if not shape.whole and shape.count == 1 and _other_engine(fleet, fit, i):
        return f"{_need_text(fit, i)}; {_engine_text(fit)}"
    state = fleet.node_state(i)
    best = max((d for d, ok in zip(state.devices, model_ok) if ok), key=lambda d: d.free_memory)
    j = [d.uuid for d in state.devices].index(best.uuid)
    if all(d.free_slots == 0 for d, ok in zip(state.devices, model_ok) if ok):
        return f"every matching device holds its maximum of {best.split_count} slices"
    if best.free_memory >= int(fit.need[i, j]):
        most = max(d.free_compute for d, ok in zip(state.devices, model_ok) if ok)
        return f"{_need_text(fit, i, j)}; most free compute on a device with room is {most}%"
    return f"{_need_text(fit, i, j)}; largest free is {human_bytes(best.free_memory)} on {best.uuid} " \
           f"({describe_free(state) if len(state.devices) <= 2 else f'{len(state.devices)} devices'})"


def why_not(fleet: Fleet, fit: Fit) -> str:
    """Why no node of ``fleet`` can take the request of ``fit``: what came closest, cluster-wide."""
    shape = fit.shape
    if len(fleet) == 0:
        return "no nodes to place on"
    model_ok = model_mask(fleet, shape.models)
    if not model_ok.any():
        models = sorted({k.model for k in fleet.kinds})
        return f"no device of model {'|'.join(shape.models)} on any node (models present: {', '.join(models)})"
    free = np.where(model_ok & ~fleet.excl & (fleet.slots_used < fleet.split), fleet.mem_cap - fleet.mem_used, -1)
    i, j = np.unravel_index(int(np.argmax(free)), free.shape)
    where = f"on {fleet.static[i][j].uuid} (node {fleet.names[i]})" if free[i, j] >= 0 else "anywhere"
    if shape.whole:
        idle = usable_count(fleet, model_ok & (fleet.slots_used == 0) & ~fleet.excl)
        k = int(np.argmax(idle))
        return (f"{_need_text(fit, int(i))}; most idle matching devices on one node is {int(idle[k])} "
                f"(node {fleet.names[k]})")
    if shape.count > 1 and fit.dev_ok.any():
        room = usable_count(fleet, fit.dev_ok)
        k = int(np.argmax(room))
        return (f"{_need_text(fit, int(i))}; most devices with room on one node is {int(room[k])} "
                f"(node {fleet.names[k]})")
    text = f"{_need_text(fit, int(i), int(j))}; largest free is {human_bytes(max(0, int(free[i, j])))} {where}"
    room = (model_ok & (fleet.mem_cap - fleet.mem_used >= fit.need)).any()
    if not fit.dev_ok.any() and _other_engine(fleet, fit, slice(None)):
        text += f"; {_engine_text(fit)}"
    elif room and not fit.dev_ok.any():
        text += "; devices with that memory lack compute or slice slots"
    elif fit.dev_ok.any():
        text += "; devices fit but no node has the CPU / host memory"
    return text


def why_not_host(fleet: Fleet, cpu_free: np.ndarray, cpu_milli: int, host_memory: int) -> str:
    """Why no node can take a task that needs no device (``place_host``): the most free CPU anywhere."""
    best = int(np.argmax(cpu_free)) if len(fleet) else -1
    where = f"; most free CPU is {int(cpu_free[best])}m on node {fleet.names[best]}" if best >= 0 else ""
    return f"needs {cpu_milli}m CPU and {human_bytes(host_memory)} host memory on one node{where}"


def name_devices(text: str, names: Mapping[str, str]) -> str:
    """A refusal message with device UUIDs replaced by what a person calls them (``GPU 0``), as given by
    the caller (placement sees UUIDs only). Longer UUIDs first: a MIG instance's never hides in another."""
    for uuid in sorted(names, key=len, reverse=True):
        text = text.replace(uuid, names[uuid])
    return text


__all__ = ["name_devices", "why_not", "why_not_host", "why_not_node"]
