"""``fgd``: fragmentation gradient descent (Weng et al., USENIX ATC '23) — place where the expected
fragmentation of the workload's shapes grows least.

The fragmentation terms themselves are :mod:`gpuslice.placement.fragmentation`'s; this module turns a
change ΔF into the FGD authors' integer score and breaks its ties.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.fit import static_array
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.fragmentation import kept_terms, weigh, workload_vectors
from gpuslice.placement.model import TaskShape
from gpuslice.placement.scorers.base import Scorer, index_order
from gpuslice.placement.scorers.bestfit import host_remaining

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


def fgd_points(delta: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """FGD's 0..99 integer score of a fragmentation change ``delta`` (devices' worth; > 0 = more
    fragmentation): ⌊100 · σ(−ΔF)⌋, the scale of the FGD authors' score plugin (kube-scheduler scores
    are integers). Changes within one step (≈ 0.04 of a device near 0) tie, and so do all large
    increases; ties are then broken by :func:`node_order`, which consolidates load. Exact ΔF with a
    fullest-node tie-break allocated 0.3–0.6 points less on five openb traces. ``out``: where to write
    (the same steps in place, so no temporaries)."""
    out = np.clip(delta, -50.0, 50.0, out=out)
    np.exp(out, out=out)
    out += 1.0
    np.divide(100.0, out, out=out)
    return np.floor(out, out=out)


def node_order(fleet: Fleet, rows: np.ndarray, seed: int) -> np.ndarray:
    """[C] a stable pseudo-random rank in [0, 1) of each node (hash of the seed and the node's name):
    FGD's ties go to the node ranked highest, the same node every time, so equal-score placements
    pile onto the same nodes (first fit in a fixed random order) and leave the others whole. Stateless,
    so a scheduler extender or agent ranks a node alike on every call. Which order it is matters: on openb's
    default trace four single orders (seeds 0-3, each kept for ten replays) allocated 95.05-95.17 % at 100 %
    arrived and the node list's own order 94.83; the simulator seeds it with each replay's seed (as the FGD
    authors draw a node permutation per seed), so means over seeds average over orders
    (``bench/results/2026-11-28-cpu-2core-vm-sim-openb-fgd-ties.txt``)."""
    def make() -> np.ndarray:
        out = np.empty(len(fleet))
        for i, name in enumerate(fleet.names):
            digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
            out[i] = int.from_bytes(digest, "big") / 2.0 ** 64
        return out
    return static_array(fleet, ("fgd-order", seed), make)[rows]


def _chosen_delta(ctx: Context, choice: Choice) -> np.ndarray:
    """[C] ΔF = Σ_k p_k ΔF_n(k) of the devices chosen on each node."""
    terms, p = ctx.terms, ctx.p
    assert terms is not None and p is not None and ctx.counts is not None, \
        "the context has terms whenever a level is fgd"
    if ctx.shape.whole:
        return terms.whole_weighed(ctx.fleet, ctx.fit, ctx.rows, choice.picked, ctx.counts)
    if ctx.shape.count == 1:
        assert ctx.frag is not None
        return ctx.frag[np.arange(ctx.rows.size), choice.picked[:, 0]]
    return weigh(terms.shared_set_delta(ctx.fleet, ctx.fit, ctx.rows, choice.picked), p)


class Fgd(Scorer):
    """GPU level: the device of most points (ties: lowest index, as the authors' plugin); for whole
    devices, first the idle devices least useful to the workload. Node level: the points of ΔF, then
    the node's fixed rank. CPU-only task: the same, for the CPU it takes."""

    name = "fgd"

    def device_preference(self, ctx: Context) -> np.ndarray:
        assert ctx.frag is not None, "the context has frag for a shared request whenever a level is fgd"
        return fgd_points(ctx.frag, ctx.fleet.scratch("fgd-points", ctx.frag.shape))

    def idle_order(self, ctx: Context) -> np.ndarray:
        # Take first the idle devices least useful to the workload (fewest shapes they could host).
        # Idle devices of one kind are alike, so only nodes mixing kinds need it.
        fleet, rows = ctx.fleet, ctx.rows
        if ctx.terms is None or ctx.p is None or not fleet.mixed[rows].any():
            return index_order(ctx)
        key = index_order(ctx).copy()
        mixed = np.flatnonzero(fleet.mixed[rows])
        key[mixed] = ctx.terms.fits[rows[mixed]] @ ctx.p
        return key

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        # Not part of the score, but kept from before the scorers were split: binpack, spread and bestfit
        # read Fleet.used_sum(), whose first call rounds all rows at once (np.round) while later changes
        # round row by row (round()); the two can differ in the 9th decimal, so which call comes first
        # must not move. fgd has always made that call.
        ctx.load_after(choice.added)
        # Integer points of ΔF (ties within ≈ 0.04 device), then the node's fixed rank: equal scores
        # go to the same nodes every time. Random ties instead cost ~5 points on openb's default
        # trace (8-GPU tasks find no whole node); the fullest-node tie-break used before, 0.3–0.6.
        return fgd_points(_chosen_delta(ctx, choice)) + 0.5 * node_order(ctx.fleet, ctx.rows, ctx.policy.seed)

    def host_score(self, host: HostContext) -> np.ndarray:
        # The CPU a task takes can leave a node's GPUs unusable (no CPU left for GPU tasks), so the node
        # whose expected fragmentation rises least wins.
        if host.workload is None or not host.workload.counts:
            return host_remaining(host)  # nothing to protect yet: best fit
        shapes, p = workload_vectors(host.workload, TaskShape(cpu_milli=host.cpu_milli, host_memory=host.host_memory))
        terms = kept_terms(host.fleet, shapes, host.rows)
        delta = weigh(terms.host_delta(host.fleet, host.rows, host.cpu_milli, host.host_memory), p)
        return fgd_points(delta) + 0.5 * node_order(host.fleet, host.rows, host.policy.seed)


__all__ = ["Fgd", "fgd_points", "node_order"]
