"""Fit and score: the one place that decides which devices serve a request.

See the package docstring (``gpuslice.placement``) for the rules and the fragmentation formula.
"""

from __future__ import annotations

import hashlib
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


def _static(fleet: Fleet, key: tuple, make) -> np.ndarray:
    """Arrays that depend only on the fleet's devices (per memory amount, per model list): built once."""
    value = fleet._static_cache.get(key)
    if value is None:
        if len(fleet._static_cache) > 256:
            fleet._static_cache.clear()
        value = fleet._static_cache[key] = make()
    return value


def _model_mask(fleet: Fleet, models: Sequence[str]) -> np.ndarray:
    """[N, G] True where the device's model is allowed (kinds are few, so test each kind once)."""
    if not models:
        return fleet.valid

    def make() -> np.ndarray:
        allowed = np.array([k.matches(models) for k in fleet.kinds] or [False], bool)
        return fleet.valid & allowed[fleet.kind]
    return _static(fleet, ("models", tuple(models)), make)


def _memory_need(fleet: Fleet, shape: TaskShape) -> np.ndarray:
    """[N, G] bytes the request needs on each device: percent resolves per device, None = whole memory."""
    memory = shape.memory
    if memory is None:
        return fleet.mem_total
    if memory.bytes is not None:
        return _static(fleet, ("bytes", memory.bytes),
                       lambda: np.full(fleet.mem_total.shape, memory.bytes, np.int64))
    # Same rounding as MemoryAmount.resolve (floor), so the slices we emit equal what a caller resolves.
    return _static(fleet, ("percent", memory.percent),
                   lambda: (fleet.mem_total * memory.percent // 100).astype(np.int64))


@dataclass
class _Fit:
    shape: TaskShape
    need: np.ndarray  # [N, G] bytes per device
    dev_ok: np.ndarray  # [N, G] device can take (its part of) the request
    node_ok: np.ndarray  # [N]


def _whole_cap(fleet: Fleet) -> np.ndarray:
    """[N, G] the memory a grant holding the device whole may have (DeviceState.whole_capacity)."""
    return _static(fleet, ("whole_cap",), lambda: np.maximum(fleet.mem_cap, fleet.mem_total))


def _usable_count(fleet: Fleet, dev_ok: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """[N] (or [C] for ``rows``) how many of the ok devices one multi-device request can use together:
    every whole GPU, and at most one MIG instance per card."""
    counts = dev_ok.sum(axis=1)
    mig = fleet.has_mig if rows is None else fleet.has_mig[rows]
    for c in np.flatnonzero(mig & (counts > 1)):
        i = int(c if rows is None else rows[c])
        parents = fleet.parent[i][dev_ok[c]]
        counts[c] = int((parents < 0).sum()) + len(set(parents[parents >= 0].tolist()))
    return counts


def _fit(fleet: Fleet, shape: TaskShape) -> _Fit:
    need = _memory_need(fleet, shape)
    model_ok = _model_mask(fleet, shape.models)
    if shape.whole:
        dev_ok = model_ok & (fleet.slots_used == 0) & ~fleet.excl & (need <= _whole_cap(fleet))
    else:
        dev_ok = (model_ok & ~fleet.excl & (fleet.slots_used < fleet.split)
                  & (fleet.mem_cap - fleet.mem_used >= need) & (100 - fleet.comp_used >= shape.compute))
    node_ok = dev_ok.any(axis=1) if shape.count <= 1 else _usable_count(fleet, dev_ok) >= shape.count
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
    model_ok = model_ok & ~(whole & (need > _whole_cap(fleet)[..., None]))
    types = _Types(shapes, need, model_ok, whole,
                   np.array([s.count for s in shapes]), np.array([s.compute for s in shapes]),
                   np.array([s.cpu_milli for s in shapes]), np.array([s.host_memory for s in shapes]))
    if len(fleet._type_cache) > 8:  # workloads drift; keep the few most recent
        fleet._type_cache.clear()
        fleet._frag_cache.clear()
    fleet._type_cache[shapes] = types
    return types


def _workload_vectors(workload: Workload | None, shape: TaskShape) -> tuple[tuple[TaskShape, ...], np.ndarray]:
    """The shapes FGD weighs and their weights. The shapes tuple keys the caches: callers that keep a
    workload (``Workload.observe`` keeps first-seen order) hit them call after call."""
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
    # A shape with count 0 (a CPU-only task) uses no device, so all of a node's free share counts as lost
    # to it, whatever the node's CPU (FGD's frag.go: XL and XR alike count every free GPU milli). That
    # term is the same for every candidate placement of a GPU task, so it steers nothing. (It once
    # counted as "fits everywhere unless the node's CPU is short", a CPU-exhaustion penalty the paper
    # does not have; it cost 0.3–1 point of allocation on the gpushare traces.)
    return np.where(t.whole, idle[..., None], shared) & t.model_ok[rows] & (t.count > 0)


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


def _usable_counts(fleet: Fleet, i: int, fits: np.ndarray) -> np.ndarray:
    """[K]: for node row i, how many devices one task of each shape could use together, given which
    devices can take it (``fits`` [G, K]): every whole GPU, and at most one MIG instance per card
    (the rule of :func:`_usable_count`, per shape). Only rows with MIG instances need it."""
    parent = fleet.parent[i]
    counts = fits[parent < 0].sum(axis=0)
    for card in np.unique(parent[parent >= 0]):
        counts = counts + fits[parent == card].any(axis=0)
    return counts


def _usable_after(fleet: Fleet, i: int, fits: np.ndarray, at, values) -> np.ndarray:
    """:func:`_usable_counts` of node row i once the devices ``at`` fit as ``values`` ([G, K] ``fits``
    is left as it is)."""
    after = fits.copy()
    after[at] = values
    return _usable_counts(fleet, i, after)


class _Terms:
    """Per-shape fragmentation terms of every node, kept current row by row (``Fleet.row_version``).

    ``fits``/``lost`` [N, G, K]: can device g take shape k, and the free share it loses to k;
    ``lost_node``/``count`` [N, K] their sums; ``frag`` [N, K] = F_n(k) of the package docstring.
    ``deltas`` caches, per request shape, [N, G, K] = F_n(k) after placing it on device g − before.
    """

    def __init__(self, fleet: Fleet, t: _Types):
        n, g, k = t.need.shape
        self.t = t
        self.seen = np.full(n, -1, np.int64)
        self.fits = np.zeros((n, g, k), bool)
        self.lost = np.zeros((n, g, k))
        self.share = np.zeros((n, g))
        self.lost_node = np.zeros((n, k))
        self.count = np.zeros((n, k), np.int64)
        self.frag = np.zeros((n, k))
        self.total_share = np.zeros(n)
        self.deltas: dict[TaskShape, tuple[np.ndarray, np.ndarray]] = {}
        self.wholes: dict[TaskShape, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def refresh(self, fleet: Fleet, rows: np.ndarray) -> None:
        dirty = rows[self.seen[rows] != fleet.row_version[rows]]
        if dirty.size == 0:
            return
        t = self.t
        mem_free, comp_free, slots_free, idle, share, cpu_free, hm_free = _dyn(fleet, dirty)
        fits = _shape_fits(t, dirty, mem_free, comp_free, slots_free, idle)
        lost = share[..., None] * ~fits
        lost_node = lost.sum(axis=1)
        count = fits.sum(axis=1)
        for c in np.flatnonzero(fleet.has_mig[dirty]):  # MIG instances of one card count once
            count[c] = _usable_counts(fleet, int(dirty[c]), fits[c])
        host = (count >= t.count) & (cpu_free[:, None] >= t.cpu) & (hm_free[:, None] >= t.hm)
        self.fits[dirty], self.lost[dirty], self.share[dirty] = fits, lost, share
        self.lost_node[dirty], self.count[dirty] = lost_node, count
        total = share.sum(axis=1)
        self.total_share[dirty] = total
        self.frag[dirty] = np.where(host, lost_node, total[:, None])
        self.seen[dirty] = fleet.row_version[dirty]

    def total(self, rows: np.ndarray, every: bool) -> np.ndarray:
        return self.total_share if every else self.total_share[rows]

    def shared_delta(self, fleet: Fleet, fit: _Fit, rows: np.ndarray, p: np.ndarray) -> np.ndarray:
        """[C, G]: change of F_n = Σ_k p_k F_n(k) if the one-device request goes on device g of each row.

        Only device g (and the node's CPU) change, so the node's sums are updated by g's before/after
        terms; rows unchanged since the last call for this request shape are served from the cache.
        """
        t = self.t
        n, g, k = t.need.shape
        entry = self.deltas.get(fit.shape)
        if entry is None:
            if len(self.deltas) > 64:
                self.deltas.clear()
            entry = (np.full(n, -1, np.int64), np.zeros((n, g, k)))
            self.deltas[fit.shape] = entry
        seen, delta = entry
        dirty = rows[seen[rows] != fleet.row_version[rows]]
        if dirty.size:
            mem_free, comp_free, slots_free, idle, share, cpu_free, hm_free = _dyn(fleet, dirty)
            mem_a = mem_free - fit.need[dirty]
            share_a = mem_a / fleet.mem_cap[dirty]
            fits_a = _shape_fits(t, dirty, mem_a, comp_free - fit.shape.compute, slots_free - 1,
                                 np.zeros_like(idle))
            fits_b = self.fits[dirty]
            lost_after = self.lost_node[dirty][:, None, :] - self.lost[dirty] + share_a[..., None] * ~fits_a
            count_after = self.count[dirty][:, None, :] - fits_b + fits_a
            for c in np.flatnonzero(fleet.has_mig[dirty]):
                i = int(dirty[c])
                for j in range(g):  # device j takes the slice: recount with its new fit
                    count_after[c, j] = _usable_after(fleet, i, fits_b[c], j, fits_a[c, j])
            total_after = share.sum(axis=1)[:, None] - share + share_a
            cpu_a = (cpu_free - fit.shape.cpu_milli)[:, None, None]
            hm_a = (hm_free - fit.shape.host_memory)[:, None, None]
            host_a = (count_after >= t.count) & (cpu_a >= t.cpu) & (hm_a >= t.hm)
            after = np.where(host_a, lost_after, total_after[..., None])
            delta[dirty] = after - self.frag[dirty][:, None, :]
            seen[dirty] = fleet.row_version[dirty]
        # Weigh the whole cached array (one matrix-vector product) rather than copying the rows out first.
        weighed = _weigh(delta, p)
        return weighed if rows.size == n else weighed[rows]

    def whole_delta(self, fleet: Fleet, fit: _Fit, rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
        """[C, K]: change of F_n(k) if the idle devices ``picked`` ([C, count] indices) are taken whole."""
        t = self.t
        every = rows.size == len(self.seen)

        def sel(array: np.ndarray) -> np.ndarray:
            return array if every else array[rows]
        # Gather the picked devices' terms ([C, count, K]) rather than masking every device.
        if picked.shape[1] == 1:  # the common case: one index per row, a plain pairwise gather
            at1 = (rows, picked[:, 0])
            lost_taken, fits_taken, share_taken = self.lost[at1], self.fits[at1], self.share[at1]
        else:
            at = (rows[:, None], picked)
            lost_taken, fits_taken = self.lost[at].sum(axis=1), self.fits[at].sum(axis=1)
            share_taken = self.share[at].sum(axis=1)
        lost_after = sel(self.lost_node) - lost_taken
        count_after = sel(self.count) - fits_taken
        for c in np.flatnonzero(fleet.has_mig[rows]):
            i = int(rows[c])
            count_after[c] = _usable_after(fleet, i, self.fits[i], picked[c], False)
        total_after = self.total(rows, every) - share_taken
        cpu_a = (sel(fleet.cpu_total) - sel(fleet.cpu_used) - fit.shape.cpu_milli)[:, None]
        hm_a = (sel(fleet.hm_total) - sel(fleet.hm_used) - fit.shape.host_memory)[:, None]
        host_a = (count_after >= t.count) & (cpu_a >= t.cpu) & (hm_a >= t.hm)
        after = np.where(host_a, lost_after, total_after[:, None])
        return after - sel(self.frag)


    def whole_weighed(self, fleet: Fleet, fit: _Fit, rows: np.ndarray, picked: np.ndarray,
                      p: np.ndarray) -> np.ndarray:
        """[C]: Σ_k p_k · :meth:`whole_delta`, with the per-shape terms kept per request shape and
        recomputed only for rows that changed (or whose picked devices changed) since the last call:
        whole-device requests are the commonest on openb, and recomputing [N, K] for every node on every
        call was the largest part of fgd's latency at 5,000 nodes. The weighing itself runs over the
        whole kept array, so a kept fleet and a fresh one round alike."""
        n, _, k = self.t.need.shape
        entry = self.wholes.get(fit.shape)
        if entry is None or entry[1].shape[1] != picked.shape[1]:
            if len(self.wholes) > 16:
                self.wholes.clear()
            entry = (np.full(n, -1, np.int64), np.full((n, picked.shape[1]), -1, np.int64), np.zeros((n, k)))
            self.wholes[fit.shape] = entry
        seen, seen_picked, delta = entry
        stale = np.flatnonzero((seen[rows] != fleet.row_version[rows]) | (seen_picked[rows] != picked).any(axis=1))
        if stale.size:
            dirty = rows[stale]
            delta[dirty] = self.whole_delta(fleet, fit, dirty, picked[stale])
            seen[dirty] = fleet.row_version[dirty]
            seen_picked[dirty] = picked[stale]
        weighed = _weigh(delta, p)
        return weighed if rows.size == n else weighed[rows]

    def shared_set_delta(self, fleet: Fleet, fit: _Fit, rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
        """[C, K]: change of F_n(k) if one slice goes on each device ``picked`` ([C, count], distinct)."""
        t = self.t
        at = (rows[:, None], picked)
        excl = fleet.excl[at] | ~fleet.valid[at]
        mem_a = np.where(excl, 0, fleet.mem_cap[at] - fleet.mem_used[at]) - fit.need[at]
        comp_a = np.where(excl, 0, 100 - fleet.comp_used[at]) - fit.shape.compute
        slots_a = np.where(excl, 0, fleet.split[at] - fleet.slots_used[at]) - 1
        share_a = mem_a / fleet.mem_cap[at]
        fits_a = _shape_fits(t, at, mem_a, comp_a, slots_a, np.zeros(mem_a.shape, bool))
        lost_after = self.lost_node[rows] - self.lost[at].sum(axis=1) + (share_a[..., None] * ~fits_a).sum(axis=1)
        count_after = self.count[rows] - self.fits[at].sum(axis=1) + fits_a.sum(axis=1)
        for c in np.flatnonzero(fleet.has_mig[rows]):
            i = int(rows[c])
            count_after[c] = _usable_after(fleet, i, self.fits[i], picked[c], fits_a[c])
        total_after = self.total_share[rows] - self.share[at].sum(axis=1) + share_a.sum(axis=1)
        cpu_a = (fleet.cpu_total[rows] - fleet.cpu_used[rows] - fit.shape.cpu_milli)[:, None]
        hm_a = (fleet.hm_total[rows] - fleet.hm_used[rows] - fit.shape.host_memory)[:, None]
        host_a = (count_after >= t.count) & (cpu_a >= t.cpu) & (hm_a >= t.hm)
        after = np.where(host_a, lost_after, total_after[:, None])
        return after - self.frag[rows]


def _terms(fleet: Fleet, workload: Workload | None, fit: _Fit, rows: np.ndarray) -> tuple[_Terms, np.ndarray]:
    shapes, p = _workload_vectors(workload, fit.shape)
    t = _types(fleet, shapes)
    terms = fleet._frag_cache.get(shapes)
    if terms is None:
        terms = fleet._frag_cache[shapes] = _Terms(fleet, t)
    terms.refresh(fleet, rows)
    return terms, p


def _weigh(delta_k: np.ndarray, p: np.ndarray) -> np.ndarray:
    # Rounded (to 1e-9, in place) so that equal states tie exactly whatever order the dot product
    # summed in.
    out = delta_k @ p
    out *= 1e9
    np.rint(out, out=out)
    out /= 1e9
    return out


# ------------------------------------------------------------------------------------------ topology
def _topology_score(fleet: Fleet, i: int, group: Sequence[int]) -> float:
    """Topology score 0..100 of devices ``group`` of node i: 100 when every pair is NVLink-connected,
    else 40 × (share of linked pairs) + 60 if all are on one NUMA node."""
    devs = fleet.static[i]
    pairs = list(itertools.combinations(group, 2))
    linked = sum(1 for a, b in pairs
                 if devs[b].uuid in devs[a].nvlink_peers or devs[a].uuid in devs[b].nvlink_peers)
    numas = {devs[k].numa_node for k in group}
    same_numa = len(numas) == 1 and None not in numas
    if pairs and linked == len(pairs):
        return 100.0
    return min(100.0, 40.0 * linked / max(1, len(pairs)) + (60.0 if same_numa else 0.0))


def _topology_sets(fleet: Fleet, i: int, ranked: Sequence[int], count: int) -> tuple[tuple[int, ...], float]:
    """Best set of ``count`` of the devices ``ranked`` (node i's usable devices, most preferred by the
    GPU policy first) by :func:`_topology_score`, and its score. Among sets that score alike, the one
    whose members come earliest in ``ranked`` wins: topology decides first, the GPU policy next.

    Exhaustive over combinations when there are at most 10 candidates, else greedy from each start
    (grow by the device that scores best with the group). Never two MIG instances of one card.
    Memoised per (node topology, ranked, count): nodes of one build in one state ask the same question,
    and a scheduler asks it for every fitting node on every multi-device request.
    """
    sig = fleet._topology_rows.get(i)
    if sig is None:
        devs = fleet.static[i]
        index = {d.uuid: j for j, d in enumerate(devs)}
        layout = tuple((d.numa_node, tuple(sorted(index[u] for u in d.nvlink_peers if u in index)),
                        int(fleet.parent[i, j])) for j, d in enumerate(devs))
        sig = fleet._topology_rows[i] = fleet._topology_ids.setdefault(layout, len(fleet._topology_ids))
    key = (sig, tuple(ranked), count)
    found = fleet._topology_memo.get(key)
    if found is not None:
        return found
    parent = fleet.parent[i]

    def distinct(group: Sequence[int]) -> bool:
        cards = [int(parent[k]) for k in group if parent[k] >= 0]
        return len(cards) == len(set(cards))

    if len(ranked) <= 10:
        candidates = [g for g in itertools.combinations(ranked, count) if distinct(g)]
    else:
        candidates = []
        for start in ranked:
            group = [start]
            while len(group) < count:
                options = [k for k in ranked if k not in group and distinct(group + [k])]
                if not options:
                    break
                group.append(max(options, key=lambda k: _topology_score(fleet, i, group + [k])))
            if len(group) == count:
                candidates.append(tuple(group))
    best_group, best_score = None, -1.0
    for group in candidates:  # in preference order: a strictly better score is needed to move on
        s = _topology_score(fleet, i, group)
        if s > best_score:
            best_group, best_score = tuple(group), s
    assert best_group is not None, "the fit guaranteed enough usable devices"
    if len(fleet._topology_memo) > 4096:
        fleet._topology_memo.clear()
    fleet._topology_memo[key] = (best_group, best_score)
    return best_group, best_score


def _topology_pick(fleet: Fleet, rows: np.ndarray, report: np.ndarray, dev_ok: np.ndarray, order: np.ndarray,
                   picked: np.ndarray, count: int) -> np.ndarray:
    """On nodes that describe their topology (and are reported), replace the ``picked`` devices
    ([C, count], changed in place) by the best-connected set of ``count`` usable devices, ties going to
    the GPU policy's ``order`` ([C, G], best first). Returns the topology score of each row's set
    (100 where the node describes no topology: nothing to prefer there)."""
    topo = np.full(rows.size, 100.0)
    for c in np.flatnonzero(fleet.has_topology[rows] & report):
        ranked = [int(j) for j in order[c] if dev_ok[c, j]]
        group, topo[c] = _topology_sets(fleet, int(rows[c]), ranked, count)
        picked[c] = sorted(group)
    return topo


def _pick_distinct(fleet: Fleet, rows: np.ndarray, dev_ok: np.ndarray, order: np.ndarray,
                   count: int) -> np.ndarray:
    """[C, count]: the first ``count`` ok devices of each row's ``order`` ([C, G], best first), skipping a
    second MIG instance of a card already picked (only rows with MIG instances need the walk)."""
    picked = order[:, :count].copy()
    for c in np.flatnonzero(fleet.has_mig[rows]):
        parent = fleet.parent[int(rows[c])]
        taken: list[int] = []
        cards: set[int] = set()
        for j in order[c]:
            if not dev_ok[c, j]:
                continue
            if parent[j] >= 0:
                if int(parent[j]) in cards:
                    continue
                cards.add(int(parent[j]))
            taken.append(int(j))
            if len(taken) == count:
                break
        if len(taken) == count:  # rows that do not fit (scored anyway) keep their plain order
            picked[c] = taken
    return picked


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


def _fgd_points(delta: np.ndarray) -> np.ndarray:
    """FGD's 0..99 integer score of a fragmentation change ``delta`` (devices' worth; > 0 = more
    fragmentation): ⌊100 · σ(−ΔF)⌋, the scale of the FGD authors' score plugin (kube-scheduler scores
    are integers). Changes within one step (≈ 0.04 of a device near 0) tie, and so do all large
    increases; ties are then broken by :func:`_node_order`, which consolidates load. Exact ΔF with a
    fullest-node tie-break allocated 0.3–0.6 points less on five openb traces."""
    return np.floor(100.0 / (1.0 + np.exp(np.clip(delta, -50.0, 50.0))))


def _node_order(fleet: Fleet, rows: np.ndarray, seed: int) -> np.ndarray:
    """[C] a stable pseudo-random rank in [0, 1) of each node (hash of the seed and the node's name):
    FGD's ties go to the node ranked highest, the same node every time, so equal-score placements
    pile onto the same nodes (first fit in a fixed random order) and leave the others whole. Stateless,
    so a scheduler extender or agent ranks a node alike on every call."""
    def make() -> np.ndarray:
        out = np.empty(len(fleet))
        for i, name in enumerate(fleet.names):
            digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
            out[i] = int.from_bytes(digest, "big") / 2.0 ** 64
        return out
    return _static(fleet, ("fgd-order", seed), make)[rows]


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
    # When most nodes fit, score every node on the arrays as they are (no fancy-index copies) and drop
    # the others at the end; when few fit, copy out just those rows.
    fitting = rows
    everything = rows.size * 2 > len(fleet)
    if everything:
        rows = np.arange(len(fleet))
    keep = fit.node_ok[rows]  # rows to report; the others are scored only because it is cheaper

    def take(array: np.ndarray) -> np.ndarray:
        return array if everything else array[rows]

    generator = _rng(policy, fleet, rng) if "random" in (policy.node, policy.gpu) else None
    uses_fgd = "fgd" in (policy.node, policy.gpu)
    terms, p = _terms(fleet, workload, fit, rows) if uses_fgd else (None, None)
    dev_ok = take(fit.dev_ok)
    need = take(fit.need)
    cap = take(fleet.mem_cap)
    mem_used = take(fleet.mem_used)
    delta = None  # [C] fragmentation increase of the chosen placement, when fgd needs it
    topo = None
    arange = np.arange(rows.size)

    if not shape.whole:
        # GPU level: a per-device preference (higher is better), masked to devices that fit.
        frag = None
        if uses_fgd:
            assert terms is not None and p is not None
            frag = terms.shared_delta(fleet, fit, rows, p)
        if policy.gpu in ("binpack", "spread"):
            pref = (mem_used + need) / cap + (take(fleet.comp_used) + shape.compute) / 100.0
            if policy.gpu == "spread":
                pref = -pref
        elif policy.gpu == "bestfit":  # least absolute memory left, then least compute left
            pref = -((cap - mem_used - need) + (100 - take(fleet.comp_used) - shape.compute) * 1e-3)
        elif policy.gpu == "fgd":
            pref = _fgd_points(frag)  # equal points: the lowest device index, as the authors' plugin
        else:
            assert generator is not None
            pref = generator.random(dev_ok.shape)
        chosen = np.zeros(dev_ok.shape, bool)
        if shape.count == 1:
            pick = np.where(dev_ok, pref, -np.inf).argmax(axis=1)  # ties: lowest device index
            chosen[arange, pick] = True
            if policy.node == "fgd":
                assert frag is not None
                delta = frag[arange, pick]
            added = need[arange, pick] / cap[arange, pick]  # devices' worth the chosen slice adds to its node
        else:
            # Several shared slices on distinct devices: the `count` devices the GPU policy likes best, or,
            # where the node describes its topology, the best-connected set (the GPU policy breaks ties):
            # the slices of one grant talk to each other, so NVLink / one NUMA node matter as for whole GPUs.
            order = np.argsort(np.where(dev_ok, -pref, np.inf), axis=1, kind="stable")
            picked = _pick_distinct(fleet, rows, dev_ok, order, shape.count)
            if policy.topology:
                topo = _topology_pick(fleet, rows, keep, dev_ok, order, picked, shape.count)
            np.put_along_axis(chosen, picked, True, axis=1)
            if policy.node == "fgd":
                assert terms is not None and p is not None
                delta = _weigh(terms.shared_set_delta(fleet, fit, rows, picked), p)
            added = (np.take_along_axis(need, picked, axis=1) / np.take_along_axis(cap, picked, axis=1)).sum(axis=1)
    else:
        # Whole devices: order idle devices by the GPU policy, then take the first `count` (or the best
        # topology set where the node describes its topology).
        if policy.gpu == "bestfit":  # smallest device that holds the request
            key = cap.astype(float)
        elif policy.gpu == "random":
            assert generator is not None
            key = generator.random(dev_ok.shape)
        elif policy.gpu == "fgd" and terms is not None and p is not None and fleet.mixed[rows].any():
            # Take first the idle devices least useful to the workload (fewest shapes they could host).
            # Idle devices of one kind are alike, so only nodes mixing kinds need it.
            key = np.broadcast_to(np.arange(width, dtype=float), dev_ok.shape).copy()
            mixed = np.flatnonzero(fleet.mixed[rows])
            key[mixed] = terms.fits[rows[mixed]] @ p
        else:  # binpack / spread: all idle devices are alike; keep index order (stable, predictable)
            key = np.broadcast_to(np.arange(width, dtype=float), dev_ok.shape)
        key = np.where(dev_ok, key, np.inf)
        if shape.count == 1:
            picked = key.argmin(axis=1)[:, None]
        else:
            order = np.argsort(key, axis=1, kind="stable")
            picked = _pick_distinct(fleet, rows, dev_ok, order, shape.count)
            if policy.topology:
                topo = _topology_pick(fleet, rows, keep, dev_ok, order, picked, shape.count)
        chosen = np.zeros(dev_ok.shape, bool)
        np.put_along_axis(chosen, picked, True, axis=1)
        if policy.node == "fgd":
            assert terms is not None and p is not None
            delta = terms.whole_weighed(fleet, fit, rows, picked, p)
        added = float(shape.count)  # whole idle devices: each adds one device's worth

    # Node level: score 0..100 of the node with the chosen devices.
    if policy.node in ("binpack", "spread", "bestfit", "fgd"):
        devices = take(fleet.n_devices)
        after = take(fleet.used_sum()) + added
    if policy.node == "binpack":
        score = 100.0 * after / devices
    elif policy.node == "spread":
        score = 100.0 * (1.0 - after / devices)
    elif policy.node in ("bestfit", "fgd"):
        # Least remaining resources, a weighted sum over dimensions (as the FGD paper's Best-fit):
        # free devices' share normalised by the widest node, plus free CPU normalised by the largest.
        remaining = (devices - after) / max(1, width)
        cpu_total = take(fleet.cpu_total)
        tracked = cpu_total != UNTRACKED
        if tracked.any():
            biggest = max(1, int(fleet.cpu_total[fleet.cpu_total != UNTRACKED].max()))
            cpu_left = np.where(tracked, (cpu_total - take(fleet.cpu_used) - cpu_milli) / biggest, 0.0)
            remaining = (remaining + cpu_left) / 2
        if policy.node == "bestfit":
            score = 100.0 * (1.0 - remaining)
        else:
            assert delta is not None
            # Integer points of ΔF (ties within ≈ 0.04 device), then the node's fixed rank: equal scores
            # go to the same nodes every time. Random ties instead cost ~5 points on openb's default
            # trace (8-GPU tasks find no whole node); the fullest-node tie-break used before, 0.3–0.6.
            score = _fgd_points(delta) + 0.5 * _node_order(fleet, rows, policy.seed)
    else:
        assert generator is not None
        score = 100.0 * generator.random(fitting.size)
    if everything:
        chosen, score = chosen[keep], (score if policy.node == "random" else score[keep])
        topo = None if topo is None else topo[keep]
    if topo is not None:
        score = (1 - policy.topology_weight) * score + policy.topology_weight * topo
    return fit, _Scored(fitting, chosen, np.clip(score, 0.0, 100.0))


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
    return dict(zip(fleet.name_array[scored.rows].tolist(), scored.score.tolist()))


def filter_nodes(request: Request, nodes: Nodes, *, cpu_milli: int = 0,
                 host_memory: int = 0) -> tuple[list[str], dict[str, str]]:
    """Split nodes into those that fit and a reason for each one that does not (the extender's filter)."""
    _check_request(request)
    fleet = _as_fleet(nodes)
    fit = _fit(fleet, TaskShape.of(request, cpu_milli, host_memory))
    fitting = [fleet.names[int(i)] for i in np.flatnonzero(fit.node_ok)]
    reasons = {fleet.names[int(i)]: _why_not_node(fleet, fit, int(i)) for i in np.flatnonzero(~fit.node_ok)}
    return fitting, reasons


def place_host(nodes: Nodes, policy: PlacementPolicy | None = None, *, cpu_milli: int, host_memory: int = 0,
               workload: Workload | None = None, rng: np.random.Generator | None = None) -> str:
    """The node for a task that needs no device, only CPU and host memory (the simulator's CPU-only
    tasks; in Kubernetes the scheduler places those itself). Raises :class:`NoFit`.

    ``fgd``: the CPU a task takes can leave a node's GPUs unusable (no CPU left for GPU tasks), so the
    node whose expected fragmentation rises least wins; ``binpack`` prefers the node whose GPUs are
    fullest (then least CPU left), ``spread`` the emptiest, ``bestfit`` the least remaining GPU + CPU
    (the same weighted sum as for GPU tasks); ``random`` is uniform. The ``gpu`` level does not apply.
    """
    fleet = _as_fleet(nodes)
    policy = policy or PlacementPolicy()
    if cpu_milli < 0 or host_memory < 0:
        raise SpecError("cpu_milli", cpu_milli, "a CPU and host memory need of at least 0")
    cpu_free = fleet.cpu_total - fleet.cpu_used
    hm_free = fleet.hm_total - fleet.hm_used
    rows = np.flatnonzero((cpu_free >= cpu_milli) & (hm_free >= host_memory))
    if rows.size == 0:
        best = int(np.argmax(cpu_free)) if len(fleet) else -1
        where = f"; most free CPU is {int(cpu_free[best])}m on node {fleet.names[best]}" if best >= 0 else ""
        raise NoFit(f"needs {cpu_milli}m CPU and {human_bytes(host_memory)} host memory on one node{where}")
    tracked = fleet.cpu_total[rows] != UNTRACKED
    biggest = max(1, int(fleet.cpu_total[fleet.cpu_total != UNTRACKED].max())) if tracked.any() else 1
    cpu_left = np.where(tracked, (cpu_free[rows] - cpu_milli) / biggest, 1.0)
    valid = fleet.valid[rows]
    devices = valid.sum(axis=1)
    used = (fleet.used_share()[rows]).sum(axis=1)
    # Nodes without devices count as full: a CPU task strands no GPU there.
    gpu_util = np.where(devices > 0, used / np.maximum(devices, 1), 1.0)
    gpu_left = (devices - used) / max(1, fleet.width)
    if policy.node == "binpack":  # where GPUs are fullest (a CPU task there strands none), then least CPU
        score = gpu_util - 1e-3 * cpu_left
    elif policy.node == "spread":
        score = -gpu_util + 1e-3 * cpu_left
    elif policy.node == "bestfit":  # least remaining resources, the same weighted sum as for GPU tasks
        score = -(gpu_left + cpu_left) / 2
    elif policy.node == "fgd":
        shape = TaskShape(cpu_milli=cpu_milli, host_memory=host_memory)
        shapes, p = _workload_vectors(workload, shape)
        if workload is None or not workload.counts:
            score = -(gpu_left + cpu_left) / 2  # nothing to protect yet: best fit
        else:
            t = _types(fleet, shapes)
            terms = fleet._frag_cache.get(shapes)
            if terms is None:
                terms = fleet._frag_cache[shapes] = _Terms(fleet, t)
            terms.refresh(fleet, rows)
            cpu_a = (cpu_free[rows] - cpu_milli)[:, None]
            hm_a = (hm_free[rows] - host_memory)[:, None]
            host_a = (terms.count[rows] >= t.count) & (cpu_a >= t.cpu) & (hm_a >= t.hm)
            after = np.where(host_a, terms.lost_node[rows], terms.share[rows].sum(axis=1)[:, None])
            score = _fgd_points(_weigh(after - terms.frag[rows], p)) + 0.5 * _node_order(fleet, rows, policy.seed)
    else:
        score = _rng(policy, fleet, rng).random(rows.size)
    return fleet.names[int(rows[int(np.argmax(score))])]


def node_fragmentation(nodes: Nodes, workload: Workload) -> np.ndarray:
    """Expected fragmentation ``F_n`` of every node under ``workload`` (in devices' worth of free share,
    the package docstring's formula), in the nodes' order. Zero for an empty workload."""
    fleet = _as_fleet(nodes)
    if not workload.counts or len(fleet) == 0:
        return np.zeros(len(fleet))
    shapes, p = _workload_vectors(workload, TaskShape())
    t = _types(fleet, shapes)
    terms = fleet._frag_cache.get(shapes)
    if terms is None:
        terms = fleet._frag_cache[shapes] = _Terms(fleet, t)
    terms.refresh(fleet, np.arange(len(fleet)))
    return _weigh(terms.frag, p)


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
    if shape.whole:
        per = f"{shape.count} idle device(s)"
    else:
        per = "1 device" if shape.count == 1 else f"{shape.count} distinct devices"
    extra = f", compute {shape.compute}%" if shape.compute else ""
    return f"needs {mem}{extra} on {per}"


def _why_not_node(fleet: Fleet, fit: _Fit, i: int) -> str:
    shape = fit.shape
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
        idle = int(_usable_count(fleet, fit.dev_ok[i:i + 1], np.array([i]))[0])
        return f"{_need_text(fit, i)}; {idle} idle device(s) of a matching model"
    if shape.count > 1 and fit.dev_ok[i].any():
        room = int(_usable_count(fleet, fit.dev_ok[i:i + 1], np.array([i]))[0])
        return f"{_need_text(fit, i)}; {room} device(s) with room (one MIG instance per card counts)"
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
        idle = _usable_count(fleet, model_ok & (fleet.slots_used == 0) & ~fleet.excl)
        k = int(np.argmax(idle))
        return (f"{_need_text(fit, int(i))}; most idle matching devices on one node is {int(idle[k])} "
                f"(node {fleet.names[k]})")
    if shape.count > 1 and fit.dev_ok.any():
        room = _usable_count(fleet, fit.dev_ok)
        k = int(np.argmax(room))
        return (f"{_need_text(fit, int(i))}; most devices with room on one node is {int(room[k])} "
                f"(node {fleet.names[k]})")
    text = f"{_need_text(fit, int(i), int(j))}; largest free is {human_bytes(max(0, int(free[i, j])))} {where}"
    room = (model_ok & (fleet.mem_cap - fleet.mem_used >= fit.need)).any()
    if room and not fit.dev_ok.any():
        text += "; devices with that memory lack compute or slice slots"
    elif fit.dev_ok.any():
        text += "; devices fit but no node has the CPU / host memory"
    return text


__all__ = ["place", "place_host", "node_fragmentation", "score_nodes", "filter_nodes", "fits", "Nodes"]
