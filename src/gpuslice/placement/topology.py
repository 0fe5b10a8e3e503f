"""Topology of multi-device grants: how well a set of devices is connected, and the best-connected set.

The devices of one grant talk to each other, so NVLink between every pair, or else one NUMA node, matter
as much as the GPU policy's preference: on a node that describes its topology the set is chosen here (the
GPU policy breaks ties), and its topology score blends into the node score (:mod:`.core`).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from gpuslice.placement.fleet import Fleet


def topology_score(fleet: Fleet, i: int, group: Sequence[int]) -> float:
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


def _layout_id(fleet: Fleet, i: int) -> int:
    """A number for node i's topology (NUMA nodes, NVLink peers, MIG cards by device index): nodes
    built alike share it, and so share the memo of :func:`best_set`."""
    sig = fleet._topology_rows.get(i)
    if sig is None:
        devs = fleet.static[i]
        index = {d.uuid: j for j, d in enumerate(devs)}
        layout = tuple((d.numa_node, tuple(sorted(index[u] for u in d.nvlink_peers if u in index)),
                        int(fleet.parent[i, j])) for j, d in enumerate(devs))
        sig = fleet._topology_rows[i] = fleet._topology_ids.setdefault(layout, len(fleet._topology_ids))
    return sig


def _candidates(fleet: Fleet, i: int, ranked: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """Sets of ``count`` devices to weigh, in the GPU policy's preference order: every combination of
    at most 10 candidates, else one greedy set from each start (grow by the device that scores best
    with the group). Never two MIG instances of one card."""
    parent = fleet.parent[i]

    def distinct(group: Sequence[int]) -> bool:
        cards = [int(parent[k]) for k in group if parent[k] >= 0]
        return len(cards) == len(set(cards))

    if len(ranked) <= 10:
        return [g for g in itertools.combinations(ranked, count) if distinct(g)]
    candidates = []
    for start in ranked:
        group = [start]
        while len(group) < count:
            options = [k for k in ranked if k not in group and distinct(group + [k])]
            if not options:
                break
            group.append(max(options, key=lambda k: topology_score(fleet, i, group + [k])))
        if len(group) == count:
            candidates.append(tuple(group))
    return candidates


def best_set(fleet: Fleet, i: int, ranked: Sequence[int], count: int) -> tuple[tuple[int, ...], float]:
    """Best set of ``count`` of the devices ``ranked`` (node i's usable devices, most preferred by the
    GPU policy first) by :func:`topology_score`, and its score. Among sets that score alike, the one
    whose members come earliest in ``ranked`` wins: topology decides first, the GPU policy next.

    Memoised per (node topology, ranked, count): nodes of one build in one state ask the same question,
    and a scheduler asks it for every fitting node on every multi-device request.
    """
    key = (_layout_id(fleet, i), tuple(ranked), count)
    found = fleet._topology_memo.get(key)
    if found is not None:
        return found
    best_group, best_score = None, -1.0
    for group in _candidates(fleet, i, ranked, count):  # in preference order: only a better score moves on
        s = topology_score(fleet, i, group)
        if s > best_score:
            best_group, best_score = tuple(group), s
    assert best_group is not None, "the fit guaranteed enough usable devices"
    if len(fleet._topology_memo) > 4096:
        fleet._topology_memo.clear()
    fleet._topology_memo[key] = (best_group, best_score)
    return best_group, best_score


def topology_pick(fleet: Fleet, rows: np.ndarray, report: np.ndarray, dev_ok: np.ndarray, order: np.ndarray,
                  picked: np.ndarray, count: int) -> np.ndarray:
    """On nodes that describe their topology (and are reported), replace the ``picked`` devices
    ([C, count], changed in place) by the best-connected set of ``count`` usable devices, ties going to
    the GPU policy's ``order`` ([C, G], best first). Returns the topology score of each row's set
    (100 where the node describes no topology: nothing to prefer there)."""
    topo = np.full(rows.size, 100.0)
    for c in np.flatnonzero(fleet.has_topology[rows] & report):
        ranked = [int(j) for j in order[c] if dev_ok[c, j]]
        group, topo[c] = best_set(fleet, int(rows[c]), ranked, count)
        picked[c] = sorted(group)
    return topo


__all__ = ["best_set", "topology_pick", "topology_score"]
