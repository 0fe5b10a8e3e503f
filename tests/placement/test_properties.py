"""Property tests: over random fleets and request streams, placement never over-commits memory, compute
or split slots, and it refuses a request exactly when a brute-force oracle finds no fitting device(s).

Fleets mix whole GPUs (some NVLinked, on NUMA nodes) with MIG instances of one card; requests mix
single slices, shared slices on several distinct devices, and whole devices. Over-commit is checked on
sums of the granted slices kept by the test itself, not on the state objects' own bookkeeping."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.placement import (
    POLICIES, DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, Workload, TaskShape, apply,
    node_fragmentation, place, place_host, release,
)
from gpuslice.spec import GiB, MemoryAmount, Request, Slice

MODELS = ("T4", "V100M16", "A10")
COUNTS = [1, 1, 1, 2, 3]


@st.composite
def devices(draw, node: int):
    n = draw(st.integers(1, 4))
    out = []
    linked = draw(st.booleans())
    uuids = [f"GPU-{node}-{j}" for j in range(n)]
    for j in range(n):
        out.append(DeviceState(
            uuid=uuids[j], memory_total=draw(st.sampled_from([8, 16, 24])) * GiB,
            model=draw(st.sampled_from(MODELS)), split_count=draw(st.integers(1, 4)),
            memory_scaling=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])), numa_node=j // 2,
            nvlink_peers=tuple(u for u in uuids if u != uuids[j]) if linked else ()))
    # Sometimes a MIG card too: its instances are devices of their own, one parent between them.
    for k in range(draw(st.sampled_from([0, 0, 2, 3]))):
        out.append(DeviceState(
            uuid=f"MIG-{node}-{k}", memory_total=draw(st.sampled_from([5, 10])) * GiB, model="A100",
            profile=draw(st.sampled_from(["1g.10gb", "2g.20gb"])), split_count=draw(st.integers(1, 3)),
            parent_uuid=f"GPU-{node}-mig"))
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
    count=st.sampled_from(COUNTS),
    # Mostly small requests, so streams run devices out of split slots and compute, not only memory.
    mem=st.one_of(st.none(), st.builds(lambda g: MemoryAmount(bytes=g * GiB), st.integers(1, 30)),
                  st.builds(lambda g: MemoryAmount(bytes=g * GiB // 4), st.integers(1, 8)),
                  st.builds(lambda p: MemoryAmount(percent=float(p)), st.integers(1, 100)),
                  st.builds(lambda p: MemoryAmount(percent=float(p)), st.integers(1, 15))),
    compute=st.sampled_from([0, 0, 10, 25, 50, 100]),
    exclusive=st.sampled_from([False, False, False, True]),
    models=st.sampled_from([(), ("T4",), ("V100M16", "A10"), ("A100",), ("1g.10gb",)]),
    cpu=st.sampled_from([0, 1000, 8000]),
)


def _whole(r: Request) -> bool:
    """The rule, restated: exclusive, or several devices' whole memory each."""
    return r.exclusive or (r.count > 1 and r.memory is None)


def _need(d: DeviceState, r: Request) -> int:
    return d.memory_total if r.memory is None else r.memory.resolve(d.memory_total)


def _device_fits(d: DeviceState, r: Request) -> bool:
    """The oracle: the plain rules, written without numpy."""
    if not d.matches(r.models):
        return False
    if _whole(r):
        # A device held whole may carry its physical memory even below a reserve (scaling < 1).
        return d.is_idle and _need(d, r) <= max(d.memory_capacity, d.memory_total)
    return d.free_slots >= 1 and d.free_memory >= _need(d, r) and d.free_compute >= r.compute


def _usable(devices) -> int:
    """Devices one request may use together: whole GPUs, and one MIG instance per card."""
    cards = {d.parent_uuid for d in devices if d.parent_uuid}
    return sum(1 for d in devices if not d.parent_uuid) + len(cards)


def _node_fits(n: NodeState, r: Request, cpu: int) -> bool:
    if n.cpu_milli is not None and n.cpu_milli - n.cpu_used < cpu:
        return False
    return _usable([d for d in n.devices if _device_fits(d, r)]) >= r.count


def _assert_no_overcommit(fleet, granted):
    """Sums over the slices granted so far, per device, against the devices' capacities as built."""
    devices = {d.uuid: d for n in fleet for d in n.devices}
    memory, compute, slots, whole = Counter(), Counter(), Counter(), Counter()
    for p, _ in granted:
        for s in p.slices:
            memory[s.device_uuid] += s.memory_limit
            compute[s.device_uuid] += s.compute
            slots[s.device_uuid] += 1
            whole[s.device_uuid] += p.exclusive
    for uuid, d in devices.items():
        cap = max(d.memory_capacity, d.memory_total) if whole[uuid] else d.memory_capacity
        assert memory[uuid] <= cap, f"{uuid}: {memory[uuid]} B granted, capacity {cap}"
        assert compute[uuid] <= 100, f"{uuid}: {compute[uuid]} % compute granted"
        assert slots[uuid] <= d.split_count, f"{uuid}: {slots[uuid]} slices, split {d.split_count}"
        assert not whole[uuid] or slots[uuid] == 1, f"{uuid} is held whole and shared"
    for n in fleet:
        if n.cpu_milli is not None:
            used = sum(cpu for p, cpu in granted if p.node == n.name)
            assert used <= n.cpu_milli


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
        assert p.exclusive == _whole(request)
        assert len(p.slices) == request.count
        assert len({s.device_uuid for s in p.slices}) == len(p.slices)
        assert _usable([node.device(s.device_uuid) for s in p.slices]) == request.count, "two MIG of one card"
        for s in p.slices:
            d = node.device(s.device_uuid)
            assert _device_fits(d, request)
            assert s.compute == request.compute
            assert s.memory_limit == _need(d, request), "the slice's limit is what the request resolves to"
        assert 0 <= p.score <= 100
        nodes[p.node] = apply(node, p.slices, exclusive=p.exclusive, cpu_milli=cpu)
        mirror.apply(p.node, p.slices, exclusive=p.exclusive, cpu_milli=cpu)
        granted.append((p, cpu))
        _assert_no_overcommit(fleet, granted)
        if release_one and granted:
            old, old_cpu = granted.pop(0)
            nodes[old.node] = release(nodes[old.node], old.slices, exclusive=old.exclusive, cpu_milli=old_cpu)
            mirror.release(old.node, old.slices, exclusive=old.exclusive, cpu_milli=old_cpu)
    assert mirror.nodes() == [nodes[n.name] for n in fleet]


shapes = st.builds(
    lambda r, cpu: TaskShape.of(r[0], cpu_milli=cpu), requests, st.sampled_from([0, 1000, 8000]))
# Workloads: a few shapes with counts, sometimes with a CPU-only shape (count 0) among them.
workloads = st.lists(st.tuples(st.one_of(shapes, st.just(TaskShape(count=0, cpu_milli=2000))),
                               st.integers(1, 9)), min_size=1, max_size=6).map(
    lambda kv: Workload(tuple(dict(kv).items())))


@settings(max_examples=80, deadline=None)
@given(fleet=fleets(), stream=st.lists(st.tuples(requests, st.booleans()), min_size=1, max_size=30),
       node=st.sampled_from(["binpack", "spread", "bestfit", "fgd"]),
       gpu=st.sampled_from(["binpack", "spread", "bestfit", "fgd"]), fixed=st.one_of(st.none(), workloads))
def test_fleet_path_equals_list_path(fleet, stream, node, gpu, fixed):
    """place() / place_host() / node_fragmentation() over a kept Fleet (incremental caches, sums kept row
    by row, FGD's per-shape terms refreshed only for changed rows) decide exactly as over the equivalent
    list of NodeState built fresh — under a real workload (fixed, or grown from the stream as a
    scheduler would), with releases in between. (random is left out: its stream mixes in the fleet's
    change counter, which a fresh fleet does not share.)"""
    pol = PlacementPolicy(node=node, gpu=gpu)
    fleet_store = Fleet(fleet)
    granted = []
    learnt = Workload()
    for (request, cpu), release_one in stream:
        learnt = learnt.observe(TaskShape.of(request, cpu))
        workload = fixed or learnt
        try:
            a = place(request, fleet_store.nodes(), pol, workload=workload, cpu_milli=cpu)
        except NoFit:
            a = None
        try:
            b = place(request, fleet_store, pol, workload=workload, cpu_milli=cpu)
        except NoFit:
            b = None
        assert a == b
        if b is not None:
            fleet_store.apply_placement(b, cpu_milli=cpu)
            granted.append((b, cpu))
        assert list(node_fragmentation(fleet_store, workload)) == list(node_fragmentation(fleet_store.nodes(), workload))
        try:
            h_a = place_host(fleet_store.nodes(), pol, cpu_milli=cpu, workload=workload)
            h_b = place_host(fleet_store, pol, cpu_milli=cpu, workload=workload)
            assert h_a == h_b
        except NoFit:
            pass
        if release_one and granted:
            old, old_cpu = granted.pop(0)
            fleet_store.release_placement(old, cpu_milli=old_cpu)


# ------------------------------------------------------------------ FGD against the docstring formula
def _can_take(d: DeviceState, m: TaskShape) -> bool:
    """Can device d take one device's part of shape m (the docstring's [g can take m])."""
    if m.count == 0:  # a CPU-only shape uses no device: every device's free share is lost to it
        return False
    r = Request(count=m.count, memory=m.memory, compute=m.compute, exclusive=m.exclusive, models=m.models)
    return _device_fits(d, r)


def _frag(n: NodeState, workload: Workload) -> float:
    """F_n = Σ_m p_m F_n(m), written from the package docstring with plain loops (no numpy, no caches)."""
    total = sum(c for _, c in workload.counts)
    free = {d.uuid: 0.0 if d.exclusive_taken else d.free_memory / d.memory_capacity for d in n.devices}
    out = 0.0
    for m, c in workload.counts:
        takers = [d for d in n.devices if _can_take(d, m)]
        hosts = (m.count > 0 and _usable(takers) >= m.count
                 and (n.cpu_milli is None or n.cpu_milli - n.cpu_used >= m.cpu_milli))
        lost = sum(free[d.uuid] for d in n.devices if not hosts or d not in takers)
        out += c / total * lost
    return out


@settings(max_examples=120, deadline=None)
@given(fleet=fleets(), warmup=st.lists(requests, max_size=15), workload=workloads,
       pct=st.integers(5, 60), compute=st.sampled_from([0, 10, 30]), cpu=st.sampled_from([0, 1000, 8000]))
def test_fgd_picks_a_device_of_least_fragmentation_increase(fleet, warmup, workload, pct, compute, cpu):
    """Brute force: for a one-device shared request, every (node, device) that can take it is tried on
    plain data and ΔF_n = F_n(after) − F_n(before) computed by the docstring formula; fgd's choice must
    be one of the minima (ties may go either way)."""
    nodes = {n.name: n for n in fleet}
    for request, c in warmup:  # some state: a random scatter of earlier grants
        try:
            p = place(request, list(nodes.values()), PlacementPolicy.parse("random", seed=5), cpu_milli=c)
        except NoFit:
            continue
        nodes[p.node] = apply(nodes[p.node], p.slices, exclusive=p.exclusive, cpu_milli=c)
    request = Request(memory=MemoryAmount(percent=float(pct)), compute=compute)
    deltas = {}
    for n in nodes.values():
        if n.cpu_milli is not None and n.cpu_milli - n.cpu_used < cpu:
            continue
        before = _frag(n, workload)
        for d in n.devices:
            if _device_fits(d, request):
                s = Slice(d.uuid, _need(d, request), compute=compute)
                deltas[(n.name, d.uuid)] = _frag(apply(n, [s], cpu_milli=cpu), workload) - before
    try:
        p = place(request, list(nodes.values()), PlacementPolicy.parse("fgd"), workload=workload, cpu_milli=cpu)
    except NoFit:
        assert not deltas
        return
    (s,) = p.slices
    # fgd scores ΔF as ⌊100 · σ(−ΔF)⌋: its choice must have the most points (ties may go either way).
    def points(delta: float) -> int:
        return int(math.floor(100.0 / (1.0 + math.exp(min(50.0, max(-50.0, delta + 1e-9))))))
    assert points(deltas[(p.node, s.device_uuid)]) >= max(points(v) for v in deltas.values()), \
        f"chose ΔF {deltas[(p.node, s.device_uuid)]:.6f}, least is {min(deltas.values()):.6f}"
