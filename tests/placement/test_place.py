"""Fit and policies on small hand-made clusters: each test pins one rule of the placement docstring."""

from __future__ import annotations

import pytest

from gpuslice.placement import (
    DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, TaskShape, Workload, apply, filter_nodes, place,
    score_nodes,
)
from gpuslice.spec import GiB, MemoryAmount, Request, Slice, SpecError


def _node(name, mems, used=(), model="T4", **kw):
    devs = []
    for j, mem in enumerate(mems):
        u = used[j] if j < len(used) else 0
        devs.append(DeviceState(f"GPU-{name}-{j}", mem * GiB, model=model, used_memory=int(u * GiB),
                                slice_count=1 if u else 0))
    return NodeState(name, tuple(devs), **kw)


def _req(mem=None, pct=None, **kw):
    memory = MemoryAmount(bytes=int(mem * GiB)) if mem is not None else (
        MemoryAmount(percent=pct) if pct is not None else None)
    return Request(memory=memory, **kw)


def test_percent_memory_resolves_per_device():
    """50% is 8 GiB on a 16 GiB device and 16 GiB on a 32 GiB one."""
    p = place(_req(pct=50), [_node("a", [32])])
    assert p.slices[0].memory_limit == 16 * GiB
    p = place(_req(pct=50), [_node("b", [16])])
    assert p.slices[0].memory_limit == 8 * GiB


def test_split_count_limits_slices_even_when_memory_is_free():
    node = NodeState("a", (DeviceState("GPU-0", 16 * GiB, split_count=2),))
    for _ in range(2):
        p = place(_req(mem=1), [node])
        node = apply(node, p.slices)
    with pytest.raises(NoFit, match="maximum of 2 slices|lack compute or slice slots"):
        place(_req(mem=1), [node])


def test_memory_scaling_allows_oversubscription():
    node = NodeState("a", (DeviceState("GPU-0", 16 * GiB, memory_scaling=2.0),))
    node = apply(node, place(_req(mem=16), [node]).slices)
    assert place(_req(mem=16), [node]).slices[0].device_uuid == "GPU-0"


def test_compute_share_never_exceeds_100():
    node = NodeState("a", (DeviceState("GPU-0", 16 * GiB),))
    node = apply(node, place(_req(mem=1, compute=70), [node]).slices)
    with pytest.raises(NoFit, match="compute"):
        place(_req(mem=1, compute=40), [node])
    assert place(_req(mem=1, compute=30), [node])


def test_model_constraint_and_nofit_reason_lists_models():
    nodes = [_node("t4", [16], model="T4"), _node("v", [32], model="V100M32")]
    assert place(_req(pct=10, models=("V100M16", "V100M32")), nodes).node == "v"
    with pytest.raises(NoFit, match="models present: T4, V100M32"):
        place(_req(pct=10, models=("A10",)), nodes)


def test_nofit_reason_names_largest_free_device():
    nodes = [_node("a", [16, 16], used=(4, 8))]
    with pytest.raises(NoFit) as exc:
        place(_req(mem=20), nodes)
    assert "needs 20.0 GiB on 1 device; largest free is 12.0 GiB on GPU-a-0 (node a)" in exc.value.reason


def test_filter_nodes_gives_a_reason_per_rejected_node():
    nodes = [_node("a", [16]), _node("b", [32]), _node("c", [32], cpu_milli=1000)]
    fitting, reasons = filter_nodes(_req(mem=20), nodes, cpu_milli=2000)
    assert fitting == ["b"]
    assert "largest free is 16.0 GiB" in reasons["a"]
    assert reasons["c"].startswith("CPU: needs 2000m, 1000m free")


def test_multi_gpu_gets_whole_idle_devices_exclusively():
    nodes = [_node("a", [16, 16, 16], used=(1,))]
    p = place(Request(count=2), nodes)
    assert p.exclusive and [s.device_uuid for s in p.slices] == ["GPU-a-1", "GPU-a-2"]
    assert all(s.memory_limit == 16 * GiB for s in p.slices)
    node = apply(nodes[0], p.slices, exclusive=True)
    with pytest.raises(NoFit, match="most idle matching devices on one node is 0"):
        place(Request(count=1, exclusive=True), [node])


def test_multi_gpu_with_a_memory_size_gets_shared_slices_on_distinct_devices():
    """HAMi's ``nvidia.com/gpu: 2`` with ``gpumem: 3000``: two 3000 MiB slices on two cards that stay
    shareable (binpack fills the busier cards first), not two cards held whole."""
    nodes = [_node("a", [16, 16, 16], used=(8,))]
    p = place(_req(mem=3, count=2, compute=30), nodes)
    assert not p.exclusive
    assert [s.device_uuid for s in p.slices] == ["GPU-a-0", "GPU-a-1"]
    assert all(s.memory_limit == 3 * GiB and s.compute == 30 for s in p.slices)
    node = apply(nodes[0], p.slices)
    # The cards are still shared: a one-device request fits on them.
    again = place(_req(mem=2), [node])
    assert again.slices[0].device_uuid == "GPU-a-0"


def test_shared_multi_device_needs_that_many_devices_with_room():
    nodes = [_node("a", [16, 16], used=(15,))]
    with pytest.raises(NoFit, match="most devices with room on one node is 1"):
        place(_req(mem=4, count=2), nodes)
    fitting, reasons = filter_nodes(_req(mem=4, count=2), nodes)
    assert not fitting and "1 device(s) with room" in reasons["a"]


def test_multi_device_requests_take_one_mig_instance_per_card():
    """Two MIG instances of one card are not two GPUs to a multi-device request (whole or shared)."""
    mig = tuple(DeviceState(f"MIG-c0-{k}", 10 * GiB, model="A100", profile="1g.10gb", parent_uuid="GPU-c0")
                for k in range(3))
    node = NodeState("m", mig + (DeviceState("GPU-x", 16 * GiB, model="A100"),))
    for request in (Request(count=2), _req(mem=2, count=2)):
        p = place(request, [node])
        uuids = [s.device_uuid for s in p.slices]
        assert "GPU-x" in uuids and sum(u.startswith("MIG-") for u in uuids) == 1, request
    with pytest.raises(NoFit):
        place(Request(count=3), [node])
    only_mig = NodeState("n", mig)
    with pytest.raises(NoFit):
        place(_req(mem=2, count=2), [only_mig])
    _, reasons = filter_nodes(_req(mem=2, count=2), [only_mig])
    assert "1 device(s) with room (one MIG instance per card counts)" in reasons["n"]


def test_whole_device_fits_below_a_memory_reserve():
    """deviceMemoryScaling < 1 keeps a reserve for packing slices; a device taken whole still fits."""
    node = NodeState("r", (DeviceState("GPU-r", 16 * GiB, memory_scaling=0.9),))
    p = place(Request(exclusive=True), [node])
    assert p.exclusive and p.slices[0].memory_limit == 16 * GiB
    held = apply(node, p.slices, exclusive=True)
    assert held.devices[0].used_memory == 16 * GiB
    fleet = Fleet([node])
    fleet.apply_placement(p)
    assert fleet.node_state("r") == held


def test_fleet_checks_slices_of_one_call_against_each_other():
    """Two slices on one device in a single apply are checked on their running sum (a ledger rebuilt in
    one go), as model.apply does: 2 × 10 GiB on 16 GiB is refused and nothing is applied."""
    node = NodeState("f", (DeviceState("GPU-f", 16 * GiB),))
    fleet = Fleet([node])
    with pytest.raises(SpecError):
        fleet.apply("f", [Slice("GPU-f", 10 * GiB), Slice("GPU-f", 10 * GiB)])
    with pytest.raises(SpecError):
        apply(node, [Slice("GPU-f", 10 * GiB), Slice("GPU-f", 10 * GiB)])
    assert fleet.node_state("f") == node
    fleet.apply("f", [Slice("GPU-f", 6 * GiB, compute=30), Slice("GPU-f", 6 * GiB, compute=30)])
    assert fleet.node_state("f") == apply(node, [Slice("GPU-f", 6 * GiB, compute=30)] * 2)


def _topo_node():
    # 4 GPUs: 0-1 NVLink pair on NUMA 0, 2-3 NVLink pair on NUMA 1; 1 and 2 are free only on paper.
    links = {0: ("GPU-t-1",), 1: ("GPU-t-0",), 2: ("GPU-t-3",), 3: ("GPU-t-2",)}
    return NodeState("t", tuple(DeviceState(f"GPU-t-{j}", 16 * GiB, numa_node=j // 2, nvlink_peers=links[j])
                                for j in range(4)))


def test_topology_prefers_nvlink_pair_over_index_order():
    node = _topo_node()
    node = apply(node, [Slice("GPU-t-0", GiB)])  # 0 busy: index order would give 1+2 (no link, two NUMA)
    p = place(Request(count=2), [node], PlacementPolicy(topology=True))
    assert sorted(s.device_uuid for s in p.slices) == ["GPU-t-2", "GPU-t-3"]
    p = place(Request(count=2), [node], PlacementPolicy(topology=False))
    assert sorted(s.device_uuid for s in p.slices) == ["GPU-t-1", "GPU-t-2"]


def test_topology_chooses_the_devices_of_shared_multi_device_slices():
    """count=2 with a memory size: shared slices on two devices. The GPU policy alone (bestfit: fullest
    devices) would take 1 and 2 — no NVLink, two NUMA nodes; the topology takes a linked pair, and among
    the two linked pairs the one the GPU policy prefers (2-3, fuller than 0-1)."""
    node = apply(_topo_node(), [Slice("GPU-t-1", 8 * GiB), Slice("GPU-t-2", 10 * GiB), Slice("GPU-t-3", 2 * GiB)])
    req = _req(4, count=2)
    p = place(req, [node], PlacementPolicy.parse("bestfit", topology=False))
    assert sorted(s.device_uuid for s in p.slices) == ["GPU-t-1", "GPU-t-2"]
    p = place(req, [node], PlacementPolicy.parse("bestfit", topology=True))
    assert sorted(s.device_uuid for s in p.slices) == ["GPU-t-2", "GPU-t-3"]
    assert not p.exclusive and all(s.memory_limit == 4 * GiB for s in p.slices)
    # The linked pair 2-3 cannot take 4 GiB more on 2 once it holds 14 GiB: 0-1 is the linked pair left.
    fuller = apply(node, [Slice("GPU-t-2", 4 * GiB)])
    p = place(req, [fuller], PlacementPolicy.parse("bestfit", topology=True))
    assert sorted(s.device_uuid for s in p.slices) == ["GPU-t-0", "GPU-t-1"]


def test_topology_score_ranks_nodes():
    """A node whose free devices form an NVLink pair outranks one where they are scattered."""
    good = _topo_node()
    plain = NodeState("plain", tuple(DeviceState(f"GPU-p-{j}", 16 * GiB, numa_node=j) for j in range(4)))
    scores = score_nodes(Request(count=2), [plain, good], PlacementPolicy(node="spread", gpu="spread"))
    assert scores["t"] > scores["plain"]


def test_gpu_policies_pick_devices_as_documented():
    node = _node("a", [16, 16, 32], used=(8, 2, 2))
    pick = {pol: place(_req(mem=4), [node], PlacementPolicy(node="binpack", gpu=pol)).slices[0].device_uuid
            for pol in ("binpack", "spread", "bestfit")}
    assert pick == {"binpack": "GPU-a-0", "spread": "GPU-a-2", "bestfit": "GPU-a-0"}
    # bestfit is absolute: a 16 GiB device with 8 left beats a 32 GiB one with 9 left though less used.
    node = _node("b", [32, 16], used=(23, 8))
    assert place(_req(mem=4), [node], PlacementPolicy(gpu="bestfit")).slices[0].device_uuid == "GPU-b-1"
    assert place(_req(mem=4), [node], PlacementPolicy(gpu="binpack")).slices[0].device_uuid == "GPU-b-0"


def test_node_policies_binpack_spread_bestfit():
    busy, idle, small = _node("busy", [16, 16], used=(8, 8)), _node("idle", [16, 16]), _node("small", [16], used=(8,))
    nodes = [idle, busy, small]
    assert place(_req(mem=2), nodes, PlacementPolicy(node="binpack")).node == "small"
    assert place(_req(mem=2), nodes, PlacementPolicy(node="spread")).node == "idle"
    # Best-fit ranks by absolute remaining: small has 0.5 device free vs busy's 1.0.
    assert place(_req(mem=2), nodes, PlacementPolicy(node="bestfit")).node == "small"


def test_fgd_keeps_whole_devices_for_a_workload_of_whole_device_tasks():
    """With a workload of mostly 1-GPU tasks, a 40% task goes onto the already-split device, not a fresh
    one; binpack by node utilisation would have chosen the node that is fuller overall."""
    a = _node("a", [10, 10], used=(5,))     # half of one device used, one idle
    b = _node("b", [10, 10, 10, 10], used=(5, 5, 5))  # three halves used
    workload = Workload.from_shapes([TaskShape(count=1, memory=None, exclusive=True)] * 8
                                    + [TaskShape(memory=MemoryAmount(percent=40.0))] * 2)
    p = place(_req(pct=40), [a, b], PlacementPolicy.parse("fgd"), workload=workload)
    dev = p.slices[0].device_uuid
    assert dev in ("GPU-a-0", "GPU-b-0", "GPU-b-1", "GPU-b-2")  # never a fresh idle device
    free = {"a": [5, 10], "b": [5, 5, 5, 10]}
    assert free[p.node][int(dev[-1])] == 5


def test_fgd_score_prefers_the_node_whose_fragmentation_grows_least():
    # The workload is 60% tasks: a half-used device is already a fragment for them, so filling it with
    # this 50% task removes fragmentation; putting it on a fresh device would create a new 50% sliver.
    half = _node("half", [10], used=(5,))
    fresh = _node("fresh", [10, 10])
    workload = Workload.from_shapes([TaskShape(memory=MemoryAmount(percent=60.0))] * 5)
    scores = score_nodes(_req(pct=50), [half, fresh], PlacementPolicy.parse("fgd"), workload=workload)
    assert scores["half"] > scores["fresh"]


def test_random_is_reproducible_with_a_seed_and_varies_with_state():
    nodes = [_node(f"n{i}", [16]) for i in range(20)]
    pol = PlacementPolicy.parse("random", seed=7)
    assert place(_req(mem=1), nodes, pol) == place(_req(mem=1), nodes, pol)
    picks = set()
    fleet = Fleet(nodes)
    for _ in range(10):
        p = place(_req(mem=1), fleet, pol)
        fleet.apply_placement(p)
        picks.add(p.node)
    assert len(picks) > 3


def test_scores_are_0_to_100_for_every_policy():
    nodes = [_node("a", [16, 16], used=(3,)), _node("b", [32]), _node("c", [16], used=(15,))]
    for pol in ("binpack", "spread", "bestfit", "fgd", "random"):
        scores = score_nodes(_req(mem=1), nodes, PlacementPolicy.parse(pol))
        assert set(scores) == {"a", "b", "c"}
        assert all(0 <= s <= 100 for s in scores.values())


def test_bad_inputs_are_refused_with_named_fields():
    with pytest.raises(SpecError, match="request"):
        place({"count": 1}, [_node("a", [16])])  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="nodes"):
        place(_req(mem=1), _node("a", [16]))  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="nodes"):
        place(_req(mem=1), [_node("a", [16]), _node("a", [16])])
    with pytest.raises(NoFit, match="no nodes"):
        place(_req(mem=1), [])


def test_fgd_whole_device_leaves_the_device_the_workload_needs_most():
    """On a node mixing a T4 and a V100, a whole-GPU request without a model constraint takes the T4
    when the workload's other shapes can only use the V100 (the V100 stays free for them)."""
    node = NodeState("mix", (DeviceState("GPU-t4", 16 * GiB, model="T4"), DeviceState("GPU-v", 32 * GiB, model="V100M32")))
    workload = Workload.from_shapes([TaskShape(memory=MemoryAmount(percent=50.0), models=("V100M32",))] * 9
                                    + [TaskShape(count=1, exclusive=True)])
    p = place(Request(exclusive=True), [node], PlacementPolicy.parse("fgd"), workload=workload)
    assert [s.device_uuid for s in p.slices] == ["GPU-t4"]
    # Index order (binpack) would have taken the first device as well; flip the order to tell them apart.
    flipped = NodeState("mix", tuple(reversed(node.devices)))
    assert place(Request(exclusive=True), [flipped], PlacementPolicy.parse("fgd"), workload=workload).slices[0].device_uuid == "GPU-t4"
    assert place(Request(exclusive=True), [flipped], PlacementPolicy.parse("binpack")).slices[0].device_uuid == "GPU-v"
