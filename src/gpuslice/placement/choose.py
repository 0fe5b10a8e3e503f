"""The GPU level: which devices of each scored node a request gets, given the GPU policy's ranking.

The scorer of ``policy.gpu`` ranks devices (:meth:`Scorer.device_preference` for shared slices,
:meth:`Scorer.idle_order` for whole devices); this module turns a ranking into a set of devices — the
best one, or ``count`` distinct ones (one MIG instance per card, the best-connected set where the node
describes its topology) — and what that set adds to the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.context import Context
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.topology import topology_pick

if TYPE_CHECKING:
    from gpuslice.placement.scorers.base import Scorer


@dataclass
class Choice:
    chosen: np.ndarray  # [C, G] bool, the devices chosen on each node
    picked: np.ndarray  # [C, count] their indices (one per row for a single shared slice)
    added: np.ndarray | float  # devices' worth the grant adds to its node ([C], or one number)
    topo: np.ndarray | None  # [C] topology score of a multi-device set (policy.topology), else None


def pick_distinct(fleet: Fleet, rows: np.ndarray, dev_ok: np.ndarray, order: np.ndarray,
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


def _pick_set(ctx: Context, order: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``count`` distinct devices per row in ``order``, or, where the node describes its topology, the
    best-connected set (``order`` breaks ties); and the sets' topology scores when the policy uses them."""
    picked = pick_distinct(ctx.fleet, ctx.rows, ctx.dev_ok, order, ctx.shape.count)
    topo = None
    if ctx.policy.topology:
        topo = topology_pick(ctx.fleet, ctx.rows, ctx.keep, ctx.dev_ok, order, picked, ctx.shape.count)
    return picked, topo


def _choose_shared(ctx: Context, pref: np.ndarray) -> Choice:
    """Shared slices: the most preferred fitting device, or ``count`` distinct ones. The slices of one
    grant talk to each other, so NVLink / one NUMA node matter for them as for whole GPUs."""
    dev_ok, need, cap = ctx.dev_ok, ctx.need, ctx.cap
    chosen = np.zeros(dev_ok.shape, bool)
    if ctx.shape.count == 1:
        arange = np.arange(ctx.rows.size)
        pick = np.where(dev_ok, pref, -np.inf).argmax(axis=1)  # ties: lowest device index
        chosen[arange, pick] = True
        added = need[arange, pick] / cap[arange, pick]  # devices' worth the chosen slice adds to its node
        return Choice(chosen, pick[:, None], added, None)
    order = np.argsort(np.where(dev_ok, -pref, np.inf), axis=1, kind="stable")
    picked, topo = _pick_set(ctx, order)
    np.put_along_axis(chosen, picked, True, axis=1)
    added = (np.take_along_axis(need, picked, axis=1) / np.take_along_axis(cap, picked, axis=1)).sum(axis=1)
    return Choice(chosen, picked, added, topo)


def _choose_whole(ctx: Context, key: np.ndarray) -> Choice:
    """Whole idle devices: the first ``count`` by the GPU policy's key (lowest first), or the best
    topology set where the node describes its topology."""
    key = np.where(ctx.dev_ok, key, np.inf)
    topo = None
    if ctx.shape.count == 1:
        picked = key.argmin(axis=1)[:, None]
    else:
        picked, topo = _pick_set(ctx, np.argsort(key, axis=1, kind="stable"))
    chosen = np.zeros(ctx.dev_ok.shape, bool)
    np.put_along_axis(chosen, picked, True, axis=1)
    return Choice(chosen, picked, float(ctx.shape.count), topo)  # each whole device adds one device's worth


def choose_devices(ctx: Context, scorer: Scorer) -> Choice:
    """The devices each scored node would give the request under the GPU policy ``scorer``."""
    if ctx.shape.whole:
        return _choose_whole(ctx, scorer.idle_order(ctx))
    return _choose_shared(ctx, scorer.device_preference(ctx))


__all__ = ["Choice", "choose_devices", "pick_distinct"]
