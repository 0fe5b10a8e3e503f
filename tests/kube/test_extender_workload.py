"""The extender's FGD learns its target workload from the pods as they arrive — each pod once, however often
kube-scheduler filters it — and scores with it, so the cluster's FGD picks what the simulator's FGD picks on the
same arrivals (tests/e2e/test_kube_placement_authority.py replays openb through the real scheduler)."""

from __future__ import annotations

from kubefixtures import node, pod

from gpuslice.kube import nodestate, podrequest, resources
from gpuslice.kube.extender import Extender
from gpuslice.kube.extender.cache import view_of
from gpuslice.placement import PlacementPolicy, TaskShape, WorkloadMix, place
from gpuslice.spec import GiB

FGD = resources.KubeConfig(policy=PlacementPolicy.parse("fgd"))


def args(p, nodes):
    return {"Pod": p, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def test_each_pod_counts_once_in_the_learnt_workload() -> None:
    ext = Extender(None, FGD)
    nodes = [node("a"), node("b")]
    small = pod("small", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "20"})
    for _ in range(3):  # kube-scheduler retries a pod: still one arrival
        ext.filter(args(small, nodes))
    ext.filter(args(pod("big", {"nvidia.com/gpu": "2"}), nodes))
    assert ext.mix.seen == 2
    shapes = {s.describe(): c for s, c in ext.mix.counts.items()}
    assert shapes == {"1 shared device, 8GiB, compute 20%": 1.0, "2 whole device(s), whole memory, compute 0%": 1.0}
    assert ext._workload(PlacementPolicy.parse("binpack")) is None  # only fgd weighs a workload


def test_prioritize_picks_what_placement_with_the_same_arrivals_picks() -> None:
    """The extender's top node (bind re-places on it with the same workload) is placement's own ``place``
    with a WorkloadMix fed the same arrivals — and, for some of them, not what FGD picks without the mix."""
    nodes = [node("two", count=2), node("four", count=4), node("eight", count=8), node("small", count=4, memory=24 * GiB,
                                                                                     model="A10")]
    states = [nodestate.node_state(n["metadata"]["name"], view_of(n).devices, view_of(n).ledger) for n in nodes]
    ext = Extender(None, FGD, use_index=False)
    mix = WorkloadMix()
    shapes = [{"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"},
              {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000", "nvidia.com/gpucores": "50"},
              {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "10"}] * 3
    differs = 0
    for i, limits in enumerate(shapes):
        p = pod(f"p{i}", limits)
        request = podrequest.pod_request(p, FGD).containers[0].request
        mix.observe(TaskShape.of(request))
        ext.filter(args(p, nodes))
        scores = {s["Host"]: s["Score"] for s in ext.prioritize(args(p, nodes))}
        want = place(request, states, PlacementPolicy.parse("fgd"), workload=mix.workload()).node
        assert scores[want] == 10 and list(scores.values()).count(10) == 1, (i, scores, want)
        differs += want != place(request, states, PlacementPolicy.parse("fgd")).node
    assert ext.mix.seen == mix.seen == len(shapes) and ext.mix.workload() == mix.workload()
    assert differs, "the learnt workload never changed FGD's choice: this test would not see it ignored"
