"""Fit and score: the one place that decides which devices serve a request.

See the package docstring (``gpuslice.placement``) for the rules and the fragmentation formula.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpuslice.placement.fleet import UNTRACKED, Fleet
from gpuslice.placement.model import (
    NoFit, NodeState, Placement, PlacementPolicy, TaskShape, Workload, describe_free,
)
from gpuslice.spec import Request, Slice, SpecError, human_bytes

FGD_MAX_SHAPES = 32  # FGD's cost grows with the number of shapes; the rarest beyond this carry ~no weight

Nodes = Sequence[NodeState] | Fleet


def _as_fleet(nodes: Nodes) -> Fleet:
    if isinstance(nodes, Fleet):
        return nodes
    if isinstance(nodes, NodeState):
        raise SpecError("nodes", nodes.name, "a sequence of NodeState (wrap one node in a list)")
    return Fleet(nodes)


def _check_request(request: Request) -> None:
    if not isinstance(request, Request):
        raise SpecError("request", request, "a gpuslice.spec.Request")


def _model_mask(fleet: Fleet, models: Sequence[str]) -> np.ndarray:
    """[N, G] True where the device's model is allowed (kinds are few, so test each kind once)."""
    if not models:
        return fleet.valid
    allowed = np.array([k.matches(models) for k in fleet.kinds] or [False], bool)
    return fleet.valid & allowed[fleet.kind]


def _memory_need(fleet: Fleet, shape: TaskShape) -> np.ndarray:
    """[N, G] bytes the request needs on each device: percent resolves per device, None = whole memory."""
    if shape.memory is None:
        return fleet.mem_total
    if shape.memory.bytes is not None:
        return np.full(fleet.mem_total.shape, shape.memory.bytes, np.int64)
    # Same rounding as MemoryAmount.resolve (floor), so the slices we emit equal what a caller resolves.
    return (fleet.mem_total * shape.memory.percent // 100).astype(np.int64)


@dataclass
class _Fit:
    shape: TaskShape
    need: np.ndarray  # [N, G] bytes per device
    dev_ok: np.ndarray  # [N, G] device can take (its part of) the request
    node_ok: np.ndarray  # [N]


def _fit(fleet: Fleet, shape: TaskShape) -> _Fit:
    need = _memory_need(fleet, shape)
    model_ok = _model_mask(fleet, shape.models)
    if shape.whole:
        dev_ok = model_ok & (fleet.slots_used == 0) & ~fleet.excl & (need <= fleet.mem_cap)
        node_ok = dev_ok.sum(axis=1) >= shape.count
    else:
        dev_ok = (model_ok & ~fleet.excl & (fleet.slots_used < fleet.split)
                  & (fleet.mem_cap - fleet.mem_used >= need) & (100 - fleet.comp_used >= shape.compute))
        node_ok = dev_ok.any(axis=1)
    node_ok = (node_ok & (fleet.cpu_total - fleet.cpu_used >= shape.cpu_milli)
               & (fleet.hm_total - fleet.hm_used >= shape.host_memory))
    return _Fit(shape, need, dev_ok, node_ok)


# ------------------------------------------------------------------------------------- fragmentation
@dataclass
class _Types:
    """Static per-(device, shape) arrays of a workload's shapes, cached on the fleet."""

    shapes: tuple[TaskShape, ...]
    need: np.ndarray  # [N, G, K]
    model_ok: np.ndarray  # [N, G, K]
    whole: np.ndarray  # [K]
    count: np.ndarray  # [K]
    compute: np.ndarray  # [K]
    cpu: np.ndarray  # [K]
    hm: np.ndarray  # [K]


def _types(fleet: Fleet, shapes: tuple[TaskShape, ...]) -> _Types:
    cached = fleet._type_cache.get(shapes)
    if cached is not None:
        return cached
    need = np.stack([_memory_need(fleet, s) for s in shapes], axis=-1)
    model_ok = np.stack([_model_mask(fleet, s.models) for s in shapes], axis=-1)
    whole = np.array([s.whole for s in shapes])
    # Whole-device shapes that can never fit a device (too much memory) are simply "not ok" there.
    model_ok = model_ok & ~(whole & (need > fleet.mem_cap[..., None]))
    types = _Types(shapes, need, model_ok, whole,
                   np.array([s.count for s in shapes]), np.array([s.compute for s in shapes]),
                   np.array([s.cpu_milli for s in shapes]), np.array([s.host_memory for s in shapes]))
    if len(fleet._type_cache) > 8:  # workloads drift; keep the few most recent
        fleet._type_cache.clear()
    fleet._type_cache[shapes] = types
    return types


def _workload_vectors(workload: Workload | None, shape: TaskShape) -> tuple[tuple[TaskShape, ...], np.ndarray]:
    if workload is None or not workload.counts:
        return (shape,), np.ones(1)
    top = workload.top(FGD_MAX_SHAPES) if len(workload.counts) > FGD_MAX_SHAPES else workload
    shapes = tuple(s for s, _ in top.counts)
    weights = np.array([c for _, c in top.counts], float)
    return shapes, weights / weights.sum()


def _shape_fits(t: _Types, rows: np.ndarray, mem_free: np.ndarray, comp_free: np.ndarray,
                slots_free: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """[C, G, K]: can a device in this state take one device's part of each shape."""
    shared = ((slots_free[..., None] >= 1) & (mem_free[..., None] >= t.need[rows])
              & (comp_free[..., None] >= t.compute))
    return np.where(t.whole, idle[..., None], shared) & t.model_ok[rows]


def _node_frag(fits: np.ndarray, share: np.ndarray, cpu_free: np.ndarray, hm_free: np.ndarray,
               t: _Types, p: np.ndarray) -> np.ndarray:
    """Expected fragmentation of each node (see the package docstring). fits [..., G, K], share [..., G]."""
    lost = (share[..., None] * ~fits).sum(axis=-2)  # [..., K] free share on devices that cannot take k
    hostable = ((fits.sum(axis=-2) >= t.count) & (cpu_free[..., None] >= t.cpu) & (hm_free[..., None] >= t.hm))
    total = share.sum(axis=-1)[..., None]
    return (np.where(hostable, lost, total) * p).sum(axis=-1)


def _dyn(fleet: Fleet, rows: np.ndarray):
    excl = fleet.excl[rows] | ~fleet.valid[rows]
    mem_free = np.where(excl, 0, fleet.mem_cap[rows] - fleet.mem_used[rows])
    comp_free = np.where(excl, 0, 100 - fleet.comp_used[rows])
    slots_free = np.where(excl, 0, fleet.split[rows] - fleet.slots_used[rows])
    idle = (fleet.slots_used[rows] == 0) & ~excl
    share = mem_free / fleet.mem_cap[rows]
    cpu_free = fleet.cpu_total[rows] - fleet.cpu_used[rows]
    hm_free = fleet.hm_total[rows] - fleet.hm_used[rows]
    return mem_free, comp_free, slots_free, idle, share, cpu_free, hm_free


def _frag_delta_shared(fleet: Fleet, fit: _Fit, rows: np.ndarray, workload: Workload | None) -> np.ndarray:
    """[C, G]: increase of expected fragmentation if the (shared, one-device) request goes on device g.

    Only device g (and the node's CPU) change, so the node's sums are updated by g's before/after terms
    instead of being recomputed per candidate.
    """
    shapes, p = _workload_vectors(workload, fit.shape)
    t = _types(fleet, shapes)
    mem_free, comp_free, slots_free, idle, share, cpu_free, hm_free = _dyn(fleet, rows)
    fits_b = _shape_fits(t, rows, mem_free, comp_free, slots_free, idle)
    need = fit.need[rows]
    mem_a = mem_free - need
    share_a = mem_a / fleet.mem_cap[rows]
    fits_a = _shape_fits(t, rows, mem_a, comp_free - fit.shape.compute, slots_free - 1, np.zeros_like(idle))
    lost_b = share[..., None] * ~fits_b  # [C, G, K]
    lost_a = share_a[..., None] * ~fits_a
    lost_node = lost_b.sum(axis=1)  # [C, K]
    count_node = fits_b.sum(axis=1)
    total = share.sum(axis=1)  # [C]
    host_b = ((count_node >= t.count) & (cpu_free[:, None] >= t.cpu) & (hm_free[:, None] >= t.hm))
    before = (np.where(host_b, lost_node, total[:, None]) * p).sum(axis=-1)  # [C]
    lost_after = lost_node[:, None, :] - lost_b + lost_a  # [C, G, K]
    count_after = count_node[:, None, :] - fits_b + fits_a
    total_after = total[:, None] - share + share_a  # [C, G]
    cpu_a = (cpu_free - fit.shape.cpu_milli)[:, None, None]
    hm_a = (hm_free - fit.shape.host_memory)[:, None, None]
    host_a = (count_after >= t.count) & (cpu_a >= t.cpu) & (hm_a >= t.hm)
    after = (np.where(host_a, lost_after, total_after[..., None]) * p).sum(axis=-1)
    return after - before[:, None]


def _frag_delta_whole(fleet: Fleet, fit: _Fit, rows: np.ndarray, chosen: np.ndarray,
                      workload: Workload | None) -> np.ndarray:
    """[C]: increase of expected fragmentation if the whole devices ``chosen`` ([C, G] bool) are taken."""
    shapes, p = _workload_vectors(workload, fit.shape)
    t = _types(fleet, shapes)
    mem_free, comp_free, slots_free, idle, share, cpu_free, hm_free = _dyn(fleet, rows)
    fits_b = _shape_fits(t, rows, mem_free, comp_free, slots_free, idle)
    before = _node_frag(fits_b, share, cpu_free, hm_free, t, p)
    fits_a = fits_b & ~chosen[..., None]  # a device held whole takes nothing more
    share_a = np.where(chosen, 0.0, share)
    after = _node_frag(fits_a, share_a, cpu_free - fit.shape.cpu_milli, hm_free - fit.shape.host_memory, t, p)
    return after - before


# ------------------------------------------------------------------------------------------ topology
def _topology_sets(fleet: Fleet, i: int, free: Sequence[int], count: int) -> tuple[tuple[int, ...], float]:
    """Best set of ``count`` idle devices on node i by topology, and its score 0..100.

    100: every pair NVLink-connected; 60 + 40·(linked pairs share): partial NVLink; same NUMA node adds
    up to 20 (capped at 100). Exhaustive over combinations when small, else greedy from each start.
    """
    devs = fleet.static[i]
    peers = [set(d.nvlink_peers) for d in devs]
    uuids = [d.uuid for d in devs]

    def score(group: Sequence[int]) -> float:
        pairs = list(itertools.combinations(group, 2))
        linked = sum(1 for a, b in pairs if uuids[b] in peers[a] or uuids[a] in peers[b])
        numas = {devs[k].numa_node for k in group}
        same_numa = len(numas) == 1 and None not in numas
        if pairs and linked == len(pairs):
            return 100.0
        return min(100.0, 40.0 * linked / max(1, len(pairs)) + (60.0 if same_numa else 0.0))

    if len(free) <= 10:
        candidates = itertools.combinations(free, count)
    else:  # greedy: grow a set from each start by the most connected next device
        candidates = []
        for start in free:
            group = [start]
            while len(group) < count:
                best = max((k for k in free if k not in group), key=lambda k: score(group + [k]))
                group.append(best)
            candidates.append(tuple(group))
    best_group, best_score = None, -1.0
    for group in candidates:
        s = score(group)
        if s > best_score:
            best_group, best_score = tuple(group), s
    assert best_group is not None
    return best_group, best_score


# ------------------------------------------------------------------------------------------ scoring
@dataclass
class _Scored:
    rows: np.ndarray  # [C] node rows that fit
    chosen: np.ndarray  # [C, G] bool, the devices chosen on each node
    score: np.ndarray  # [C] 0..100


def _rng(policy: PlacementPolicy, fleet: Fleet, rng: np.random.Generator | None) -> np.random.Generator:
    if rng is not None:
        return rng
    # Pure but not frozen: the same seed draws differently as the fleet's state changes.
    digest = [int(fleet.mem_used.sum()) % 2**63, int(fleet.comp_used.sum()), int(fleet.slots_used.sum()),
              int(fleet.cpu_used.sum()) % 2**63, fleet.version]
    return np.random.default_rng([policy.seed, *digest])


def _normalise_low_is_good(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    if high - low < 1e-12:
        return np.full(values.shape, 100.0)
    return 100.0 * (high - values) / (high - low)


def _score(request: Request, fleet: Fleet, policy: PlacementPolicy, workload: Workload | None,
           cpu_milli: int, host_memory: int, rng: np.random.Generator | None) -> tuple[_Fit, _Scored]:
    _check_request(request)
    if not isinstance(policy, PlacementPolicy):
        raise SpecError("policy", policy, "a PlacementPolicy")
    shape = TaskShape.of(request, cpu_milli, host_memory)
    fit = _fit(fleet, shape)
    rows = np.flatnonzero(fit.node_ok)
    width = fleet.width
    if rows.size == 0:
        return fit, _Scored(rows, np.zeros((0, width), bool), np.zeros(0))
    generator = None
    if "random" in (policy.node, policy.gpu):
        generator = _rng(policy, fleet, rng)
    dev_ok = fit.dev_ok[rows]
    need = fit.need[rows]
    cap = fleet.mem_cap[rows]
    delta = None  # [C] fragmentation increase of the chosen placement, when fgd needs it
    topo = np.full(rows.size, 100.0)

    if not shape.whole:
        # GPU level: a per-device preference (higher is better), masked to devices that fit.
        used_after = (fleet.mem_used[rows] + need) / cap
        comp_after = (fleet.comp_used[rows] + shape.compute) / 100.0
        if policy.gpu == "binpack":
            pref = used_after + comp_after
        elif policy.gpu == "spread":
            pref = -(used_after + comp_after)
        elif policy.gpu == "bestfit":  # least absolute memory left, then least compute left
            pref = -((cap - fleet.mem_used[rows] - need).astype(float) + (1.0 - comp_after) * 1e-3)
        elif policy.gpu == "fgd":
            frag = _frag_delta_shared(fleet, fit, rows, workload)
            pref = -frag
        else:
            assert generator is not None
            pref = generator.random(dev_ok.shape)
        pref = np.where(dev_ok, pref, -np.inf)
        pick = pref.argmax(axis=1)  # ties: lowest device index
        chosen = np.zeros(dev_ok.shape, bool)
        chosen[np.arange(rows.size), pick] = True
        if policy.node == "fgd":
            if policy.gpu == "fgd":
                delta = frag[np.arange(rows.size), pick]
            else:
                delta = _frag_delta_shared(fleet, fit, rows, workload)[np.arange(rows.size), pick]
        added_share = np.where(chosen, need / cap, 0.0)
    else:
        # Whole devices: order idle devices by the GPU policy, then take the first `count` (or the best
        # topology set where the node describes its topology).
        if policy.gpu == "bestfit":  # smallest device that holds the request
            key = cap.astype(float)
        elif policy.gpu == "random":
            assert generator is not None
            key = generator.random(dev_ok.shape)
        elif policy.gpu == "fgd":  # each device's own fragmentation cost when taken alone
            key = np.zeros(dev_ok.shape)
            for j in range(width):
                only = np.zeros(dev_ok.shape, bool)
                only[:, j] = True
                key[:, j] = _frag_delta_whole(fleet, fit, rows, only & dev_ok, workload)
        else:  # binpack / spread: all idle devices are alike; keep index order (stable, predictable)
            key = np.tile(np.arange(width, dtype=float), (rows.size, 1))
        key = np.where(dev_ok, key, np.inf)
        order = np.argsort(key, axis=1, kind="stable")[:, : shape.count]
        chosen = np.zeros(dev_ok.shape, bool)
        np.put_along_axis(chosen, order, True, axis=1)
        if policy.topology and shape.count > 1:
            for c in np.flatnonzero(fleet.has_topology[rows]):
                free = [int(j) for j in np.flatnonzero(dev_ok[c])]
                group, topo[c] = _topology_sets(fleet, int(rows[c]), free, shape.count)
                chosen[c] = False
                chosen[c, list(group)] = True
        if policy.node == "fgd":
            delta = _frag_delta_whole(fleet, fit, rows, chosen, workload)
        added_share = np.where(chosen, 1.0 - fleet.mem_used[rows] / cap, 0.0)

    # Node level: score 0..100 of the node with the chosen devices.
    devices = fleet.valid[rows].sum(axis=1)
    used = fleet.used_share()[rows]
    util_after = (used + added_share).sum(axis=1) / devices
    if policy.node == "binpack":
        score = 100.0 * util_after
    elif policy.node == "spread":
        score = 100.0 * (1.0 - util_after)
    elif policy.node == "bestfit":
        # Least remaining resources, a weighted sum over dimensions (as the FGD paper's Best-fit):
        # free devices' share normalised by the widest node, plus free CPU normalised by the largest node.
        gpu_left = devices - (used + added_share).sum(axis=1)
        remaining = gpu_left / max(1, fleet.valid.sum(axis=1).max())
        cpu_total = fleet.cpu_total[rows]
        tracked = cpu_total != UNTRACKED
        if tracked.any():
            biggest = max(1, int(fleet.cpu_total[fleet.cpu_total != UNTRACKED].max()))
            cpu_left = np.where(tracked, (cpu_total - fleet.cpu_used[rows] - cpu_milli) / biggest, 0.0)
            remaining = (remaining + cpu_left) / 2
        score = 100.0 * (1.0 - remaining)
    elif policy.node == "fgd":
        assert delta is not None
        score = _normalise_low_is_good(delta)
    else:
        assert generator is not None
        score = 100.0 * generator.random(rows.size)
    if policy.topology and shape.count > 1:
        score = (1 - policy.topology_weight) * score + policy.topology_weight * topo
    return fit, _Scored(rows, chosen, np.clip(score, 0.0, 100.0))


# ------------------------------------------------------------------------------------------ public
def place(request: Request, nodes: Nodes, policy: PlacementPolicy | None = None, *,
          workload: Workload | None = None, cpu_milli: int = 0, host_memory: int = 0,
          rng: np.random.Generator | None = None) -> Placement:
    """Choose the node and devices for ``request``; raise :class:`NoFit` with a reason if none fits.

    ``nodes`` is a list of :class:`NodeState` or a :class:`Fleet`. ``workload`` is the shape mix seen
    so far (used by ``fgd``). ``cpu_milli`` / ``host_memory`` are the task's node-level needs (checked
    only on nodes that track them). ``rng`` overrides the policy's seed for ``random`` (simulators pass
    one stream for a whole run).
    """
    fleet = _as_fleet(nodes)
    policy = policy or PlacementPolicy()
    fit, scored = _score(request, fleet, policy, workload, cpu_milli, host_memory, rng)
    if scored.rows.size == 0:
        raise NoFit(_why_not(fleet, fit))
    best = int(np.argmax(scored.score))  # ties: the first node in the caller's order
    i = int(scored.rows[best])
    slices = []
    for j in np.flatnonzero(scored.chosen[best]):
        device = fleet.static[i][int(j)]
        slices.append(Slice(device_uuid=device.uuid, memory_limit=int(fit.need[i, j]), compute=request.compute,
                            priority=request.priority, mode=request.mode, weight=request.weight))
    return Placement(node=fleet.names[i], slices=tuple(slices), score=float(scored.score[best]),
                     exclusive=fit.shape.whole)


def score_nodes(request: Request, nodes: Nodes, policy: PlacementPolicy | None = None, *,
                workload: Workload | None = None, cpu_milli: int = 0, host_memory: int = 0,
                rng: np.random.Generator | None = None) -> dict[str, float]:
    """Score 0..100 (higher is better) of every node that fits; nodes that do not fit are absent."""
    fleet = _as_fleet(nodes)
    _, scored = _score(request, fleet, policy or PlacementPolicy(), workload, cpu_milli, host_memory, rng)
    return {fleet.names[int(i)]: float(s) for i, s in zip(scored.rows, scored.score)}


def filter_nodes(request: Request, nodes: Nodes, *, cpu_milli: int = 0,
                 host_memory: int = 0) -> tuple[list[str], dict[str, str]]:
    """Split nodes into those that fit and a reason for each one that does not (the extender's filter)."""
    _check_request(request)
    fleet = _as_fleet(nodes)
    fit = _fit(fleet, TaskShape.of(request, cpu_milli, host_memory))
    fitting = [fleet.names[int(i)] for i in np.flatnonzero(fit.node_ok)]
    reasons = {fleet.names[int(i)]: _why_not_node(fleet, fit, int(i)) for i in np.flatnonzero(~fit.node_ok)}
    return fitting, reasons


def fits(request: Request, node: NodeState, *, cpu_milli: int = 0, host_memory: int = 0) -> bool:
    """Whether ``request`` fits on ``node`` (a one-node filter)."""
    return not filter_nodes(request, [node], cpu_milli=cpu_milli, host_memory=host_memory)[1]


# ------------------------------------------------------------------------------------------ reasons
def _need_text(fit: _Fit, i: int, j: int | None = None) -> str:
    shape = fit.shape
    if shape.memory is None:
        mem = "whole memory"
    elif shape.memory.bytes is not None:
        mem = human_bytes(shape.memory.bytes)
    else:
        mem = f"{shape.memory.percent:g}% of memory"
        if j is not None:
            mem += f" ({human_bytes(int(fit.need[i, j]))})"
    per = f"{shape.count} idle device(s)" if shape.whole else "1 device"
    extra = f", compute {shape.compute}%" if shape.compute else ""
    return f"needs {mem}{extra} on {per}"


def _why_not_node(fleet: Fleet, fit: _Fit, i: int) -> str:
    shape = fit.shape
    node = fleet.names[i]
    if fleet.cpu_total[i] != UNTRACKED and fleet.cpu_total[i] - fleet.cpu_used[i] < shape.cpu_milli:
        return f"CPU: needs {shape.cpu_milli}m, {int(fleet.cpu_total[i] - fleet.cpu_used[i])}m free"
    if fleet.hm_total[i] != UNTRACKED and fleet.hm_total[i] - fleet.hm_used[i] < shape.host_memory:
        return f"host memory: needs {human_bytes(shape.host_memory)}, " \
               f"{human_bytes(int(fleet.hm_total[i] - fleet.hm_used[i]))} free"
    model_ok = _model_mask(fleet, shape.models)[i]
    if not model_ok.any():
        present = sorted({d.model for d in fleet.static[i]}) or ["none"]
        return f"no device of model {'|'.join(shape.models)} (has {', '.join(present)})"
    if shape.whole:
        idle = int(fit.dev_ok[i].sum())
        return f"{_need_text(fit, i)}; {idle} idle device(s) of a matching model"
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


def _why_not(fleet: Fleet, fit: _Fit) -> str:
    shape = fit.shape
    if len(fleet) == 0:
        return "no nodes to place on"
    model_ok = _model_mask(fleet, shape.models)
    if not model_ok.any():
        models = sorted({k.model for k in fleet.kinds})
        return f"no device of model {'|'.join(shape.models)} on any node (models present: {', '.join(models)})"
    free = np.where(model_ok & ~fleet.excl & (fleet.slots_used < fleet.split), fleet.mem_cap - fleet.mem_used, -1)
    i, j = np.unravel_index(int(np.argmax(free)), free.shape)
    where = f"on {fleet.static[i][j].uuid} (node {fleet.names[i]})" if free[i, j] >= 0 else "anywhere"
    if shape.whole:
        idle = (model_ok & (fleet.slots_used == 0) & ~fleet.excl).sum(axis=1)
        k = int(np.argmax(idle))
        return (f"{_need_text(fit, int(i))}; most idle matching devices on one node is {int(idle[k])} "
                f"(node {fleet.names[k]})")
    text = f"{_need_text(fit, int(i), int(j))}; largest free is {human_bytes(max(0, int(free[i, j])))} {where}"
    room = (model_ok & (fleet.mem_cap - fleet.mem_used >= fit.need)).any()
    if room and not fit.dev_ok.any():
        text += "; devices with that memory lack compute or slice slots"
    elif fit.dev_ok.any():
        text += "; devices fit but no node has the CPU / host memory"
    return text


__all__ = ["place", "score_nodes", "filter_nodes", "fits", "Nodes"]
