"""Placement latency: filter + score of one request over 100 / 1,000 / 5,000 nodes × 8 GPUs, per policy.

The fleet is half full with a realistic mix (openb-like shares), so the filter has work to do and FGD
sees a real workload distribution. Two paths are timed: over a kept ``Fleet`` (how the simulator and a
long-lived agent call it) and over a list of ``NodeState`` (what an extender rebuilding state per call
pays, conversion included; 100 / 1,000 nodes only). Prints a table and writes it with --out.

    python bench/placement_latency.py --out bench/results/2026-11-22-cpu-placement-latency.txt
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from gpuslice.placement import (
    DeviceState, Fleet, NodeState, NoFit, PlacementPolicy, TaskShape, Workload, score_nodes,
)
from gpuslice.spec import GiB, MemoryAmount, Request

SHARES = [100, 100, 100, 100, 81, 47, 32, 65, 23, 46]  # percent; openb default's most common shapes


def build(n_nodes: int, seed: int = 0) -> tuple[Fleet, Workload]:
    rng = np.random.default_rng(seed)
    nodes = [NodeState(f"node-{i}", tuple(DeviceState(f"GPU-{i}-{j}", 32 * GiB, model="V100M32")
                                          for j in range(8)), cpu_milli=96000) for i in range(n_nodes)]
    fleet = Fleet(nodes)
    workload = Workload()
    # Fill about half the GPUs with slices drawn from the mix (direct bookkeeping, not timed).
    target = n_nodes * 8 * 0.5
    placed = 0.0
    while placed < target:
        pct = int(rng.choice(SHARES))
        i, j = int(rng.integers(n_nodes)), int(rng.integers(8))
        if fleet.mem_used[i, j] + fleet.mem_cap[i, j] * pct // 100 > fleet.mem_cap[i, j] or fleet.comp_used[i, j] + pct > 100:
            continue
        from gpuslice.spec import Slice
        fleet.apply(i, [Slice(f"GPU-{i}-{j}", int(32 * GiB * pct // 100), compute=pct)], cpu_milli=4000)
        workload = workload.observe(TaskShape(memory=MemoryAmount(percent=float(pct)), compute=pct, cpu_milli=4000))
        placed += pct / 100
    return fleet, workload


def time_calls(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    request = Request(memory=MemoryAmount(percent=47.0), compute=47)
    multi = Request(count=4)
    lines = [f"# placement latency (filter + score of one request), ms; {time.strftime('%Y-%m-%d')}",
             f"# machine: {platform.processor() or platform.machine()}, {sys.platform}, Python "
             f"{platform.python_version()}, numpy {np.__version__}, cores: {__import__('os').cpu_count()}",
             "# fleet: N nodes x 8 GPUs (32 GiB), ~50% allocated with openb-like shares; request 47% mem+compute "
             "(and 4 whole GPUs)",
             f"{'nodes':>6} {'path':>6} {'policy':>8} {'request':>8} {'p50':>7} {'p99':>7} {'max':>7}"]
    print("\n".join(lines))
    for n in sizes:
        fleet, workload = build(n)
        state_list = fleet.nodes() if n <= 1000 else None
        for pol in ("binpack", "spread", "bestfit", "fgd", "random"):
            policy = PlacementPolicy.parse(pol)
            for label, req in (("47%", request), ("4 GPUs", multi)):
                def call(target=fleet):
                    try:
                        score_nodes(req, target, policy, workload=workload, cpu_milli=4000)
                    except NoFit:
                        pass
                call()  # warm caches (FGD's per-shape arrays)
                ms = time_calls(call, args.repeats)
                q = np.percentile(ms, [50, 99])
                row = f"{n:>6} {'fleet':>6} {pol:>8} {label:>8} {q[0]:7.2f} {q[1]:7.2f} {max(ms):7.2f}"
                print(row, flush=True)
                lines.append(row)
                if state_list is not None and label == "47%":
                    ms = time_calls(lambda: call(state_list), max(10, args.repeats // 10))
                    q = np.percentile(ms, [50, 99])
                    row = f"{n:>6} {'list':>6} {pol:>8} {label:>8} {q[0]:7.2f} {q[1]:7.2f} {max(ms):7.2f}"
                    print(row, flush=True)
                    lines.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
