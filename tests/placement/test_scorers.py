"""The scorer registry: every policy name has exactly one scorer, and an unknown name is refused."""

from __future__ import annotations

import pytest

from gpuslice.placement import POLICIES
from gpuslice.placement.scorers import SCORERS, scorer
from gpuslice.spec import SpecError


def test_every_policy_has_its_scorer():
    """PlacementPolicy accepts exactly the names the registry can score."""
    assert sorted(SCORERS) == sorted(POLICIES)
    assert all(scorer(name).name == name for name in POLICIES)


def test_unknown_policy_is_refused_with_the_allowed_names():
    with pytest.raises(SpecError, match="binpack"):
        scorer("tetris")


def _node(name, links, numa, used=()):
    """One node of H100-sized devices; ``links`` pairs of NVLinked indexes; ``used`` (index, slices, compute%)."""
    from gpuslice.placement import DeviceState, NodeState

    n = len(numa)
    peers = {i: tuple(f"{name}-{b if a == i else a}" for a, b in links if i in (a, b)) for i in range(n)}
    devs = []
    for i in range(n):
        slots, comp, mem = next(((s, c, m) for j, s, c, m in used if j == i), (0, 0, 0))
        devs.append(DeviceState(uuid=f"{name}-{i}", memory_total=80 * 2**30, numa_node=numa[i], nvlink_peers=peers[i],
                                slice_count=slots, used_compute=comp, used_memory=mem))
    return NodeState(name, tuple(devs))


def test_topology_aware_keeps_connected_gpus_for_larger_requests():
    """HAMi's topology-aware: one device on the least connected GPU; several on the best-connected set; the
    node with the fewest GPUs that fits."""
    from gpuslice.placement import PlacementPolicy, place
    from gpuslice.spec import MemoryAmount, Request

    policy = PlacementPolicy(node="topology-aware", gpu="topology-aware")
    triangle = _node("a", [(0, 1), (0, 2), (1, 2)], [0, 0, 1, 1])  # GPU 3: no NVLink
    one = Request(memory=MemoryAmount(bytes=2**30))
    assert place(one, [triangle], policy).slices[0].device_uuid == "a-3"
    assert place(one, [triangle], PlacementPolicy()).slices[0].device_uuid == "a-0"  # binpack: index order
    two = Request(count=2, memory=MemoryAmount(bytes=2**30))
    assert {s.device_uuid for s in place(two, [triangle], policy).slices} == {"a-0", "a-1"}
    small = _node("small", [(0, 1)], [0, 0])
    assert place(two, [triangle, small], policy).node == "small"


def test_scoring_weights_follow_hamis_formula():
    """HAMi's example: after a 40 % request GPU A is at slots .2 / cores .9 / memory .5, GPU B at .8 / .1 / .6:
    slot=1,core=1,memory=3 prefers B (2.6 < 2.7 under binpack); memory + compute alone prefers A."""
    from gpuslice.placement import PlacementPolicy, place
    from gpuslice.spec import MemoryAmount, Request

    gib80 = 80 * 2**30
    node = _node("n", [], [0, 0], used=[(0, 1, 90, gib80 // 10), (1, 7, 10, gib80 // 5)])
    req = Request(memory=MemoryAmount(percent=40.0))
    assert place(req, [node], PlacementPolicy(weights=(1, 1, 3))).slices[0].device_uuid == "n-1"
    assert place(req, [node], PlacementPolicy()).slices[0].device_uuid == "n-0"
    assert place(req, [node], PlacementPolicy(gpu="spread", weights=(1, 1, 3))).slices[0].device_uuid == "n-0"
    with pytest.raises(SpecError):
        PlacementPolicy(weights=(0, 0, 0))
