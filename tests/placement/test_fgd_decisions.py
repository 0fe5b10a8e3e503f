"""FGD's decisions pinned to those of the implementation before the kept weighing (issue 16, item 4).

The faster scoring keeps Σ_k p_k ΔF_n(k) per request shape and moves it with the workload's counts instead of
re-weighing every node on every call. It must decide exactly as before: on seeded random clusters (whole GPUs of
three sizes, nodes of 2-8 devices, MIG instances, CPU tracked), a stream of requests (shares, whole GPUs, 2/4/8
GPUs, CPU-only tasks) is placed with ``fgd`` while the workload is learnt arrival by arrival (its weights move on
every call, as in the simulator and the extender) and earlier grants are released. Every placement and every
``score_nodes`` result must equal the ones recorded by the old code (``data/fgd_decisions.json``, written at
commit 6ae72b4 by ``python tests/placement/test_fgd_decisions.py --write``)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuslice.placement import (
    DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, TaskShape, WorkloadMix, place, place_host, score_nodes,
)
from gpuslice.spec import GiB, MemoryAmount, Request

DATA = Path(__file__).parent / "data" / "fgd_decisions.json"
# (seed, nodes, requests, learnt): learnt = the workload learnt from the arrivals, else fixed after 64 arrivals
CASES = [(1, 30, 400, True), (2, 80, 500, True), (3, 40, 400, False), (4, 300, 300, True)]


def _cluster(rng: np.random.Generator, n: int) -> list[NodeState]:
    nodes = []
    for i in range(n):
        size = int(rng.choice([16, 32, 80]))
        width = int(rng.choice([2, 4, 8, 8, 8]))
        devices = [DeviceState(f"GPU-{i}-{j}", size * GiB, model=f"M{size}") for j in range(width)]
        if rng.random() < 0.1:  # a MIG card: two instances of one parent
            devices += [DeviceState(f"MIG-{i}-{k}", 10 * GiB, model="A100", profile="2g.10gb",
                                    parent_uuid=f"GPU-{i}-mig") for k in range(2)]
        nodes.append(NodeState(f"node-{i}", tuple(devices), cpu_milli=int(rng.choice([32000, 64000, 96000]))))
    return nodes


def _request(rng: np.random.Generator) -> tuple[Request | None, int]:
    cpu = int(rng.choice([0, 2000, 4000, 8000, 16000]))
    kind = rng.random()
    if kind < 0.08:
        return None, cpu  # a CPU-only task
    if kind < 0.45:
        return Request(exclusive=True), cpu
    if kind < 0.9:
        pct = float(rng.choice([10, 20, 25, 30, 47, 50, 65, 81]))
        return Request(memory=MemoryAmount(percent=pct), compute=int(rng.choice([0, pct]))), cpu
    if kind < 0.95:
        return Request(memory=MemoryAmount(percent=40.0), compute=40, count=2), cpu
    return Request(count=int(rng.choice([2, 4, 8]))), cpu


def _digest(scores: dict[str, float]) -> str:
    return hashlib.blake2b(repr(sorted(scores.items())).encode(), digest_size=6).hexdigest()


def decisions(seed: int, n: int, calls: int, learnt: bool) -> list[str]:
    """One line per arrival: the placement (node and devices, or NoFit) and a digest of score_nodes'."""
    rng = np.random.default_rng(seed)
    fleet = Fleet(_cluster(rng, n))
    policy = PlacementPolicy.parse("fgd")
    mix, fixed, granted, out = WorkloadMix(refresh=64), None, [], []
    for k in range(calls):
        request, cpu = _request(rng)
        shape = TaskShape(count=0, cpu_milli=cpu) if request is None else TaskShape.of(request, cpu_milli=cpu)
        mix.observe(shape)
        if not learnt and k == 64:
            fixed = mix.workload()
        workload = fixed or mix.workload()
        if request is None:
            try:
                node = place_host(fleet, policy, cpu_milli=cpu, workload=workload)
            except NoFit:
                out.append("host nofit")
                continue
            fleet.apply(node, [], cpu_milli=cpu)
            out.append(f"host {node}")
            continue
        scores = score_nodes(request, fleet, policy, workload=workload, cpu_milli=cpu)
        try:
            p = place(request, fleet, policy, workload=workload, cpu_milli=cpu)
        except NoFit:
            out.append(f"nofit {_digest(scores)}")
            continue
        out.append(f"{p.node} {','.join(s.device_uuid for s in p.slices)} {_digest(scores)}")
        fleet.apply_placement(p, cpu_milli=cpu)
        granted.append((p, cpu))
        if granted and rng.random() < 0.15:  # releases: slower than arrivals, so the clusters fill up
            old, old_cpu = granted.pop(int(rng.integers(len(granted))))
            fleet.release_placement(old, cpu_milli=old_cpu)
    return out


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}-{c[1]}nodes" for c in CASES])
def test_fgd_decides_as_the_implementation_before_the_kept_weighing(case):
    """Each arrival's placement and score_nodes digest equal the recorded ones; the first difference is named."""
    expected = json.loads(DATA.read_text())[str(case[0])]
    got = decisions(*case)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert a == b, f"arrival {k}: now {a!r}, before {b!r}"


if __name__ == "__main__" and "--write" in sys.argv:
    DATA.write_text(json.dumps({str(c[0]): decisions(*c) for c in CASES}, indent=0) + "\n")


@pytest.mark.parametrize("shape", [(40, 8, 6), (300, 12)], ids=["shared", "whole"])
def test_kept_weighing_follows_counts_and_rows_as_weighing_afresh(shape):
    """Weighed.update, fed a stream of count changes (one or two shapes at a time, sometimes many at once,
    which weighs afresh) and of rewritten rows, returns what weigh() gives from scratch, to within the one
    rounding step of 1e-9 (the incremental sum differs from the fresh one in the last bits), and exactly
    equal on all but a handful of values."""
    from gpuslice.placement.fragmentation import Weighed, weigh

    rng = np.random.default_rng(7)
    delta = rng.normal(0, 2, shape)
    counts = rng.integers(1, 50, shape[-1]).astype(float)
    kept, unequal, seen = Weighed(delta.copy()), 0, 0
    kept.REFRESH = 100  # so the periodic fresh weighing happens within the stream too
    for step in range(400):
        changed = rng.choice(shape[-1], size=int(rng.choice([1, 1, 2, 6])), replace=False)
        counts[changed] += rng.integers(1, 4, changed.size)
        dirty = np.unique(rng.integers(0, shape[0], int(rng.integers(0, 4))))
        new_rows = rng.normal(0, 2, (dirty.size, *shape[1:]))
        delta[dirty] = new_rows
        kept.delta[dirty] = new_rows
        got = kept.update(counts, dirty)
        want = weigh(delta, counts / counts.sum())
        assert np.abs(got - want).max() <= 1.000001e-9, f"step {step}"
        unequal += int((got != want).sum())
        seen += got.size
    assert unequal <= 1e-4 * seen
