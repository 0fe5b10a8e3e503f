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
import statistics
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


def timed(fn) -> tuple[float, float]:
    """Wall and CPU milliseconds of one call. CPU time is this thread's (the placement runs on it; numpy's
    BLAS did not start threads for these sizes: process time read the same), so it does not count the
    time the OS gave to other jobs — the figure that says what the code costs on a loaded box."""
    w0, c0 = time.perf_counter(), time.thread_time()
    try:
        fn()
    except NoFit:
        pass
    return (time.perf_counter() - w0) * 1000, (time.thread_time() - c0) * 1000


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
    ap.add_argument("--workload", choices=("learnt", "fixed"), default="learnt",
                    help="learnt: every request is counted into FGD's workload before it is scored, so the shape "
                         "weights move on every call, as in the extender and the simulator; fixed: they never move")
    ap.add_argument("--load", type=int, default=0,
                    help="busy-loop processes loading the machine while each policy is timed (another job); with "
                         "--load, every policy is timed in separate runs, unloaded and loaded, in ABBA order")
    ap.add_argument("--baseline-src", type=Path,
                    help="with --load: also time the gpuslice package under this src directory (e.g. an export of "
                         "an earlier commit), alternated with this checkout's, A B B A in each load state")
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shapes == "openb":
        global MIX, SHAPES, WORKLOAD
        MIX, SHAPES, WORKLOAD = openb_mix(args.trace)
    if args.load or args.baseline_src:
        return loaded_runs(args)
    load = os.getloadavg()
    lines = [
        f"# placement latency: filter + score of one request (score_nodes), ms — {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"# machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {sys.platform}, "
        f"Python {platform.python_version()}, numpy {np.__version__}; load average at start "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}" + (" (other jobs were running)" if load[0] > 1 else " (quiet)"),
        f"# code: {Path(sys.modules['gpuslice'].__file__).parent}",
        f"# shapes: {len(SHAPES)} in FGD's workload ({'openb_pod_list_default, its 32 most frequent' if args.shapes == 'openb' else 'openb-like mix'}), "
        f"{len(MIX)} GPU request shapes drawn; workload {args.workload}",
        "# fleet: N nodes x 8 GPUs (32 GiB), ~50% allocated; requests drawn from that mix; each call",
        "# is followed (untimed) by applying its placement and releasing an earlier grant (steady state)",
        "# wall: perf_counter; cpu: thread_time of the same call",
        f"{'nodes':>6} {'path':>6} {'policy':>8} {'calls':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} "
        f"{'cpu_p50':>7} {'cpu_p99':>7} {'cold':>7}",
    ]
    print("\n".join(lines), flush=True)
    for n in (int(s) for s in args.sizes.split(",")):
        base = build(n, np.random.default_rng(n))
        for pol in args.policies.split(","):
            lines += time_policy(args, n, pol, copy.deepcopy(base))  # every policy starts from the same fleet
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def _row(n: int, path: str, pol: str, wall: list[float], cpu: list[float], cold: str) -> str:
    q = np.percentile(wall, [50, 90, 99])
    c = np.percentile(cpu, [50, 99])
    return (f"{n:>6} {path:>6} {pol:>8} {len(wall):>6} {q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f} {max(wall):7.2f} "
            f"{c[0]:7.2f} {c[1]:7.2f} {cold:>7}")


def time_policy(args, n: int, pol: str, state) -> list[str]:
    rng = np.random.default_rng(n + 1)
    gc.unfreeze()
    fleet, workload, granted = state
    policy = PlacementPolicy.parse(pol, seed=2)
    cold, _ = timed(lambda: score_nodes(MIX[1][1], fleet, policy, workload=workload, cpu_milli=MIX[1][2]))
    for _, req, cpu in MIX:  # warm every shape once, as a running extender would have
        score_nodes(req, fleet, policy, workload=workload, cpu_milli=cpu)
    # The ~20,000 grants built above are long-lived Python objects; without this, the cyclic
    # GC's full passes over them add 100–200 ms pauses to random calls. A long-running service
    # does the same after start-up (gc.freeze()).
    gc.collect()
    gc.freeze()
    wall, cpu_ms, lines = [], [], []
    for _ in range(args.calls):
        req, cpu = draw(rng)
        if args.workload == "learnt":  # the extender counts each pod into the workload when it first sees it
            workload = workload.observe(TaskShape.of(req, cpu_milli=cpu))
        w, c = timed(lambda: score_nodes(req, fleet, policy, workload=workload, cpu_milli=cpu))
        wall.append(w)
        cpu_ms.append(c)
        try:
            p = place(req, fleet, policy, workload=workload, cpu_milli=cpu, rng=rng)
            fleet.apply_placement(p, cpu_milli=cpu)
            granted.append((p, cpu))
        except NoFit:
            pass
        old, old_cpu = granted.pop(int(rng.integers(len(granted))))
        fleet.release_placement(old, cpu_milli=old_cpu)
    lines.append(_row(n, "fleet", pol, wall, cpu_ms, f"{cold:7.1f}"))
    print(lines[-1], flush=True)
    if args.cold and n <= 1000:
        nodes = fleet.nodes()
        wall, cpu_ms = [], []
        for _ in range(max(10, args.calls // 20)):
            req, cpu = draw(rng)
            w, c = timed(lambda: score_nodes(req, nodes, policy, workload=workload, cpu_milli=cpu))
            wall.append(w)
            cpu_ms.append(c)
        lines.append(_row(n, "list", pol, wall, cpu_ms, ""))
        print(lines[-1], flush=True)
    return lines


def busy(stop) -> None:
    """Another job: one CPU-bound process (pure Python arithmetic) until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x = (x * 31 + i) % 1000003


def _child(args, src: Path | None) -> list[str]:
    """One run of this script in a fresh interpreter (so one run's caches and GC state do not carry into the
    next), importing gpuslice from ``src`` when given."""
    import subprocess

    cmd = [sys.executable, __file__, "--sizes", args.sizes, "--calls", str(args.calls), "--shapes", args.shapes,
           "--trace", str(args.trace), "--policies", args.policies, "--workload", args.workload]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src.resolve())
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()


def loaded_runs(args) -> int:
    """Each size and policy timed in separate runs, unloaded and then with ``--load`` busy processes running
    (A B B A within each: this checkout, the baseline, the baseline, this checkout — or this checkout twice
    without ``--baseline-src``). Every run's wall and CPU p50 / p99 is listed, then the median over runs."""
    import multiprocessing as mp

    codes = [("now", None), ("before", args.baseline_src)] if args.baseline_src else [("now", None), ("now", None)]
    order = [codes[0], codes[1], codes[1], codes[0]]
    rows: dict[tuple[str, str, int], list[list[str]]] = {}
    header: list[str] = []
    started, load0 = time.time(), os.getloadavg()
    for loaded in sorted({0, args.load}):
        for label, src in order:
            stop = mp.Event()
            workers = [mp.Process(target=busy, args=(stop,), daemon=True) for _ in range(loaded)]
            for w in workers:
                w.start()
            try:
                out = _child(args, src)
            finally:
                stop.set()
                for w in workers:
                    w.join(5)
            header = header or [line for line in out if line.startswith("#") and not line.startswith("# code")]
            for line in out:
                parts = line.split()
                if parts and parts[0].isdigit():
                    rows.setdefault((f"{parts[0]} {parts[2]}", label, loaded), []).append(parts)
    load1 = os.getloadavg()
    lines = header + [
        f"# runs: each row is one interpreter run; {len(order)} runs per load state, A B B A "
        + ("(now = this checkout, before = " + str(args.baseline_src) + ")" if args.baseline_src else "(this checkout)"),
        f"# load: 'busy N' = N busy-loop processes (pure Python arithmetic) started by this benchmark on "
        f"{os.cpu_count()} cores while the run is timed; load average {load0[0]:.1f} at start, {load1[0]:.1f} at end; "
        f"{time.time() - started:.0f} s",
        f"{'nodes policy':>16} {'code':>6} {'load':>6} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>8} {'cpu p99':>8}"]
    for key, label, loaded in rows:
        for parts in rows[(key, label, loaded)]:
            lines.append(f"{key:>16} {label:>6} {'busy ' + str(loaded):>6} {parts[4]:>9} {parts[6]:>9} "
                         f"{parts[8]:>8} {parts[9]:>8}")
    lines.append("# median over the runs of each row above")
    for key, label, loaded in rows:
        runs = rows[(key, label, loaded)]
        med = [statistics.median(float(r[i]) for r in runs) for i in (4, 6, 8, 9)]
        lines.append(f"{key:>16} {label:>6} {'busy ' + str(loaded):>6} {med[0]:9.2f} {med[1]:9.2f} "
                     f"{med[2]:8.2f} {med[3]:8.2f}")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
