"""Local mode on a real GPU (skipped without one): PyTorch under a memory limit and a compute share, and
two concurrent slices on GPU 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

GiB = 2**30


@pytest.fixture
def env(tmp_path, enforcer_lib) -> dict[str, str]:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    return {**os.environ, "GPUSLICE_STATE_DIR": str(tmp_path / "state"), "GPUSLICE_ENFORCER_LIB": str(enforcer_lib),
            "PYTHONPATH": str(repo / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run(env, *args: str, seconds: float = 6, held_mib: int = 512, name: str = "w") -> subprocess.Popen:
    from gpuslice.local.demo import torch_workload

    return subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", *args, "--",
                             *torch_workload(), name, str(seconds), str(held_mib)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(next(x for x in out.splitlines() if x.startswith("{")))


def test_memory_limit_is_enforced_and_reported(env):
    r = result(run(env, "--memory", "2GiB", held_mib=1024))
    assert r["cuda_total"] == 2 * GiB  # CUDA sees the slice, not the card
    assert r["over_limit_alloc"] == "refused"


def test_compute_share_slows_the_loop(env):
    alone = result(run(env, "--memory", "4GiB"))
    paced = result(run(env, "--memory", "4GiB", "--compute", "30"))
    ratio = paced["matmul_per_s"] / alone["matmul_per_s"]
    assert 0.15 <= ratio <= 0.45, (alone, paced)


def test_two_concurrent_slices_share_gpu0(env):
    a = run(env, "--memory", "4GiB", "--compute", "30", name="a", seconds=10)
    b = run(env, "--memory", "8GiB", "--compute", "60", name="b", seconds=10)
    ra, rb = result(a), result(b)
    assert ra["cuda_total"] == 4 * GiB and rb["cuda_total"] == 8 * GiB
    assert 1.4 <= rb["matmul_per_s"] / ra["matmul_per_s"] <= 2.8, (ra, rb)
    ps = subprocess.run([sys.executable, "-m", "gpuslice.cli", "ps", "--json"], env=env, capture_output=True,
                        text=True, timeout=60)
    assert json.loads(ps.stdout)["slices"] == []  # both grants released
