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
    # FGD weighing an openb-sized shape set (the 32 most frequent shapes of openb_pod_list_default,
    # CPU-only ones included, as the simulator's FGD sees them) instead of the 14-shape mix:
    .venv/bin/python bench/placement_latency.py --shapes openb --sizes 5000 --policies fgd
    # while another job loads the machine: each policy timed unloaded and with one busy process, A B B A
    .venv/bin/python bench/placement_latency.py --shapes openb --sizes 5000 --load 1
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
# Entries: (weight, request, CPU milli of the task).
MIX: list[tuple[float, Request, int]] = [(0.56, Request(exclusive=True), 4000)]
for pct, weight in ((81, .155), (47, .108), (32, .047), (65, .036), (23, .02), (46, .018), (59, .011),
                    (16, .011), (55, .01), (22, .009)):
    MIX.append((weight, Request(memory=MemoryAmount(percent=float(pct)), compute=pct), 4000))
MIX += [(0.006, Request(count=8), 4000), (0.003, Request(count=2), 4000), (0.003, Request(count=4), 4000)]
SHAPES: list[TaskShape] = [TaskShape.of(req, cpu_milli=cpu) for _, req, cpu in MIX]
WORKLOAD: Workload | None = None  # --shapes openb: the shapes with their trace counts


def openb_mix(trace: Path) -> tuple[list[tuple[float, Request, int]], list[TaskShape], Workload]:
    """The simulator's FGD view of an openb pod list: its 32 most frequent task shapes (the typical set,
    CPU-only shapes included) with their counts. GPU model constraints are dropped (the benchmark's
    fleet is one model). Requests are drawn from the GPU shapes by frequency."""
    from collections import Counter
    from dataclasses import replace

    from gpuslice.sim.engine import _shape
    from gpuslice.sim.trace import load_tasks

    counts = Counter(replace(_shape(t), models=()) for t in load_tasks(trace))
    typical = Workload(tuple((s, float(c)) for s, c in counts.items())).typical(0.95, 32)
    mix = [(c, Request(count=s.count, memory=s.memory, compute=s.compute, exclusive=s.exclusive), s.cpu_milli)
           for s, c in typical.counts if s.count > 0]
    return mix, [s for s, _ in typical.counts], typical


def build(n_nodes: int, rng: np.random.Generator) -> tuple[Fleet, Workload, list]:
    nodes = [NodeState(f"node-{i}", tuple(DeviceState(f"GPU-{i}-{j}", 32 * GiB, model="V100M32")
                                          for j in range(8)), cpu_milli=96000) for i in range(n_nodes)]
    fleet = Fleet(nodes)
    workload = WORKLOAD or Workload()
    if WORKLOAD is None:
        for shape in SHAPES:
            workload = workload.observe(shape)
    granted: list = []
    policy = PlacementPolicy.parse("random", seed=1)
    target, placed = n_nodes * 8 * 0.5, 0.0
    while placed < target:  # fill half the fleet (random placement: a realistic scatter)
        req, cpu = draw(rng)
        try:
            p = place(req, fleet, policy, rng=rng, cpu_milli=cpu)
        except NoFit:
            break
        fleet.apply_placement(p, cpu_milli=cpu)
        granted.append((p, cpu))
        placed += req.count if p.exclusive else req.memory.percent / 100
    return fleet, workload, granted


def draw(rng: np.random.Generator) -> tuple[Request, int]:
    weights = np.array([w for w, _, _ in MIX])
    _, req, cpu = MIX[int(rng.choice(len(MIX), p=weights / weights.sum()))]
    return req, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--cold", action="store_true", help="also time the list-of-NodeState path (≤ 1,000 nodes)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", choices=("mix", "openb"), default="mix",
                    help="request / workload shapes: the 14-shape openb-like mix, or openb's own 32 most frequent")
    ap.add_argument("--trace", type=Path, default=Path(__file__).resolve().parent / "data" / "openb_pod_list_default.csv")
    ap.add_argument("--policies", default="binpack,spread,bestfit,fgd,random")
    ap.add_argument("--load", type=int, default=0,
                    help="busy-loop processes loading the machine while each policy is timed (another job); with "
                         "--load, every policy is timed twice, unloaded and loaded, in ABBA order per size")
    args = ap.parse_args()
    if args.shapes == "openb":
        global MIX, SHAPES, WORKLOAD
        MIX, SHAPES, WORKLOAD = openb_mix(args.trace)
    if args.load:
        return loaded_runs(args)
    load = os.getloadavg()
    lines = [
        f"# placement latency: filter + score of one request (score_nodes), ms — {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"# machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {sys.platform}, "
        f"Python {platform.python_version()}, numpy {np.__version__}; load average at start "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}" + (" (other jobs were running)" if load[0] > 1 else " (quiet)"),
        f"# shapes: {len(SHAPES)} in FGD's workload ({'openb_pod_list_default, its 32 most frequent' if args.shapes == 'openb' else 'openb-like mix'}), "
        f"{len(MIX)} GPU request shapes drawn",
        "# fleet: N nodes x 8 GPUs (32 GiB), ~50% allocated; requests drawn from that mix; each call",
        "# is followed (untimed) by applying its placement and releasing an earlier grant (steady state)",
        f"{'nodes':>6} {'path':>6} {'policy':>8} {'calls':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'cold':>7}",
    ]
    print("\n".join(lines), flush=True)
    for n in (int(s) for s in args.sizes.split(",")):
        base = build(n, np.random.default_rng(n))
        for pol in args.policies.split(","):
            rng = np.random.default_rng(n + 1)
            gc.unfreeze()
            fleet, workload, granted = copy.deepcopy(base)  # every policy starts from the same fleet
            policy = PlacementPolicy.parse(pol, seed=2)
            t0 = time.perf_counter()
            score_nodes(MIX[1][1], fleet, policy, workload=workload, cpu_milli=MIX[1][2])  # first call: cold caches
            cold = (time.perf_counter() - t0) * 1000
            for _, req, cpu in MIX:  # warm every shape once, as a running extender would have
                score_nodes(req, fleet, policy, workload=workload, cpu_milli=cpu)
            # The ~20,000 grants built above are long-lived Python objects; without this, the cyclic
            # GC's full passes over them add 100–200 ms pauses to random calls. A long-running service
            # does the same after start-up (gc.freeze()).
            gc.collect()
            gc.freeze()
            ms = []
            for _ in range(args.calls):
                req, cpu = draw(rng)
                t0 = time.perf_counter()
                try:
                    score_nodes(req, fleet, policy, workload=workload, cpu_milli=cpu)
                except NoFit:
                    pass
                ms.append((time.perf_counter() - t0) * 1000)
                try:
                    p = place(req, fleet, policy, workload=workload, cpu_milli=cpu, rng=rng)
                    fleet.apply_placement(p, cpu_milli=cpu)
                    granted.append((p, cpu))
                except NoFit:
                    pass
                old, old_cpu = granted.pop(int(rng.integers(len(granted))))
                fleet.release_placement(old, cpu_milli=old_cpu)
            q = np.percentile(ms, [50, 90, 99])
            row = f"{n:>6} {'fleet':>6} {pol:>8} {len(ms):>6} {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f} {max(ms):7.2f} {cold:7.1f}"
            print(row, flush=True)
            lines.append(row)
            if args.cold and n <= 1000:
                nodes = fleet.nodes()
                ms = []
                for _ in range(max(10, args.calls // 20)):
                    req, cpu = draw(rng)
                    t0 = time.perf_counter()
                    try:
                        score_nodes(req, nodes, policy, workload=workload, cpu_milli=cpu)
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


def busy(stop) -> None:
    """Another job: one CPU-bound process (pure Python arithmetic) until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x = (x * 31 + i) % 1000003


def loaded_runs(args) -> int:
    """Each size and policy timed without and with ``--load`` busy processes, alternating A B B A, as separate
    interpreter runs of this script (so one run's caches and GC state do not carry into the next)."""
    import multiprocessing as mp
    import subprocess

    base = [sys.executable, __file__, "--sizes", args.sizes, "--calls", str(args.calls), "--shapes", args.shapes,
            "--trace", str(args.trace), "--policies", args.policies]
    rows: dict[tuple[str, bool], list[list[str]]] = {}
    header = ""
    for loaded in (False, True, True, False):
        stop = mp.Event()
        workers = [mp.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.load if loaded else 0)]
        for w in workers:
            w.start()
        try:
            out = subprocess.run(base, capture_output=True, text=True, check=True).stdout.splitlines()
        finally:
            stop.set()
            for w in workers:
                w.join(5)
        header = "\n".join(line for line in out if line.startswith("#"))
        for line in out:
            parts = line.split()
            if parts and parts[0].isdigit():
                rows.setdefault((f"{parts[0]} {parts[2]}", loaded), []).append(parts)
    lines = [header, f"# ABBA: unloaded, loaded ({args.load} busy process(es) on {os.cpu_count()} cores), loaded, "
                     "unloaded; p50 / p99 ms of each run",
             f"{'nodes policy':>16} {'unloaded p50':>14} {'unloaded p99':>14} {'loaded p50':>12} {'loaded p99':>12}"]
    for key in dict.fromkeys(k for k, _ in rows):
        cells = []
        for loaded in (False, True):
            runs = rows[(key, loaded)]
            cells.append(" / ".join(r[4] for r in runs))
            cells.append(" / ".join(r[6] for r in runs))
        lines.append(f"{key:>16} {cells[0]:>14} {cells[1]:>14} {cells[2]:>12} {cells[3]:>12}")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
