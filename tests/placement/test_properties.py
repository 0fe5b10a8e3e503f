"""Property tests: over random fleets and request streams, placement never over-commits memory, compute
or split slots, and it refuses a request exactly when a brute-force oracle finds no fitting device(s)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.placement import (
    POLICIES, DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, Workload, TaskShape, apply, place, release,
)
from gpuslice.spec import GiB, MemoryAmount, Request

MODELS = ("T4", "V100M16", "A10")


@st.composite
def devices(draw, node: int):
    n = draw(st.integers(1, 4))
    out = []
    for j in range(n):
        out.append(DeviceState(
            uuid=f"GPU-{node}-{j}", memory_total=draw(st.sampled_from([8, 16, 24])) * GiB,
            model=draw(st.sampled_from(MODELS)), split_count=draw(st.integers(1, 4)),
            memory_scaling=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0]))))
    return tuple(out)


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        cpu = draw(st.sampled_from([None, 4000, 16000]))
        nodes.append(NodeState(f"node-{i}", draw(devices(i)), cpu_milli=cpu))
    return nodes


requests = st.builds(
    lambda count, mem, compute, exclusive, models, cpu: (Request(
        count=count, memory=mem, compute=compute, exclusive=exclusive, models=models), cpu),
    count=st.sampled_from([1, 1, 1, 2, 3]),
    # Mostly small requests, so streams run devices out of split slots and compute, not only memory.
    mem=st.one_of(st.none(), st.builds(lambda g: MemoryAmount(bytes=g * GiB), st.integers(1, 30)),
                  st.builds(lambda g: MemoryAmount(bytes=g * GiB // 4), st.integers(1, 8)),
                  st.builds(lambda p: MemoryAmount(percent=float(p)), st.integers(1, 100)),
                  st.builds(lambda p: MemoryAmount(percent=float(p)), st.integers(1, 15))),
    compute=st.sampled_from([0, 0, 10, 25, 50, 100]),
    exclusive=st.sampled_from([False, False, False, True]),
    models=st.sampled_from([(), ("T4",), ("V100M16", "A10")]),
    cpu=st.sampled_from([0, 1000, 8000]),
)


def _device_fits(d: DeviceState, r: Request) -> bool:
    """The oracle: the plain rules, written without numpy."""
    if not d.matches(r.models):
        return False
    need = d.memory_total if r.memory is None else r.memory.resolve(d.memory_total)
    if r.exclusive or r.count > 1:
        return d.is_idle and need <= d.memory_capacity
    return d.free_slots >= 1 and d.free_memory >= need and d.free_compute >= r.compute


def _node_fits(n: NodeState, r: Request, cpu: int) -> bool:
    if n.cpu_milli is not None and n.cpu_milli - n.cpu_used < cpu:
        return False
    return sum(_device_fits(d, r) for d in n.devices) >= (r.count if (r.exclusive or r.count > 1) else 1)


def _assert_no_overcommit(nodes):
    for n in nodes:
        assert n.cpu_milli is None or 0 <= n.cpu_used <= n.cpu_milli
        for d in n.devices:
            assert 0 <= d.used_memory <= d.memory_capacity
            assert 0 <= d.used_compute <= 100
            assert 0 <= d.slice_count <= d.split_count


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets(), stream=st.lists(st.tuples(requests, st.booleans()), min_size=1, max_size=40),
       policy=st.sampled_from(POLICIES), gpu=st.sampled_from(POLICIES))
def test_stream_never_overcommits_and_refuses_only_when_nothing_fits(fleet, stream, policy, gpu):
    """Placing then applying a random stream (with some releases) keeps every device within memory
    capacity, 100 % compute and its split count; NoFit happens iff the oracle finds no node."""
    pol = PlacementPolicy(node=policy, gpu=gpu, seed=3)
    nodes = {n.name: n for n in fleet}
    mirror = Fleet(fleet)  # the in-place column store must track the same state
    granted = []
    workload = Workload()
    for (request, cpu), release_one in stream:
        workload = workload.observe(TaskShape.of(request, cpu))
        expect = any(_node_fits(n, request, cpu) for n in nodes.values())
        try:
            p = place(request, list(nodes.values()), pol, workload=workload, cpu_milli=cpu)
        except NoFit as exc:
            assert not expect, f"refused although a node fits: {exc.reason}"
            assert exc.reason
            continue
        assert expect
        node = nodes[p.node]
        whole = request.exclusive or request.count > 1
        assert p.exclusive == whole
        assert len(p.slices) == (request.count if whole else 1)
        assert len({s.device_uuid for s in p.slices}) == len(p.slices)
        for s in p.slices:
            assert _device_fits(node.device(s.device_uuid), request)
            assert s.compute == request.compute
        assert 0 <= p.score <= 100
        nodes[p.node] = apply(node, p.slices, exclusive=p.exclusive, cpu_milli=cpu)
        mirror.apply(p.node, p.slices, exclusive=p.exclusive, cpu_milli=cpu)
        granted.append((p, cpu))
        _assert_no_overcommit(nodes.values())
        if release_one and granted:
            old, old_cpu = granted.pop(0)
            nodes[old.node] = release(nodes[old.node], old.slices, exclusive=old.exclusive, cpu_milli=old_cpu)
            mirror.release(old.node, old.slices, exclusive=old.exclusive, cpu_milli=old_cpu)
    assert mirror.nodes() == [nodes[n.name] for n in fleet]


@settings(max_examples=80, deadline=None)
@given(fleet=fleets(), stream=st.lists(requests, min_size=1, max_size=30),
       node=st.sampled_from(["binpack", "spread", "bestfit", "fgd"]),
       gpu=st.sampled_from(["binpack", "spread", "bestfit", "fgd"]))
def test_fleet_path_equals_list_path(fleet, stream, node, gpu):
    """place() over a kept Fleet (incremental caches, sums kept row by row) decides exactly as over the
    equivalent list of NodeState built fresh. (random is left out: its stream mixes in the fleet's
    change counter, which a fresh fleet does not share.)"""
    pol = PlacementPolicy(node=node, gpu=gpu)
    fleet_store = Fleet(fleet)
    for request, cpu in stream:
        try:
            a = place(request, fleet_store.nodes(), pol, cpu_milli=cpu)
        except NoFit:
            a = None
        try:
            b = place(request, fleet_store, pol, cpu_milli=cpu)
        except NoFit:
            b = None
        assert a == b
        if b is not None:
            fleet_store.apply_placement(b, cpu_milli=cpu)
