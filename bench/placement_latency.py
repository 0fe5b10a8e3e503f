"""Placement latency: filter + score of one request over 100 / 1,000 / 5,000 nodes × 8 GPUs, per policy.

Steady state, as a scheduler extender or agent that keeps a ``Fleet`` sees it: the fleet starts about
half allocated; each timed call is ``score_nodes`` (filter + score of every node, the extender's
filter/prioritize work, result as a dict) for a request drawn from an openb-like mix (whole GPUs, shares,
some 2/4/8-GPU requests); the request is then placed and applied (untimed) and, to keep the load
level, an earlier grant is released. So every call also pays for refreshing the rows that changed
since that request shape was last scored (FGD's cached terms). The first call of each shape set (cold
caches) is reported separately. ``--cold`` also times the list-of-NodeState path (a Fleet built per call).
Start-up objects are moved out of the cyclic GC's way (``gc.freeze()``), as a long-lived service should.

    .venv/bin/python bench/placement_latency.py --out bench/results/2026-11-22-cpu-placement-latency.txt
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from gpuslice.placement import (
    DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, TaskShape, Workload, place, score_nodes,
)
from gpuslice.spec import GiB, MemoryAmount, Request

# openb default's shape mix (share of GPU tasks): whole 1-GPU 56 %, shares 43 %, multi-GPU 1 %.
MIX: list[tuple[float, Request]] = [(0.56, Request(exclusive=True))]
for pct, weight in ((81, .155), (47, .108), (32, .047), (65, .036), (23, .02), (46, .018), (59, .011),
                    (16, .011), (55, .01), (22, .009)):
    MIX.append((weight, Request(memory=MemoryAmount(percent=float(pct)), compute=pct)))
MIX += [(0.006, Request(count=8)), (0.003, Request(count=2)), (0.003, Request(count=4))]


def build(n_nodes: int, rng: np.random.Generator) -> tuple[Fleet, Workload, list]:
    nodes = [NodeState(f"node-{i}", tuple(DeviceState(f"GPU-{i}-{j}", 32 * GiB, model="V100M32")
                                          for j in range(8)), cpu_milli=96000) for i in range(n_nodes)]
    fleet = Fleet(nodes)
    workload = Workload()
    for _, req in MIX:
        workload = workload.observe(TaskShape.of(req, cpu_milli=4000))
    granted: list = []
    policy = PlacementPolicy.parse("random", seed=1)
    target, placed = n_nodes * 8 * 0.5, 0.0
    while placed < target:  # fill half the fleet (random placement: a realistic scatter)
        req = draw(rng)
        try:
            p = place(req, fleet, policy, rng=rng)
        except NoFit:
            break
        fleet.apply_placement(p, cpu_milli=4000)
        granted.append(p)
        placed += req.count if p.exclusive else req.memory.percent / 100
    return fleet, workload, granted


def draw(rng: np.random.Generator) -> Request:
    weights = np.array([w for w, _ in MIX])
    return MIX[int(rng.choice(len(MIX), p=weights / weights.sum()))][1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--cold", action="store_true", help="also time the list-of-NodeState path (≤ 1,000 nodes)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load = os.getloadavg()
    lines = [
        f"# placement latency: filter + score of one request (score_nodes), ms — {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"# machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {sys.platform}, "
        f"Python {platform.python_version()}, numpy {np.__version__}; load average at start "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}" + (" (other jobs were running)" if load[0] > 1 else " (quiet)"),
        "# fleet: N nodes x 8 GPUs (32 GiB), ~50% allocated; requests drawn from an openb-like mix; each call",
        "# is followed (untimed) by applying its placement and releasing an earlier grant (steady state)",
        f"{'nodes':>6} {'path':>6} {'policy':>8} {'calls':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'cold':>7}",
    ]
    print("\n".join(lines), flush=True)
    for n in (int(s) for s in args.sizes.split(",")):
        base = build(n, np.random.default_rng(n))
        for pol in ("binpack", "spread", "bestfit", "fgd", "random"):
            rng = np.random.default_rng(n + 1)
            gc.unfreeze()
            fleet, workload, granted = copy.deepcopy(base)  # every policy starts from the same fleet
            policy = PlacementPolicy.parse(pol, seed=2)
            t0 = time.perf_counter()
            score_nodes(MIX[1][1], fleet, policy, workload=workload, cpu_milli=4000)  # first call: cold caches
            cold = (time.perf_counter() - t0) * 1000
            for _, req in MIX:  # warm every shape once, as a running extender would have
                score_nodes(req, fleet, policy, workload=workload, cpu_milli=4000)
            # The ~20,000 grants built above are long-lived Python objects; without this, the cyclic
            # GC's full passes over them add 100–200 ms pauses to random calls. A long-running service
            # does the same after start-up (gc.freeze()).
            gc.collect()
            gc.freeze()
            ms = []
            for _ in range(args.calls):
                req = draw(rng)
                t0 = time.perf_counter()
                try:
                    score_nodes(req, fleet, policy, workload=workload, cpu_milli=4000)
                except NoFit:
                    pass
                ms.append((time.perf_counter() - t0) * 1000)
                try:
                    p = place(req, fleet, policy, workload=workload, cpu_milli=4000, rng=rng)
                    fleet.apply_placement(p, cpu_milli=4000)
                    granted.append(p)
                except NoFit:
                    pass
                old = granted.pop(int(rng.integers(len(granted))))
                fleet.release_placement(old, cpu_milli=4000)
            q = np.percentile(ms, [50, 90, 99])
            row = f"{n:>6} {'fleet':>6} {pol:>8} {len(ms):>6} {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f} {max(ms):7.2f} {cold:7.1f}"
            print(row, flush=True)
            lines.append(row)
            if args.cold and n <= 1000:
                nodes = fleet.nodes()
                ms = []
                for _ in range(max(10, args.calls // 20)):
                    req = draw(rng)
                    t0 = time.perf_counter()
                    try:
                        score_nodes(req, nodes, policy, workload=workload, cpu_milli=4000)
                    except NoFit:
                        pass
                    ms.append((time.perf_counter() - t0) * 1000)
                q = np.percentile(ms, [50, 90, 99])
                row = f"{n:>6} {'list':>6} {pol:>8} {len(ms):>6} {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f} {max(ms):7.2f} {'':>7}"
                print(row, flush=True)
                lines.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
