"""Live resize on a real GPU (skipped without one): a PyTorch job in a 3 GiB slice is refused 2 GiB more;
its slice is raised to 6 GiB while it runs and the same allocation then succeeds within a second, without a
restart; a lower below what it holds is refused saying how much is in use; a lower to just above it holds
the job to the new size (its next 1 GiB is refused) and CUDA's memory query shows the new size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

GiB, MiB = 2**30, 2**20

JOB = textwrap.dedent("""
    import json, os, sys, time, torch
    ctl, MiB = sys.argv[1], 2**20
    def mark(name): open(os.path.join(ctl, name), "w").close()
    def wait(name):
        while not os.path.exists(os.path.join(ctl, name)): time.sleep(0.02)
    def attempt(mib):
        try:
            return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return None
    def until(mib, want_ok):  # retry up to 2 s; (tensor or None, seconds it took)
        t0 = time.monotonic()
        while True:
            y = attempt(mib)
            if (y is not None) == want_ok or time.monotonic() - t0 > 2:
                return y, time.monotonic() - t0
            del y
            torch.cuda.empty_cache()  # else the next try reuses PyTorch's cached block: no allocation
            time.sleep(0.02)
    held = [torch.ones(1536 * MiB, dtype=torch.uint8, device="cuda")]
    out = {"before_raise": attempt(2048) is not None}
    mark("ready1"); wait("raised")
    y, out["raise_s"] = until(2048, True)
    out["after_raise"] = y is not None
    held.append(y)
    out["total_after_raise"] = torch.cuda.mem_get_info()[1]
    mark("ready2"); wait("lowered")
    y, out["lower_s"] = until(1024, False)
    out["after_lower"] = y is not None
    out["total_after_lower"] = torch.cuda.mem_get_info()[1]
    out["held_ok"] = bool(held[0][-1].item() == 1)
    print(json.dumps(out), flush=True)
""")


def cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuslice.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


def test_pytorch_job_is_raised_then_lowered_while_it_runs(tmp_path, enforcer_lib):
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(tmp_path / "state"), "GPUSLICE_ENFORCER_LIB": str(enforcer_lib),
           "PYTHONPATH": str(repo / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    job = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", "3GiB", "--",
                            sys.executable, "-c", JOB, str(ctl)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ctl / "ready1", job)
        grant = json.loads(cli(env, "ps", "--json").stdout)["slices"][0]["grant_id"]
        raised = cli(env, "resize", grant, "--memory", "6GiB")
        assert raised.returncode == 0, raised.stderr
        (ctl / "raised").touch()
        wait_for(ctl / "ready2", job)
        used = json.loads(cli(env, "ps", "--json").stdout)["slices"][0]["memory_used"]
        assert used >= 3.5 * GiB
        refused = cli(env, "resize", grant, "--memory", "2GiB")
        assert refused.returncode == 1 and "hold now" in refused.stderr, refused.stderr
        lower_to = used + 256 * MiB
        lowered = cli(env, "resize", grant, "--memory", f"{lower_to // MiB}MiB")
        assert lowered.returncode == 0, lowered.stderr
        (ctl / "lowered").touch()
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    r = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert r["before_raise"] is False and r["after_raise"] is True and r["raise_s"] < 1.0, r
    assert r["total_after_raise"] == 6 * GiB, r
    assert r["after_lower"] is False and r["lower_s"] < 1.0, r
    assert r["total_after_lower"] == (lower_to // MiB) * MiB, r
    assert r["held_ok"], r
