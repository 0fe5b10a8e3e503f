"""`make bench`: every benchmark that needs no GPU, in one go, with a short table last.

    enforcer   added cost per intercepted call (ns) over the CPU driver double: plain / LD_PRELOAD
               without a slice / enforcing (compute 0) / enforcing with mode=off; best of N runs
    placement  filter + score of one request at 100 / 1,000 / 5,000 nodes × 8 GPUs, per policy
               (bench/placement_latency.py)
    extender   the scheduler extender's filter + prioritize at 1,000 / 5,000 nodes
               (bench/extender_latency.py)
    simulate   the full openb replay (default trace, every policy, one worker): wall seconds and the
               side-by-side table of `gpuslice simulate`

Every section writes its own log under --out (default bench/results/<UTC date>-cpu-bench/), and
summary.txt holds the table printed last. GPU benchmarks live in bench/gpu_all.sh (device machine).

    .venv/bin/python bench/run_cpu_benchmarks.py [--only enforcer,placement] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native" / "build"
SECTIONS = ("enforcer", "placement", "extender", "simulate")


class BenchError(RuntimeError):
    """A benchmark step failed; the message names the step and where its log is."""


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    """Run one step, keep its whole output in ``log``, fail loudly with the log's tail."""
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    text = proc.stdout + proc.stderr
    log.write_text(f"$ {' '.join(cmd)}\n# {time.monotonic() - started:.1f} s, rc={proc.returncode}\n{text}")
    if proc.returncode != 0:
        raise BenchError(f"{cmd[0]} … failed (rc={proc.returncode}); see {log}:\n" + "\n".join(text.splitlines()[-15:]))
    return proc.stdout


# ------------------------------------------------------------------------------------------ enforcer
def enforcer(out: Path, quick: bool) -> list[str]:
    """ns per call over the CPU double; the double hands out unbacked addresses (GSDOUBLE_NOBACK) so
    only the enforcer's own work and the call path are timed."""
    binary = NATIVE / "bench" / "enforcer_overhead"
    binary.parent.mkdir(parents=True, exist_ok=True)
    run(["make", "-s", "-C", "native", "all"], out / "enforcer-build.log")
    run(["cc", "-O2", "-std=c11", "bench/enforcer_overhead.c", "-o", str(binary), "-ldl"], out / "enforcer-cc.log")
    tmp = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    slices = {}
    for name, extra in (("enforcing", ""), ("mode_off", "mode=off\n")):
        f = tmp / f"{name}.slice"
        f.write_text(f"version=1\ngrant=bench-{name}\nmemory_limit=1TiB\ncompute=0\n{extra}"
                     f"region={tmp / name}.region\ndevice_state_dir={tmp}/devstate\nlog_level=warn\n")
        slices[name] = f
    base = {"LD_LIBRARY_PATH": str(NATIVE / "double"), "GSDOUBLE_NOBACK": "1"}
    configs = {
        "plain": {},
        "preload, no slice": {"LD_PRELOAD": str(NATIVE / "libgpuslice.so")},
        "enforcing": {"LD_PRELOAD": str(NATIVE / "libgpuslice.so"), "GPUSLICE_SLICE": str(slices["enforcing"])},
        "enforcing, mode=off": {"LD_PRELOAD": str(NATIVE / "libgpuslice.so"), "GPUSLICE_SLICE": str(slices["mode_off"])},
    }
    runs, iters = (2, 20000) if quick else (5, 200000)
    best: dict[str, dict[str, float]] = {}
    with (out / "enforcer.log").open("w") as log:
        for label, env in configs.items():
            for k in range(runs):
                text = run([str(binary), str(iters)], out / "enforcer-last.log", {**base, **env})
                log.write(f"[{label} #{k}]\n{text}")
                for line in text.splitlines():
                    name, _, value = line.rpartition(" ")
                    if value not in ("n/a", ""):
                        cur = best.setdefault(name, {})
                        cur[label] = min(cur.get(label, float("inf")), float(value))
    (out / "enforcer-last.log").unlink(missing_ok=True)
    rows = [f"enforcer: ns per call over the CPU driver double, best of {runs} × {iters} calls"]
    rows.append(f"  {'call':36} " + " ".join(f"{c:>20}" for c in configs))
    for name, per in best.items():
        rows.append(f"  {name:36} " + " ".join(f"{per.get(c, float('nan')):20.1f}" for c in configs))
    alloc = best.get("cuMemAlloc_v2+cuMemFree_v2_1MiB", {})
    if alloc:
        rows.append(f"  -> enforcing adds {alloc['enforcing'] - alloc['plain']:.0f} ns per alloc+free pair")
    launch = best.get("cuLaunchKernel_empty", {})
    if launch:
        rows.append(f"  -> enforcing adds {launch['enforcing'] - launch['plain']:.0f} ns per launch "
                    f"(mode=off: {launch['enforcing, mode=off'] - launch['plain']:.0f} ns)")
    return rows


# ----------------------------------------------------------------------------------------- placement
def placement(out: Path, quick: bool) -> list[str]:
    target = out / "placement-latency.txt"
    args = ["--sizes", "100,1000" if quick else "100,1000,5000", "--calls", "100" if quick else "1000"]
    run([sys.executable, "bench/placement_latency.py", *args, "--out", str(target)], out / "placement.log")
    return [f"placement: {_shown(target)}"] + _table_lines(target.read_text())


def extender(out: Path, quick: bool) -> list[str]:
    target = out / "extender-latency.txt"
    args = ["--nodes", "1000"] if quick else []
    run([sys.executable, "bench/extender_latency.py", *args, "--out", str(target)], out / "extender.log")
    return [f"extender: {_shown(target)}"] + _table_lines(target.read_text())


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _table_lines(text: str) -> list[str]:
    """The table of a results file: its lines that are not ``#`` comments."""
    return ["  " + ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")][:40]


def simulate(out: Path, quick: bool) -> list[str]:
    data = ROOT / "bench" / "data"
    cmd = [str(Path(sys.executable).parent / "gpuslice"), "simulate",
           "--trace", str(data / "openb_pod_list_default.csv"), "--nodes", str(data / "openb_node_list_gpu_node.csv"),
           "--policy", "fgd,bestfit,binpack" if quick else "fgd,bestfit,binpack,spread,random",
           "--workers", "1", "--out", str(out / "simulate")]
    started = time.monotonic()
    text = run(cmd, out / "simulate.log", {"COLUMNS": "200"})
    wall = time.monotonic() - started
    rows = [f"simulate: full openb default replay, every policy, one worker: {wall:.1f} s wall"]
    rows += ["  " + ln for ln in text.splitlines() if "│" in ln or "┃" in ln]
    return rows


# ------------------------------------------------------------------------------------------ main
def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
            f"load {load:.2f} at start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ", ".join(SECTIONS))
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown or not chosen:
        ap.error(f"--only: {', '.join(unknown) or '(empty)'} is not allowed; choose from {', '.join(SECTIONS)}")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    out = (args.out or ROOT / "bench" / "results" / f"{today}-cpu-bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary = [f"gpuslice CPU benchmarks, {today}{' (quick: smoke sizes)' if args.quick else ''}", machine(), ""]
    failed = []
    for name in chosen:
        started = time.monotonic()
        print(f"== {name} …", flush=True)
        try:
            rows = globals()[name](out, args.quick)
        except (BenchError, subprocess.TimeoutExpired, OSError) as exc:
            failed.append(name)
            rows = [f"{name}: FAILED: {exc}"]
        summary += rows + [f"  ({time.monotonic() - started:.0f} s)", ""]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
