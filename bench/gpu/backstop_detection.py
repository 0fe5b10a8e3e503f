"""How fast the backstop sees and ends a slice over its memory limit on a real GPU (issue 15); run it with
``bash bench/backstop_detection.sh``.

A root-less ``gpuslice agent`` (its own state dir, real NVML, ``--interval 0.5 --backstop kill
--backstop-grace 2``) and, per trial, one ``gpuslice run`` whose processes step around the enforcer:

* ``nvml``    — baseline, no gpuslice: a process allocates 2 GiB; NVML is polled every 5 ms until it shows
  the bytes: the floor of any NVML-based detection (the driver's own refresh);
* ``bypass``  — a 2 GiB slice whose one process clears ``LD_PRELOAD`` and allocates 4 GiB;
* ``collude`` — a 3 GiB slice whose three processes, without the enforcer, allocate 1.5 GiB each (each under
  the limit, 4.5 GiB together: what processes rewriting their shared region could reach);
* ``honest``  — a 3 GiB slice whose process, with the enforcer, allocates in 256 MiB steps until refused and
  holds it for 3 × the grace: must never be reported nor killed (the tolerance against false positives).

Per trial: ``alloc`` (the process says its allocation is done, time.time()), ``reported`` (the agent's
/v1/status first lists the overrun, polled every 20 ms) and ``ended`` (the process is gone). Scenario order
alternates (ABBA) over ``--repeats`` rounds; the table gives median, min and max. About 5 minutes on an H100;
every trial is bounded at 60 s. Writes ``$OUT/backstop.jsonl``, ``$OUT/agent.log``, ``$OUT/summary.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpuslice-backstop-"))
GiB = 1 << 30

# The workload: allocate `gib` GiB (in one block, or in 256 MiB steps until refused with --fill), say when, hold.
WORKER = r"""
import os, sys, time, torch
gib, fill, hold = float(sys.argv[1]), sys.argv[2] == "fill", float(sys.argv[3])
torch.cuda.init(); torch.empty(1, device="cuda")
held = []
if fill:
    while True:
        try:
            held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        except RuntimeError:
            break
else:
    held.append(torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda"))
torch.cuda.synchronize()
# one write per line: colluding workers share the pipe, and an unbuffered stdout (PYTHONUNBUFFERED) writes
# the text of a print and its newline apart, so two lines could interleave ({...}{...}\n, seen in CI)
print(json.dumps({"pid": os.getpid(), "alloc": time.time(), "held": sum(t.numel() for t in held)}) + "\n", end="", flush=True)
time.sleep(hold)
""".replace("import os, sys", "import json, os, sys")


def status(sock: Path) -> dict:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as http:
        return http.get("http://agent/v1/status").json()


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# --dry-run (a machine without a GPU): the same agent and runs, NVML stood in for by $GPUSLICE_GPU_PROCESSES,
# which this worker fills with what the GPU worker would hold; it checks the script and the agent's path.
DRY_WORKER = r"""
import fcntl, json, os, sys, time
gib, fill, hold = float(sys.argv[1]), sys.argv[2] == "fill", float(sys.argv[3])
held = int((2.9 if fill else gib) * (1 << 30))
path = os.environ["GPUSLICE_GPU_PROCESSES"]
with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    entries = json.load(open(path))
    entries.append({"uuid": os.environ["GS_DRY_UUID"], "pid": os.getpid(), "used": held})
    json.dump(entries, open(path + ".tmp", "w"))
    os.replace(path + ".tmp", path)
print(json.dumps({"pid": os.getpid(), "alloc": time.time(), "held": held}) + "\n", end="", flush=True)
time.sleep(hold)
"""


def collude_script(py: str, worker: str) -> str:
    """The shell line that starts three workers in one slice, each bypassing the enforcer: the worker's source
    quoted for the shell whatever it holds (an apostrophe in a comment of it once ended the quoting early, and the
    GPU run's colluding workers never started)."""
    return f"for i in 1 2 3; do env -u LD_PRELOAD {shlex.quote(py)} -c {shlex.quote(worker)} 1.5 one 60 & done; wait"


def run_trial(name: str, env: dict, sock: Path, grace: float) -> dict:
    global WORKER
    py = sys.executable
    if env.get("GPUSLICE_GPU_PROCESSES"):
        WORKER = DRY_WORKER
        Path(env["GPUSLICE_GPU_PROCESSES"]).write_text("[]")
    if name == "nvml":
        return nvml_trial(env) if not env.get("GPUSLICE_GPU_PROCESSES") else {
            "scenario": "nvml", "alloc": 0, "held": 0, "reported_s": None, "ended_s": None, "killed": False}
    if name == "bypass":
        cmd = ["run", "--device", "0", "--memory", "2GiB", "--", "env", "-u", "LD_PRELOAD", py, "-c", WORKER, "4", "one", "60"]
        expect = 1
    elif name == "collude":
        inner = collude_script(py, WORKER)
        cmd = ["run", "--device", "0", "--memory", "3GiB", "--", "sh", "-c", inner]
        expect = 3
    else:  # honest
        cmd = ["run", "--device", "0", "--memory", "3GiB", "--", py, "-c", WORKER, "0", "fill", str(3 * grace)]
        expect = 1
    proc = subprocess.Popen([py, "-m", "gpuslice.cli", *cmd], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    lines = [json.loads(proc.stdout.readline()) for _ in range(expect)]
    alloc = max(x["alloc"] for x in lines)
    pids = [x["pid"] for x in lines]
    reported = ended = None
    deadline = time.time() + 60
    while time.time() < deadline:
        if reported is None and status(sock).get("backstop", {}).get("overruns"):
            reported = time.time()
        if not any(alive(p) for p in pids):
            ended = time.time()
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    if name == "honest":  # its process ends by itself after 3 × grace; earlier means it was killed
        killed = ended is not None and ended - alloc < 3 * grace - 0.5
    else:
        killed = ended is not None
    return {"scenario": name, "alloc": alloc, "held": sum(x["held"] for x in lines),
            "reported_s": None if reported is None else reported - alloc,
            "ended_s": None if ended is None else ended - alloc, "killed": killed}


def nvml_trial(env: dict) -> dict:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, "2", "one", "30"], stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in env.items() if k != "LD_PRELOAD"})
    line = json.loads(proc.stdout.readline())
    seen = None
    deadline = time.time() + 30
    while time.time() < deadline and seen is None:
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == line["pid"] and isinstance(p.usedGpuMemory, int) and p.usedGpuMemory >= 2 * GiB:
                seen = time.time()
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    return {"scenario": "nvml", "alloc": line["alloc"], "held": line["held"],
            "reported_s": None if seen is None else seen - line["alloc"], "ended_s": None, "killed": False}


def summary(rows: list[dict], grace: float, interval: float) -> str:
    out = [f"backstop on {gpu_name()}: agent --interval {interval} --backstop kill --backstop-grace {grace}",
           f"{'scenario':<9} {'n':>2} {'seen/reported s (med, min-max)':>32} {'ended s (med, min-max)':>26} {'killed':>7}"]
    for name in ("nvml", "bypass", "collude", "honest"):
        mine = [r for r in rows if r["scenario"] == name]
        if not mine:
            continue

        def stat(key):
            vals = [r[key] for r in mine if r[key] is not None]
            if not vals:
                return "-"
            return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

        killed = sum(1 for r in mine if r["killed"])
        out.append(f"{name:<9} {len(mine):>2} {stat('reported_s'):>32} {stat('ended_s'):>26} {killed:>4}/{len(mine)}")
    out.append("honest must show 0 killed and no report; bypass/collude must all be killed, ended ≥ grace.")
    return "\n".join(out)


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "an unknown GPU"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--grace", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: a snapshot and a stand-in for NVML")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="gpuslice-backstop-state-"))
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(state), "PYTHONPATH": os.pathsep.join(  # ours first, then what the caller had (.whl/'s pinned packages on the GPU image)
               [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "GPUSLICE_ENFORCER_LIB": str(REPO / "native" / "build" / "libgpuslice.so"), "GPUSLICE_KILL_GRACE": "2"}
    env.pop("GPUSLICE_DEVICE_SNAPSHOT", None)
    if args.dry_run:
        env.update(GPUSLICE_DEVICE_SNAPSHOT="h100-80gb", GPUSLICE_GPU_PROCESSES=str(state / "gpu-processes.json"),
                   GS_DRY_UUID="GPU-e30e7c75-7e6c-5d0a-8e55-323a19a9b398")
        (state / "gpu-processes.json").write_text("[]")
    log = open(OUT / "agent.log", "w")
    agent = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "agent", "--port", "-1", "--interval",
                              str(args.interval), "--backstop", "kill", "--backstop-grace", str(args.grace)],
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    sock = state / "agent.sock"
    rows: list[dict] = []
    try:
        deadline = time.time() + 60
        while not (state / "agent.json").exists():
            if agent.poll() is not None or time.time() > deadline:
                print("the agent did not start; see", OUT / "agent.log")
                return 1
            time.sleep(0.1)
        order = ["nvml", "bypass", "collude", "honest"]
        with open(OUT / "backstop.jsonl", "w") as jl:
            for k in range(args.repeats):
                for name in (order if k % 2 == 0 else order[::-1]):  # ABBA: no scenario always first
                    row = run_trial(name, env, sock, args.grace)
                    row["round"] = k
                    rows.append(row)
                    jl.write(json.dumps(row) + "\n")
                    jl.flush()
                    time.sleep(args.grace)  # the previous slice's grant released, its memory back
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        shutil.rmtree(state, ignore_errors=True)
    text = summary(rows, args.grace, args.interval)
    (OUT / "summary.txt").write_text(text + "\n")
    print(text)
    bad = [r for r in rows if (r["scenario"] in ("bypass", "collude") and not r["killed"])
           or (r["scenario"] == "honest" and (r["killed"] or r["reported_s"] is not None))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
