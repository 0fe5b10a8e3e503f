"""A stand-in for workload.py without a GPU: the same options, the same gate and barrier, and a JSON of
the same shape (progress at 100 units/s scaled by the phase's share), so run_compute_bench.sh and
analyze.py can be run end to end on a CPU (GS_BENCH_WORKLOAD="python3 bench/compute/dry_workload.py",
as bench/gpu/packing.sh --dry-run does). Its numbers mean nothing."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from workload import barrier, parse_schedule


def main() -> None:
    ap = argparse.ArgumentParser()
    for opt in ("--kind", "--schedule", "--out", "--barrier", "--state-dir", "--grant", "--gate"):
        ap.add_argument(opt)
    ap.add_argument("--peers", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--warmup", type=float, default=0.1)
    a = ap.parse_args()
    while a.gate and not os.path.exists(a.gate):
        time.sleep(0.01)
    t0 = barrier(a.barrier, a.peers)
    while time.time() < t0:
        time.sleep(0.01)
    time.sleep(a.delay)
    start = time.time()
    progress, phases, units = [[start, 0]], [], 0.0
    for share, secs in parse_schedule(a.schedule or "x:1"):
        rate = 100.0 * (1.0 if share == "x" else float(share) / 100)
        p0 = time.time()
        while time.time() - p0 < secs:
            time.sleep(0.05)
            units += rate * 0.05
            progress.append([time.time(), units])
        phases.append({"share": share, "t0": p0, "t1": time.time()})
    Path(a.out).write_text(json.dumps({"kind": a.kind, "pid": os.getpid(), "grant": a.grant, "start": start,
                                       "phases": phases, "progress": progress, "latency": [], "enforcer_view": [],
                                       "preloaded": "libgpuslice" in os.environ.get("LD_PRELOAD", ""),
                                       "mps_pct": None}))


if __name__ == "__main__":
    main()
