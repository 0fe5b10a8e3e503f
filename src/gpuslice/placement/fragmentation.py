"""FGD's fragmentation terms: F_n(m) of every node for every workload shape, and how a placement changes it.

The formula is in the package docstring (``gpuslice.placement``). This module owns the numbers only —
per-shape arrays cached on the :class:`Fleet` and recomputed row by row as ``Fleet.row_version``
moves; turning a change ΔF into a score is :mod:`.scorers.fgd`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuslice.placement.fit import Fit, memory_need, model_mask, whole_cap
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.model import TaskShape, Workload

FGD_MAX_SHAPES = 32  # FGD's cost grows with the number of shapes; the rarest beyond this carry ~no weight


@dataclass
class ShapeTypes:
    """Static per-(device, shape) arrays of a workload's shapes, cached on the fleet."""

    shapes: tuple[TaskShape, ...]
    need: np.ndarray  # [N, G, K]
    model_ok: np.ndarray  # [N, G, K]
    whole: np.ndarray  # [K]
    count: np.ndarray  # [K]
    compute: np.ndarray  # [K]
    cpu: np.ndarray  # [K]
    hm: np.ndarray  # [K]


def shape_types(fleet: Fleet, shapes: tuple[TaskShape, ...]) -> ShapeTypes:
    cached = fleet._type_cache.get(shapes)
    if cached is not None:
        return cached
    need = np.stack([memory_need(fleet, s) for s in shapes], axis=-1)
    ok = np.stack([model_mask(fleet, s.models) for s in shapes], axis=-1)
    whole = np.array([s.whole for s in shapes])
    # Whole-device shapes that can never fit a device (too much memory) are simply "not ok" there.
    ok = ok & ~(whole & (need > whole_cap(fleet)[..., None]))
    types = ShapeTypes(shapes, need, ok, whole,
                       np.array([s.count for s in shapes]), np.array([s.compute for s in shapes]),
                       np.array([s.cpu_milli for s in shapes]), np.array([s.host_memory for s in shapes]))
    if len(fleet._type_cache) > 8:  # workloads drift; keep the few most recent
        fleet._type_cache.clear()
        fleet._frag_cache.clear()
    fleet._type_cache[shapes] = types
    return types


def workload_counts(workload: Workload | None, shape: TaskShape) -> tuple[tuple[TaskShape, ...], np.ndarray]:
    """The shapes FGD weighs and their counts (weights before normalising). The shapes tuple keys the
    caches: callers that keep a workload (``Workload.observe`` keeps first-seen order) hit them call after
    call."""
    if workload is None or not workload.counts:
        return (shape,), np.ones(1)
    top = workload.top(FGD_MAX_SHAPES) if len(workload.counts) > FGD_MAX_SHAPES else workload
    return tuple(s for s, _ in top.counts), np.array([c for _, c in top.counts], float)


def workload_vectors(workload: Workload | None, shape: TaskShape) -> tuple[tuple[TaskShape, ...], np.ndarray]:
    """The shapes FGD weighs and their weights p_k (summing to 1)."""
    shapes, counts = workload_counts(workload, shape)
    return shapes, counts / counts.sum()


def weigh(delta_k: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Σ_k p_k · delta_k over the last axis (the workload's expectation)."""
    # Rounded (to 1e-9, in place) so that equal states tie exactly whatever order the dot product
    # summed in.
    out = delta_k @ p
    out *= 1e9
    np.rint(out, out=out)
    out /= 1e9
    return out


class Weighed:
    """Σ_k p_k · delta[..., k] of a kept per-shape array ``delta`` ([N, ..., K]), kept current as its rows
    change and as the workload's counts move.

    The workload is learnt arrival by arrival, so its weights change on every call, but only by the
    count of the shape that arrived: with p = c / Σc, Σ_k p'_k d_k = (Σc · Σ_k p_k d_k + Σ_j Δc_j d_j) / Σc'.
    One column per changed count replaces the matrix-vector product over every node (at 5,000 × 8 with
    openb's 32 shapes: ~0.1 ms instead of ~0.35 ms plus its temporaries). That pays when a shape comes back
    before many counts moved (a fixed workload: median CPU p50 of a placement 1.6 against 1.75-2.2 ms); on openb's
    learnt mix a shape returns every ~27 arrivals, most counts have moved by then and it is weighed afresh
    as before (bench/results/2026-11-25-cpu-2core-vm-placement-latency-fgd.txt). Rows that changed, a change of
    more than ``MAX_COLUMNS`` counts and every ``REFRESH``-th update are weighed afresh with the formula
    of :func:`weigh`, so rounding drift stays bounded; the result is rounded to 1e-9 as :func:`weigh`
    rounds, which makes it equal to weighing afresh but for values within an ulp of a rounding edge
    (``tests/placement/test_fgd_decisions.py`` pins the decisions to those of weighing afresh)."""

    MAX_COLUMNS = 4
    REFRESH = 1024

    def __init__(self, delta: np.ndarray):
        self.delta = delta
        self.sum = np.zeros(delta.shape[:-1])  # Σ_k p_k delta_k, not rounded
        self.out = np.empty(delta.shape[:-1])
        self.counts: np.ndarray | None = None
        self.steps = 0

    def update(self, counts: np.ndarray, dirty: np.ndarray) -> np.ndarray:
        """The rounded weighed array under ``counts`` after the rows ``dirty`` of ``delta`` changed. The
        array returned is reused by the next call."""
        old = self.counts
        changed = None if old is None or old.shape != counts.shape else np.flatnonzero(counts != old)
        total = counts.sum()
        p = counts / total
        if changed is None or changed.size > self.MAX_COLUMNS or self.steps >= self.REFRESH:
            np.matmul(self.delta, p, out=self.sum)
            self.steps = 0
        else:
            if changed.size:
                assert old is not None
                self.sum *= old.sum()
                column = self.out  # scratch until the rounding below
                for j in changed.tolist():
                    np.multiply(self.delta[..., j], counts[j] - old[j], out=column)
                    self.sum += column
                self.sum /= total
                self.steps += 1
            if dirty.size:
                self.sum[dirty] = self.delta[dirty] @ p
        self.counts = counts.copy()
        out = np.multiply(self.sum, 1e9, out=self.out)
        np.rint(out, out=out)
        out /= 1e9
        return out


def _shape_fits(t: ShapeTypes, rows, mem_free: np.ndarray, comp_free: np.ndarray,
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


def _frag(t: ShapeTypes, count: np.ndarray, cpu_free: np.ndarray, hm_free: np.ndarray,
          lost: np.ndarray, total: np.ndarray) -> np.ndarray:
    """F_n(k): the free share shape k cannot use where the node can host k at all, else all of it.
    Arguments come broadcast to the caller's layout ([C, K] or [C, G, K])."""
    host = (count >= t.count) & (cpu_free >= t.cpu) & (hm_free >= t.hm)
    return np.where(host, lost, total)


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
    (the rule of :func:`~gpuslice.placement.fit.usable_count`, per shape). Only rows with MIG
    instances need it."""
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


class Terms:
    """Per-shape fragmentation terms of every node, kept current row by row (``Fleet.row_version``).

    ``fits``/``lost`` [N, G, K]: can device g take shape k, and the free share it loses to k;
    ``lost_node``/``count`` [N, K] their sums; ``frag`` [N, K] = F_n(k) of the package docstring.
    ``deltas`` caches, per request shape, [N, G, K] = F_n(k) after placing it on device g − before.
    """

    def __init__(self, fleet: Fleet, t: ShapeTypes):
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
        self.deltas: dict[TaskShape, tuple[np.ndarray, Weighed]] = {}
        self.wholes: dict[TaskShape, tuple[np.ndarray, np.ndarray, Weighed]] = {}

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
        self.fits[dirty], self.lost[dirty], self.share[dirty] = fits, lost, share
        self.lost_node[dirty], self.count[dirty] = lost_node, count
        total = share.sum(axis=1)
        self.total_share[dirty] = total
        self.frag[dirty] = _frag(t, count, cpu_free[:, None], hm_free[:, None], lost_node, total[:, None])
        self.seen[dirty] = fleet.row_version[dirty]

    def total(self, rows: np.ndarray, every: bool) -> np.ndarray:
        return self.total_share if every else self.total_share[rows]

    def shared_delta(self, fleet: Fleet, fit: Fit, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """[C, G]: change of F_n = Σ_k p_k F_n(k) if the one-device request goes on device g of each row
        (p: ``counts`` normalised). The array returned is reused by the next call for this shape.

        Only device g (and the node's CPU) change, so the node's sums are updated by g's before/after
        terms; rows unchanged since the last call for this request shape are served from the cache, and
        so is their weighed sum (:class:`Weighed`).
        """
        n = self.t.need.shape[0]
        entry = self.deltas.get(fit.shape)
        if entry is None:
            if len(self.deltas) > 64:
                self.deltas.clear()
            entry = (np.full(n, -1, np.int64), Weighed(np.zeros(self.t.need.shape)))
            self.deltas[fit.shape] = entry
        seen, weighed = entry
        dirty = rows[seen[rows] != fleet.row_version[rows]]
        if dirty.size:
            weighed.delta[dirty] = self._shared_delta_rows(fleet, fit, dirty)
            seen[dirty] = fleet.row_version[dirty]
        out = weighed.update(counts, dirty)
        return out if rows.size == n else out[rows]

    def _shared_delta_rows(self, fleet: Fleet, fit: Fit, dirty: np.ndarray) -> np.ndarray:
        """[C, G, K] of :meth:`shared_delta` for the rows ``dirty``, computed afresh."""
        t = self.t
        g = t.need.shape[1]
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
        after = _frag(t, count_after, cpu_a, hm_a, lost_after, total_after[..., None])
        return after - self.frag[dirty][:, None, :]

    def whole_delta(self, fleet: Fleet, fit: Fit, rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
        """[C, K]: change of F_n(k) if the idle devices ``picked`` ([C, count] indices) are taken whole."""
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
        after = _frag(self.t, count_after, cpu_a, hm_a, lost_after, total_after[:, None])
        return after - sel(self.frag)

    def whole_weighed(self, fleet: Fleet, fit: Fit, rows: np.ndarray, picked: np.ndarray,
                      counts: np.ndarray) -> np.ndarray:
        """[C]: Σ_k p_k · :meth:`whole_delta` (p: ``counts`` normalised), with the per-shape terms kept per
        request shape and recomputed only for rows that changed (or whose picked devices changed) since
        the last call: whole-device requests are the commonest on openb, and recomputing [N, K] for every
        node on every call was the largest part of fgd's latency at 5,000 nodes. The weighed sum is kept
        too (:class:`Weighed`). The array returned is reused by the next call for this shape."""
        n, _, k = self.t.need.shape
        entry = self.wholes.get(fit.shape)
        if entry is None or entry[1].shape[1] != picked.shape[1]:
            if len(self.wholes) > 16:
                self.wholes.clear()
            entry = (np.full(n, -1, np.int64), np.full((n, picked.shape[1]), -1, np.int64), Weighed(np.zeros((n, k))))
            self.wholes[fit.shape] = entry
        seen, seen_picked, weighed = entry
        stale = np.flatnonzero((seen[rows] != fleet.row_version[rows]) | (seen_picked[rows] != picked).any(axis=1))
        dirty = rows[stale]
        if stale.size:
            weighed.delta[dirty] = self.whole_delta(fleet, fit, dirty, picked[stale])
            seen[dirty] = fleet.row_version[dirty]
            seen_picked[dirty] = picked[stale]
        out = weighed.update(counts, dirty)
        return out if rows.size == n else out[rows]

    def shared_set_delta(self, fleet: Fleet, fit: Fit, rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
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
        after = _frag(t, count_after, cpu_a, hm_a, lost_after, total_after[:, None])
        return after - self.frag[rows]

    def host_delta(self, fleet: Fleet, rows: np.ndarray, cpu_milli: int, host_memory: int) -> np.ndarray:
        """[C, K]: change of F_n(k) if a task that needs no device takes ``cpu_milli`` / ``host_memory``
        on each node of ``rows``: its devices stay as they are, only whether the node can still host
        each shape changes."""
        cpu_a = (fleet.cpu_total[rows] - fleet.cpu_used[rows] - cpu_milli)[:, None]
        hm_a = (fleet.hm_total[rows] - fleet.hm_used[rows] - host_memory)[:, None]
        after = _frag(self.t, self.count[rows], cpu_a, hm_a, self.lost_node[rows],
                      self.share[rows].sum(axis=1)[:, None])
        return after - self.frag[rows]


def kept_terms(fleet: Fleet, shapes: tuple[TaskShape, ...], rows: np.ndarray) -> Terms:
    """The fleet's :class:`Terms` for ``shapes`` (made on first use), current for ``rows``."""
    t = shape_types(fleet, shapes)  # first: it may clear the terms cache when the workload drifted
    terms = fleet._frag_cache.get(shapes)
    if terms is None:
        terms = fleet._frag_cache[shapes] = Terms(fleet, t)
    terms.refresh(fleet, rows)
    return terms


def request_terms(fleet: Fleet, workload: Workload | None, shape: TaskShape,
                  rows: np.ndarray) -> tuple[Terms, np.ndarray, np.ndarray]:
    """The terms, shape weights and shape counts ``fgd`` scores ``shape`` against (the request alone when
    no workload was seen)."""
    shapes, counts = workload_counts(workload, shape)
    return kept_terms(fleet, shapes, rows), counts / counts.sum(), counts


__all__ = [
    "FGD_MAX_SHAPES", "ShapeTypes", "Terms", "Weighed", "kept_terms", "request_terms", "shape_types", "weigh",
    "workload_counts", "workload_vectors",
]
