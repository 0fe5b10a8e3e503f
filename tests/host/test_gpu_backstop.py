"""On a real GPU: the agent's backstop ends a slice whose process cleared LD_PRELOAD and allocated past the
limit, and leaves an honest slice filled to its limit alone (NVML's count of it stays within the tolerance).
Measurements over repeats: ``bash bench/backstop_detection.sh``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORKER = r"""
import json, os, sys, time, torch
fill = sys.argv[1] == "fill"
held = []
if fill:
    while True:
        try:
            held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        except RuntimeError:
            break
else:
    held.append(torch.empty(4 << 30, dtype=torch.uint8, device="cuda"))
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "alloc": time.time()}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def _torch_python() -> str:
    for python in dict.fromkeys([sys.executable, "python3", "/usr/bin/python3"]):
        if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    pytest.skip("no Python with torch for the GPU workload")


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.gpu
def test_the_backstop_ends_a_slice_that_bypasses_the_enforcer_and_spares_an_honest_one():
    python = _torch_python()
    state = Path(tempfile.mkdtemp(prefix="gpuslice-gpu-backstop-"))
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(state), "PYTHONPATH": str(REPO / "src"),
           "GPUSLICE_ENFORCER_LIB": str(REPO / "native" / "build" / "libgpuslice.so")}
    env.pop("GPUSLICE_DEVICE_SNAPSHOT", None)
    agent = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "agent", "--port", "-1", "--interval", "0.5",
                              "--backstop", "kill", "--backstop-grace", "2"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (state / "agent.json").exists():
            assert agent.poll() is None and time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.1)
        cheat = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", "2GiB",
                                  "--", "env", "-u", "LD_PRELOAD", python, "-c", WORKER, "one", "60"], env=env,
                                 stdout=subprocess.PIPE, text=True)
        honest = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", "3GiB",
                                   "--", python, "-c", WORKER, "fill", "12"], env=env, stdout=subprocess.PIPE, text=True)
        a, b = json.loads(cheat.stdout.readline()), json.loads(honest.stdout.readline())
        deadline = time.monotonic() + 30
        while _alive(a["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = time.time() - a["alloc"]
        assert not _alive(a["pid"]), "the slice 2 GiB over its limit was not ended within 30 s"
        assert 2.0 <= ended, ended  # not before the grace
        assert honest.wait(timeout=60) == 0, "the honest slice, filled to its limit, was killed"
        print(f"bypass ended {ended:.2f} s after its allocation")
    finally:
        agent.terminate()
        agent.wait(timeout=30)
