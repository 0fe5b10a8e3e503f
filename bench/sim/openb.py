"""Side-by-side placement policies on the openb trace and its variants (workload inflation, the FGD
paper's method), written under bench/results/ as a markdown summary plus the HTML report and CSVs.

    .venv/bin/python bench/sim/openb.py --repeats-default 10 --repeats 3 \
        --out bench/results/2026-11-22-cpu-sim-openb
    # or run the replays elsewhere (only Python + numpy needed) and report here:
    PYTHONPATH=src python3 bench/sim/device_run.py --out outcomes.pkl --workers 16
    .venv/bin/python bench/sim/openb.py --from-pickle outcomes.pkl --out bench/results/2026-11-22-cpu-sim-openb
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import pickle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openb_jobs import DATA, VARIANTS, build_jobs  # noqa: E402

from gpuslice.sim.report import PUBLISHED_SOURCE, published_comparison, summarise, write_all  # noqa: E402
from gpuslice.sim.runner import run_jobs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats-default", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--from-pickle", type=Path, help="outcomes written by bench/sim/device_run.py")
    ap.add_argument("--notes", type=Path, help="markdown appended to the summary (findings, caveats)")
    ap.add_argument("--load", default="", help="what the machine's load was during the run, for the record")
    args = ap.parse_args()
    nodes = DATA / "openb_node_list_gpu_node.csv"
    machine = f"{platform.machine()} CPU box, {os.cpu_count()} cores, Python {platform.python_version()}"
    workers = min(os.cpu_count() or 1, 2)
    if args.from_pickle:
        with args.from_pickle.open("rb") as handle:
            saved = pickle.load(handle)
        outcomes, wall, machine, workers = saved["outcomes"], saved["wall"], saved["machine"], saved["workers"]
        jobs = [o.job for o in outcomes]
    else:
        jobs = build_jobs(args.repeats_default, args.repeats, [v for v in args.variants.split(",") if v])
        started = time.time()
        done = [0]

        def tick(outcome):
            done[0] += 1
            print(f"[{done[0]}/{len(jobs)}] {outcome.job.trace.stem} {outcome.job.policy} seed "
                  f"{outcome.job.config.seed}: alloc@100 {outcome.result.alloc_at(100):.2f} "
                  f"({outcome.result.seconds:.1f}s)", flush=True)
        outcomes = run_jobs(jobs, workers, tick)
        wall = time.time() - started
    rows = summarise(outcomes)
    report = write_all(rows, args.out, {"nodes": nodes.name, "mode": "inflation", "ratio": "1.3",
                                        "seeds": f"default 42..{41 + args.repeats_default}, variants 42..{41 + args.repeats}"})
    run_seconds = sum(o.result.seconds for o in outcomes)
    seeds = sorted({o.job.config.seed for o in outcomes})
    md = [f"# openb: placement policies side by side (workload inflation) — {time.strftime('%Y-%m-%d')}",
          "",
          f"Machine: {machine}{'; load: ' + args.load if args.load else ''}; {len(outcomes)} replays in {wall:.0f} s "
          f"wall ({run_seconds:.0f} s summed over replays, {workers} processes). Command: `.venv/bin/python "
          "bench/sim/openb.py` (or `bench/sim/device_run.py` + `--from-pickle`); the same numbers come from "
          "`gpuslice simulate --trace bench/data/openb_pod_list_<trace>.csv … --nodes "
          f"bench/data/openb_node_list_gpu_node.csv --repeats {len(seeds)} --seed {seeds[0]}` (same seed, same "
          "replay, whatever the machine).",
          "",
          "Method (Weng et al., ATC '23): tasks drawn uniformly with replacement until GPU demand = 1.3 × the "
          "6,212 GPUs; placed in arrival order, failures not retried. alloc@X = GPU demand placed (% of "
          "capacity) when arrived demand first reaches X %; unalloc@100 = 100 − alloc@100 (idle capacity "
          "when a full cluster's worth has arrived). Mean over seeds (± standard deviation at 100 %). "
          "CPU-only tasks included, node CPU and memory enforced, 10 slices per GPU at most. Δ vs best-fit is "
          "averaged over the seeds both policies ran (each seed draws the same sequence for every policy). "
          f"Report with plots: `{args.out.name}/report.html`; data: `summary.csv`, `curves.csv`.",
          "",
          "| trace | policy | seeds | alloc@90 | alloc@95 | alloc@100 | unalloc@100 | idle GPUs@100 | alloc@130 | Δ vs best-fit @100 (pts) | unallocated vs best-fit |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        v = r.values
        md.append(f"| {r.trace.replace('openb_pod_list_', '')} | {r.policy} | {r.seeds} | {v['alloc_90']:.2f} | "
                  f"{v['alloc_95']:.2f} | {v['alloc_100']:.2f} ± {v['alloc_100_sd']:.2f} | {v['unalloc_100']:.2f} | "
                  f"{v['idle_gpus_100']:.0f} | {v['alloc_end']:.2f} | {v.get('gain_vs_bestfit', 0):+.2f} | "
                  f"{v.get('unalloc_change_vs_bestfit', 0):+.1f}% |")
    md += ["", "## FGD's gain over best-fit at 100 % load: ours and the FGD authors'", "",
           f"Published: {PUBLISHED_SOURCE}. Their seeds draw other sequences than ours, so the comparison is "
           "between means and between gains (each gain taken over seeds both policies ran).", "",
           "| trace | our best-fit | our fgd | our gain | published best-fit | published FGD | published gain | ours − published |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in published_comparison(rows):
        name = str(c["trace"]).replace("openb_pod_list_", "")
        if "pub_gain" in c:
            md.append(f"| {name} | {c['bestfit']:.2f} | {c['fgd']:.2f} | {c['gain']:+.2f} | {c['pub_bestfit']:.2f} | "
                      f"{c['pub_fgd']:.2f} | {c['pub_gain']:+.2f} | {-c['shortfall']:+.2f} |")
        else:
            md.append(f"| {name} | {c['bestfit']:.2f} | {c['fgd']:.2f} | {c['gain']:+.2f} | – | – | – | – |")
    if args.notes:
        md += ["", args.notes.read_text().rstrip()]
    (args.out.parent / f"{args.out.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
