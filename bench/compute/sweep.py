"""Two focused compute experiments on one real GPU (about 3 minutes), beside run_compute_bench.sh:

  priority   the priority scenario of run_compute_bench.sh (ResNet-18 inference, high priority, alone
             for 5 s then beside a low-priority ResNet-50 trainer for 6 s) once per build variant of
             the enforcer (-D overrides of the YIELD_* constants, see native/include/gpuslice/
             controller.h) and once without the enforcer: p50/p99 alone and beside, and what the
             trainer kept of its exclusive throughput. It shows the trade-off the constants make.
  overhead   the enforcer at share 100 % vs no enforcer, matmul and ResNet-50, in ABBA order
             (plain, enforcer, enforcer, plain, ...) so that a drift of the GPU's clock or temperature
             during the run cancels: the overhead is the mean over pairs, with its spread. A single
             pair of 5-s runs (as in run_compute_bench.sh) cannot resolve 0.5 % on a card whose
             power-capped clock moves by more than that.

Usage: python3 bench/compute/sweep.py [--out DIR] [--pairs N] [--only priority|overhead]
Writes DIR/sweep.txt (the tables, also printed) and DIR/sweep-raw.tgz (every workload's JSON).
Processes of the next run import torch while the current one runs and wait at a gate file before
touching the GPU, so imports cost no measured time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

sys.path.insert(0, str(HERE.parent / "gpu"))

import call_cost  # noqa: E402
from analyze import percentile, rate, span  # noqa: E402

# overridable for a dry run of the orchestration without a GPU (as in run_compute_bench.sh)
WORKLOAD = os.environ.get("GS_BENCH_WORKLOAD", f"{sys.executable} {HERE / 'workload.py'}").split()

# name -> extra compiler flags; "default" is the library as built by make.
# GS_SWEEP_VARIANTS="name=flags;name=flags" replaces the set (flags may be empty: as built).
VARIANTS = {
    "default": "",
    # the yield path's constants (issue 13; controller.h): the PRIO_* ones they replaced are gone
    "gap-100us": "-DGS_CTL_YIELD_GAP_NS=100000LL",
    "queue-100us": "-DGS_CTL_YIELD_QUEUE_NS=100000LL",
    "queue-300us": "-DGS_CTL_YIELD_QUEUE_NS=300000LL",
}
if os.environ.get("GS_SWEEP_VARIANTS"):
    VARIANTS = dict(v.split("=", 1) for v in os.environ["GS_SWEEP_VARIANTS"].split(";"))


def build_variant(name: str, flags: str, where: Path) -> Path:
    if not flags:
        lib = ROOT / "native" / "build" / "libgpuslice.so"
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/libgpuslice.so"], check=True)
        return lib
    b = where / f"lib-{name}"
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), f"B={b}", f"CFLAGS=-O2 -g {flags}", f"{b}/libgpuslice.so"],
                   check=True)
    return b / "libgpuslice.so"


def slice_file(tmp: Path, name: str, priority: int, compute: int = 100, extra: str = "", mode: str = "hard") -> Path:
    """A slice file in ``tmp`` whose processes coordinate through ``tmp/state``, with a region of its own (as the
    agent's slices: the pacer keeps the slice's credit there, issue 15)."""
    f = tmp / f"{name}.slice"
    f.write_text(f"version=1\ngrant={name}\ncompute={compute}\nmode={mode}\npriority={priority}\nweight=1\n"
                 f"device_state_dir={tmp / 'state'}\nregion={tmp / (name + '.region')}\nlog_level=warn\n{extra}")
    return f


class Runner:
    """Runs groups of workload processes one after another; the next group imports meanwhile."""

    def __init__(self, tmp: Path, raw: Path):
        self.tmp, self.raw, self.n = tmp, raw, 0
        self.state = tmp / "state"
        self.state.mkdir()

    def start(self, procs: list[dict]) -> dict:
        """procs: [{name, lib|None, priority, args}] -> a started group (waiting at its gate)."""
        self.n += 1
        gate, bar = self.tmp / f"gate.{self.n}", self.tmp / f"bar.{self.n}"
        out = []
        for p in procs:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            cmd = [*WORKLOAD, "--gate", str(gate), "--out", str(self.raw / f"{p['name']}.json")]
            if len(procs) > 1:
                cmd += ["--barrier", str(bar), "--peers", str(len(procs))]
            if p.get("lib"):
                env["LD_PRELOAD"] = str(p["lib"])
                env["GPUSLICE_SLICE"] = str(slice_file(self.tmp, p["name"], p.get("priority", 0),
                                                       p.get("compute", 100), p.get("extra", "")))
                cmd += ["--state-dir", str(self.state), "--grant", p["name"]]
            err = open(self.raw / f"{p['name']}.err", "ab")
            out.append(subprocess.Popen(cmd + p["args"], env=env, stderr=err, stdout=err))
        return {"gate": gate, "procs": out, "names": [p["name"] for p in procs]}

    @staticmethod
    def finish(group: dict, limit: float = 60.0) -> None:
        group["gate"].touch()
        deadline = time.time() + limit
        for p in group["procs"]:
            try:
                p.wait(max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                print(f"killed a process of {group['names']} that ran past {limit:.0f} s", file=sys.stderr)

    def run_all(self, groups: list[list[dict]]) -> None:
        pending = self.start(groups[0])
        for nxt in groups[1:] + [None]:
            current = pending
            pending = self.start(nxt) if nxt else None
            print(f"[{time.strftime('%H:%M:%S')}] {', '.join(current['names'])}", flush=True)
            self.finish(current)


def load(raw: Path, name: str) -> dict | None:
    f = raw / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None


def priority_groups(libs: dict[str, Path], repeats: int) -> list[list[dict]]:
    """One exclusive trainer run (the throughput reference), then every variant and no enforcer,
    `repeats` times, in forward then reverse order (ABBA: a drift of the machine hits all alike)."""
    groups = [[{"name": "excl_resnet", "args": ["--kind", "resnet", "--schedule", "x:5"]}]]
    items = list(libs.items()) + [("none", None)]
    for k in range(repeats):
        for v, lib in (items if k % 2 == 0 else items[::-1]):
            groups.append([
                {"name": f"infer_{v}_{k}", "lib": lib, "priority": 0, "args": ["--kind", "infer", "--schedule", "x:11"]},
                {"name": f"train_{v}_{k}", "lib": lib, "priority": 1,
                 "args": ["--kind", "resnet", "--schedule", "x:6", "--delay", "5"]},
            ])
    return groups


# kind -> (seconds, slice): matmul and ResNet-50 under a slice at share 100 % and high priority
# (issue 4's "overhead of pacing when the share is 100 %"); the launch-heavy MLP under a memory-only
# slice as `gpuslice run --memory 16GiB` makes it (compute 0, low priority: issue 3's "training loop
# with vs without the enforcer, no compute limit").
OVERHEAD = {"matmul": (4, {"priority": 0, "compute": 100}), "resnet": (5, {"priority": 0, "compute": 100}),
            "mlp": (4, {"priority": 1, "compute": 0, "extra": "memory_limit=17179869184\n"})}


def overhead_groups(lib: Path, pairs: int) -> list[list[dict]]:
    groups = []
    for kind, (secs, sl) in OVERHEAD.items():
        for k in range(pairs):
            order = ("plain", "enf") if k % 2 == 0 else ("enf", "plain")  # ABBA: drift cancels
            for who in order:
                groups.append([{"name": f"ovh_{kind}_{k}_{who}", "lib": lib if who == "enf" else None, **sl,
                                "args": ["--kind", kind, "--schedule", f"x:{secs}"]}])
    return groups


def launch_cost(lib: Path, tmp: Path) -> list[str]:
    """ns per call of bench/enforcer_overhead.c (best of 3 x 20000) per slice configuration."""
    exe = call_cost.build(tmp)
    modes = {"plain": None,
             "memory only (compute 0, low)": slice_file(tmp, "lc_mem", 1, 0, "memory_limit=17179869184\n"),
             "share 100, high": slice_file(tmp, "lc_100", 0, 100),
             "share 50, high (paced)": slice_file(tmp, "lc_50", 0, 50),
             "mode off": slice_file(tmp, "lc_off", 1, 0, "memory_limit=17179869184\n", mode="off")}
    rows: dict[str, dict] = {}
    for mode, sl in modes.items():
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GPUSLICE_SLICE")}
        if sl:
            env.update(LD_PRELOAD=str(lib), GPUSLICE_SLICE=str(sl))
        rows[mode] = {k: v for k, v in call_cost.best_ns(exe, env).items() if k != "error"}
    keys = list(rows["plain"])
    lines = ["-- ns per call (bench/enforcer_overhead.c, best of 3 x 20000), by slice configuration",
             f"{'slice':30} " + " ".join(f"{k[:24]:>24}" for k in keys)]
    for mode, best in rows.items():
        lines.append(f"{mode:30} " + " ".join(f"{best.get(k, float('nan')):24.1f}" for k in keys))
    return lines


def _latencies(raw: Path, v: str, k: int) -> tuple[list[float], list[float], float, float] | None:
    i, t = load(raw, f"infer_{v}_{k}"), load(raw, f"train_{v}_{k}")
    if not i or not t:
        return None
    ts0, ts1 = t["phases"][0]["t0"], t["phases"][0]["t1"]
    alone = [x * 1e3 for t0, x in i["latency"] if i["phases"][0]["t0"] + 0.5 <= t0 < ts0]
    beside = [x * 1e3 for t0, x in i["latency"] if ts0 + 0.5 <= t0 < ts1]
    return alone, beside, rate(t, ts0 + 0.5, ts1), ts1 - ts0


def priority_table(raw: Path, variants: list[str], repeats: int) -> list[str]:
    lines = ["-- priority: ResNet-18 inference (high, batch 8, 2 ms think) alone 5 s, then beside a low-priority",
             "   ResNet-50 trainer 6 s (goal: p99 beside <= 1.3x alone); one enforcer build per variant, each run",
             f"   {repeats}x in ABBA order; 'all' pools the runs' requests; vs-none = p99 beside / no enforcer's p99 alone",
             f"{'variant':18} {'alone p50':>9} {'p99':>6} | {'beside p50':>10} {'p99':>6} | {'p99 ratio':>9} {'vs-none':>7} | "
             f"{'trainer % of excl':>17} | requests"]
    ex = load(raw, "excl_resnet")
    xr = rate(ex, *span(ex, 0, 0.5)) if ex else None
    runs = {v: [r for k in range(repeats) if (r := _latencies(raw, v, k))] for v in variants}
    none_alone = [x for r in runs.get("none", []) for x in r[0]]
    ref = percentile(none_alone, 99) if len(none_alone) >= 10 else None
    for v in variants:
        rows = [(f"{v} #{k}", [r]) for k, r in enumerate(runs[v])] + ([(f"{v} all", runs[v])] if len(runs[v]) > 1 else [])
        if not rows:
            lines.append(f"{v:18} missing")
        for label, rs in rows:
            alone, beside = [x for r in rs for x in r[0]], [x for r in rs for x in r[1]]
            if len(alone) < 10 or len(beside) < 10:
                lines.append(f"{label:18} too few requests ({len(alone)}, {len(beside)})")
                continue
            a50, a99, b50, b99 = (percentile(alone, 50), percentile(alone, 99), percentile(beside, 50),
                                  percentile(beside, 99))
            tr = 100 * statistics.fmean(r[2] for r in rs) / xr if xr else float("nan")
            vs = f"{b99 / ref:7.2f}" if ref else "      -"
            lines.append(f"{label:18} {a50:9.2f} {a99:6.2f} | {b50:10.2f} {b99:6.2f} | {b99 / a99:9.2f} {vs} | {tr:17.1f} | "
                         f"{len(alone)}/{len(beside)}")
    return lines


def overhead_table(raw: Path, pairs: int) -> list[str]:
    lines = ["-- overhead, ABBA pairs of runs: matmul and ResNet-50 at share 100 % (high priority), the MLP under",
             "   a memory-only slice (compute 0, low priority); goal <= 0.5 %",
             f"{'workload':8} {'pairs':>5} | {'plain':>9} {'enforcer':>9} | {'overhead mean':>13} {'min':>6} {'max':>6} "
             f"{'stdev':>6} | per pair"]
    for kind in OVERHEAD:
        per, pl, en = [], [], []
        for k in range(pairs):
            p, e = load(raw, f"ovh_{kind}_{k}_plain"), load(raw, f"ovh_{kind}_{k}_enf")
            if not p or not e:
                continue
            rp, re_ = rate(p, *span(p, 0, 0.5)), rate(e, *span(e, 0, 0.5))
            if rp <= 0:
                continue
            pl.append(rp)
            en.append(re_)
            per.append(100 * (1 - re_ / rp))
        if not per:
            lines.append(f"{kind:8} missing")
            continue
        sd = statistics.stdev(per) if len(per) > 1 else 0.0
        lines.append(f"{kind:8} {len(per):5d} | {statistics.fmean(pl):9.2f} {statistics.fmean(en):9.2f} | "
                     f"{statistics.fmean(per):+13.2f} {min(per):+6.2f} {max(per):+6.2f} {sd:6.2f} | "
                     + " ".join(f"{x:+.2f}" for x in per))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/gpuslice-out"), "sweep"))
    ap.add_argument("--pairs", type=int, default=4, help="ABBA pairs per workload in the overhead runs")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each priority variant (ABBA order)")
    ap.add_argument("--only", choices=["priority", "overhead", "launch"])
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gs-sweep."))
    raw = tmp / "raw"
    raw.mkdir()
    try:
        libs = {v: build_variant(v, f, tmp) for v, f in VARIANTS.items()}
        runner = Runner(tmp, raw)
        groups = []
        if a.only in (None, "priority"):
            groups += priority_groups(libs, a.repeats)
        if a.only in (None, "overhead"):
            groups += overhead_groups(libs["default"], a.pairs)
        if groups:
            runner.run_all(groups)
        smi = shutil.which("nvidia-smi")
        env = subprocess.run([smi, "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip() if smi else "no nvidia-smi"
        lines = [f"== gpuslice compute sweep: {time.strftime('%Y-%m-%d %H:%M:%S %Z')} | {env}"]
        if a.only in (None, "priority"):
            lines += priority_table(raw, list(VARIANTS) + ["none"], a.repeats)
            lines += ["   variants: " + "; ".join(f"{v}: {f or 'as built'}" for v, f in VARIANTS.items())]
        if a.only in (None, "overhead"):
            lines += overhead_table(raw, a.pairs)
        if a.only in (None, "launch"):
            lines += launch_cost(libs["default"], tmp)
        text = "\n".join(lines)
        (out / "sweep.txt").write_text(text + "\n")
        with tarfile.open(out / "sweep-raw.tgz", "w:gz") as tf:
            tf.add(raw, arcname="raw")
        print(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
