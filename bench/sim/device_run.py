"""Run the openb replays on a machine that has only Python 3.11+ and numpy (no install step), and
pickle the outcomes; bench/sim/openb.py --from-pickle turns them into the report on this machine.

    PYTHONPATH=src python3 bench/sim/device_run.py --out $OUT/outcomes.pkl --workers 16
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openb_jobs import build_jobs, build_timeline_jobs  # noqa: E402

from gpuslice.sim.runner import run_jobs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats-default", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeline", default="", help="speed-ups for time-ordered replays instead, e.g. 1,2000")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.timeline:
        jobs = build_timeline_jobs([float(x) for x in args.timeline.split(",")])
    else:
        jobs = build_jobs(args.repeats_default, args.repeats)
    started, done = time.time(), []
    machine = f"{platform.machine()} {platform.processor()} {os.cpu_count()} cores, Python {platform.python_version()}"

    def save(outcomes):
        with args.out.open("wb") as handle:
            pickle.dump({"outcomes": outcomes, "wall": time.time() - started, "machine": machine,
                         "workers": args.workers, "planned": len(jobs)}, handle)

    def tick(outcome):
        done.append(outcome)
        print(f"[{len(done)}/{len(jobs)}] {outcome.job.trace.stem} {outcome.job.policy} seed {outcome.job.config.seed}: "
              f"alloc@100 {outcome.result.alloc_at(100):.2f} ({outcome.result.seconds:.1f}s)", flush=True)
        if len(done) % 25 == 0:  # a run cut short by a time limit still leaves what it finished
            save(list(done))
    outcomes = run_jobs(jobs, args.workers, tick)
    save(outcomes)
    print(f"{len(jobs)} replays in {time.time() - started:.0f} s on {machine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
