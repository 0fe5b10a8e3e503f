"""What an event pair adds to a kernel's time (issue 12): the pacer charges a launch from the time between
two CUDA events around it, and the packing benchmark found the charge per ResNet-50 request 1.35-1.40x
what the request costs the GPU when queued eagerly (the eager ruler), at every N, with no clean pair.

Measurements on an idle GPU, printed as one JSON object per line and a short summary:
  1. one ResNet-50 service (bench/gpu/packing_worker.py) under gpuslice with a 50 % hard share and
     nothing else on the device, so every pair is clean: what it is charged per request (the enforcer's
     counters, gpuslice_pacer_stats), against the eager ruler taken in a process without gpuslice
  2. the same service with every launch measured (the enforcer built with GS_COST_SAMPLE_EVERY=1 when
     PROBE_LIB_EVERY1 names such a build): per-kernel pair time summed over a request
The events' own cost, with the CPU taken out of it, is bench/gpu/event_overhead.py's. (The 2026-11-28 run
of this script, 2026-11-28-h200-pair-probe.json, still timed events from Python, which measured the
CPU, and took the eager ruler inside the paced service, which its share slowed: both are fixed here.)

  python3 bench/gpu/pair_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))
from gpuslice.enforcer.slicefile import write_slice_file  # noqa: E402


def worker(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "packing_worker.py"), "--kind", "resnet50", "--batch", "8"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)


def ask(p: subprocess.Popen, msg: dict) -> dict:
    p.stdin.write(json.dumps(msg) + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def stop(p: subprocess.Popen) -> None:
    try:
        p.stdin.write('{"quit": 1}\n')
        p.stdin.flush()
        p.wait(20)
    except (OSError, subprocess.TimeoutExpired):
        p.kill()


def eager_ruler() -> dict:
    """The request's GPU time, from a process without gpuslice (a paced one would be slowed by its share)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GPUSLICE_SLICE")}
    p = worker({**env, "PYTHONUNBUFFERED": "1"})
    try:
        json.loads(p.stdout.readline())
        return ask(p, {"calibrate": 50})
    finally:
        stop(p)


def service(lib: str, tmp: Path, seconds: float, cal: dict) -> dict:
    sf = tmp / "probe.slice"
    write_slice_file(sf, grant="probe", compute=50, mode="hard", priority=1, memory_limit=8 * 2**30,
                     device_state_dir=str(tmp / "state"), log_level="warn")
    env = {**os.environ, "LD_PRELOAD": lib, "GPUSLICE_SLICE": str(sf), "PYTHONUNBUFFERED": "1"}
    p = worker(env)
    try:
        json.loads(p.stdout.readline())
        t0 = time.time() + 0.2
        run = ask(p, {"run": [t0, t0 + 0.5, t0 + seconds]})
    finally:
        stop(p)
    c, n = run.get("pacer") or {}, run.get("iters") or 0
    out = {"lib": lib, "iters": n, "eager_ms": 1e3 * (cal.get("eager_s_per_iter") or 0),
           "graph_ms": 1e3 * cal["gpu_s_per_iter"], "counters": c}
    if c and n:
        charged = (c["launch_charged_ns"] + c["clean_cost_ns"] - c["clean_launch_ns"] + c["dirty_cost_ns"]
                   - c["dirty_launch_ns"])
        out["charged_ms_per_req"] = charged / n / 1e6
        out["launches_per_req"] = c["launches"] / n
        out["clean_us_per_pair"] = c["clean_cost_ns"] / max(1, c["clean"]) / 1e3
        out["pairs_per_req"] = c["measured"] / n
        out["gap_pairs"] = c["gap_pairs"]
        if out["eager_ms"]:
            out["charged_over_eager"] = out["charged_ms_per_req"] / out["eager_ms"]
            out["excess_us_per_launch"] = 1e3 * (out["charged_ms_per_req"] - out["eager_ms"]) / out["launches_per_req"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cal = eager_ruler()
    res = {"calibration": cal}
    libs = [("shipped", str(ROOT / "native" / "build" / "libgpuslice.so"))]
    if os.environ.get("PROBE_LIB_EVERY1"):
        libs.append(("every launch measured", os.environ["PROBE_LIB_EVERY1"]))
    for name, lib in libs:
        with tempfile.TemporaryDirectory() as tmp:
            res[name] = service(lib, Path(tmp), a.seconds, cal)
        print(json.dumps({name: res[name]}), flush=True)
    (out / "pair-probe.json").write_text(json.dumps(res, indent=1))
    for name, _ in libs:
        r = res[name]
        print(f"{name}: charged {r.get('charged_ms_per_req', 0):.3f} ms/request alone (all pairs clean: "
              f"{r['counters'].get('clean', 0)} of {r['counters'].get('measured', 0)}), eager ruler {r['eager_ms']:.3f} "
              f"({r.get('charged_over_eager', 0):.2f}x, {r.get('excess_us_per_launch', 0):.2f} us per launch over); "
              f"{r.get('clean_us_per_pair', 0):.2f} us per clean pair, {r.get('pairs_per_req', 0):.1f} pairs a request")


if __name__ == "__main__":
    main()
