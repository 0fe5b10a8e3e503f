"""The pair-bias measurement on a real GPU, in the situations an attacker's review named (issue 12; the
measurement is native/src/pacing/pairbias.c: once per paced process and device, at that process's first
launch, PTX kernels behind a hold on a private stream, waits polled and cut at 100 ms).

Each case is a fresh process (the measurement runs at a process's first launch) with gpuslice preloaded and
a 50 % hard slice, using CuPy kernels (no launch happens before the one the case means: memory is zeroed
with cudaMemset, kernels are loaded before anything is launched):
  alone          nothing else on the GPU: how long the first launch takes, and the bias found
  behind-busy    another process (no gpuslice) keeps the GPU busy with 20-ms kernels meanwhile
  own-busy       another thread of the same process fills every SM with 40-ms kernels just as this
                 thread's first launch measures (which may then give up: pairs charged raw)
  capture-this   the first launch is made inside a global-mode stream capture on the same thread: the
                 capture must stay valid and the graph must replay correctly
  capture-other  another thread holds a global-mode capture open while this thread's first launch measures
  pending        a build whose waits are cut at 0.1 ms (PAIRBIAS_LIB_SHORTWAIT, built -DGS_PB_WAIT_NS=100000):
                 the measurement gives up with its kernels still queued, so its stream and events are
                 destroyed and its module kept loaded while they run; later work must be correct and the
                 process must exit cleanly
Every case checks its kernels' results. A JSON line per case, then a table.

  python3 bench/gpu/pairbias_checks.py [--lib native/build/libgpuslice.so] [--out DIR]
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

SRC = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void add1(int *x) { if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(x, 1); }
"""

# The child: one case, in a process whose first kernel launch is the one the case is about.
CHILD = r"""
import ctypes, json, sys, threading, time
import cupy as cp
case = sys.argv[1]
mod = cp.RawModule(code=SRC)
spin, add1 = mod.get_function("spin"), mod.get_function("add1")
clock = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1e3
x = cp.cuda.alloc(4)
cp.cuda.runtime.memset(x.ptr, 0, 4)          # no kernel launch
def value():
    h = ctypes.c_int(0)
    cp.cuda.runtime.memcpy(ctypes.addressof(h), x.ptr, 4, 2)   # device to host
    return h.value
rec = {"case": case}
GLOBAL = getattr(cp.cuda.runtime, "streamCaptureModeGlobal", 0)
s = cp.cuda.Stream(non_blocking=True)
t0 = time.perf_counter()
if case in ("alone", "behind-busy", "pending"):
    add1((1,), (32,), (x,), stream=s)
    s.synchronize()
    rec["first_launch_ms"] = 1e3 * (time.perf_counter() - t0)
    for _ in range(99):
        add1((1,), (32,), (x,), stream=s)
    s.synchronize()
    rec["ok"] = value() == 100
elif case == "own-busy":
    # another thread of this process fills every SM with 40-ms kernels while this thread's first launch
    # measures: the measurement's kernels wait behind them (it may give up: then pairs are charged raw)
    go = threading.Barrier(2)
    def filler():
        s2 = cp.cuda.Stream(non_blocking=True)
        go.wait()
        for _ in range(5):
            spin((132 * 8,), (1024,), (cp.int64(int(0.01 * clock)),), stream=s2)
        s2.synchronize()
    th = threading.Thread(target=filler)
    th.start()
    go.wait()
    time.sleep(0.002)
    t0 = time.perf_counter()
    add1((1,), (32,), (x,), stream=s)
    s.synchronize()
    rec["first_launch_ms"] = 1e3 * (time.perf_counter() - t0)
    th.join(60)
    rec["ok"] = value() == 1
elif case == "capture-this":
    g = None
    s.begin_capture(mode=GLOBAL)
    for _ in range(10):
        add1((1,), (32,), (x,), stream=s)
    g = s.end_capture()
    rec["first_launch_ms"] = 1e3 * (time.perf_counter() - t0)
    for _ in range(3):
        g.launch(stream=s)
    s.synchronize()
    rec["ok"] = value() == 30
elif case == "capture-other":
    began, launched, err = threading.Event(), threading.Event(), []
    def capturer():
        try:
            sc = cp.cuda.Stream(non_blocking=True)
            sc.begin_capture(mode=GLOBAL)
            began.set()
            launched.wait(30)
            for _ in range(10):
                add1((1,), (32,), (x,), stream=sc)
            gr = sc.end_capture()
            gr.launch(stream=sc)
            sc.synchronize()
        except Exception as e:   # noqa: BLE001 - reported, not raised in a thread
            err.append(repr(e))
            began.set()
    th = threading.Thread(target=capturer)
    th.start()
    began.wait(30)
    t0 = time.perf_counter()
    add1((1,), (32,), (x,), stream=s)     # this thread's first launch: the measurement runs here
    s.synchronize()
    rec["first_launch_ms"] = 1e3 * (time.perf_counter() - t0)
    launched.set()
    th.join(60)
    rec["capture_error"] = err[0] if err else None
    rec["ok"] = not err and value() == 11
try:
    fn = ctypes.CDLL(None).gpuslice_pacer_stats
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
    buf = ctypes.create_string_buffer(2048)
    n = fn(0, buf, len(buf))
    rec["pair_bias_ns"] = json.loads(buf.value).get("pair_bias_ns") if 0 < n < len(buf) else None
except AttributeError:
    rec["pair_bias_ns"] = None
print(json.dumps(rec), flush=True)
"""

BUSY = r"""
import sys, time
import cupy as cp
k = cp.RawModule(code=SRC).get_function("spin")
clock = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1e3
s = cp.cuda.Stream(non_blocking=True)
print("up", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(4):
        k((132,), (32,), (cp.int64(int(0.02 * clock)),), stream=s)
    s.synchronize()
"""


def child_env(lib: str, tmp: Path) -> dict[str, str]:
    from gpuslice.enforcer.slicefile import write_slice_file

    sf = tmp / "checks.slice"
    write_slice_file(sf, grant="pbcheck", compute=50, mode="hard", priority=1, memory_limit=8 * 2**30,
                     device_state_dir=str(tmp / "state"), log_level="info")
    return {**os.environ, "LD_PRELOAD": lib, "GPUSLICE_SLICE": str(sf), "PYTHONUNBUFFERED": "1"}


def run_case(case: str, lib: str, busy: bool = False) -> dict:
    code = f"SRC = {SRC!r}\n"
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(lib, Path(tmp))
        bg = None
        if busy:
            plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GPUSLICE_SLICE")}
            bg = subprocess.Popen([sys.executable, "-c", code + BUSY, "60"], env=plain, stdout=subprocess.PIPE,
                                  text=True)
            bg.stdout.readline()
            time.sleep(1.0)  # its kernels queued and running (a start-up condition, not a test wait)
        try:
            p = subprocess.run([sys.executable, "-c", code + CHILD, case], env=env, capture_output=True, text=True,
                               timeout=120)
        finally:
            if bg:
                bg.kill()
                bg.wait()
    rec = {"case": case, "ok": False}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
    rec["rc"] = p.returncode
    rec["lib"] = lib
    rec["log"] = [ln for ln in p.stderr.splitlines() if "timing pair" in ln or "rror" in ln][-3:]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=str(ROOT / "native" / "build" / "libgpuslice.so"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cases = [("alone", a.lib, False), ("behind-busy", a.lib, True), ("own-busy", a.lib, False),
             ("capture-this", a.lib, False), ("capture-other", a.lib, False), ("alone", a.lib, False)]
    short = os.environ.get("PAIRBIAS_LIB_SHORTWAIT")
    if short:
        cases.append(("pending", short, False))
    recs = []
    for case, lib, busy in cases:
        r = run_case(case, lib, busy)
        recs.append(r)
        print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "pairbias-checks.json").write_text(json.dumps(recs, indent=1))
    print(f"\n{'case':14} {'ok':4} {'rc':3} {'first launch ms':>16} {'bias ns':>8}  enforcer said")
    for r in recs:
        said = (r["log"][-1].split("compute: ", 1)[-1] if r["log"] else "")[:90]
        fl = r.get("first_launch_ms")
        print(f"{r['case']:14} {'yes' if r.get('ok') and r['rc'] == 0 else 'NO':4} {r['rc']:3} "
              f"{(f'{fl:.1f}' if fl is not None else '-'):>16} {str(r.get('pair_bias_ns')):>8}  {said}")


if __name__ == "__main__":
    main()
