"""Spatial slices on a real GPU with the real nvidia-cuda-mps-control (skipped without a GPU): two slices on
GPU 0 run as MPS clients, each seeing its share of the SMs and its memory limit, the over-limit allocation
refused; the daemon gpuslice started is gone with the last slice, no pipe directory left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpskit import mps_processes, short_root

pytestmark = pytest.mark.gpu
GiB = 2**30
PROBE = """
import json, torch
p = torch.cuda.get_device_properties(0)
free, total = torch.cuda.mem_get_info()
try:
    x = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda"); over = "allowed"
except torch.cuda.OutOfMemoryError:
    over = "refused"
print(json.dumps({"sms": p.multi_processor_count, "total": total, "over": over}))
"""


@pytest.fixture
def root():
    yield from short_root("gsgpu-")


def test_two_spatial_slices_are_mps_clients_with_their_share_and_limit(root: Path, enforcer_lib: Path) -> None:
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    import torch

    full = torch.cuda.get_device_properties(0).multi_processor_count
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(root / "s"), "GPUSLICE_ENFORCER_LIB": str(enforcer_lib),
           "PYTHONPATH": str(repo / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = [subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--engine", "spatial",
                              "--memory", "2GiB", "--compute", "25", "--", sys.executable, "-c", PROBE],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in runs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        r = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
        assert r["sms"] <= 0.3 * full, (r, full)  # an MPS client at 25 % of the SMs
        assert r["total"] == 2 * GiB and r["over"] == "refused"
    assert mps_processes(root) == [] and not list((root / "s" / "mps").glob("*/pipe"))
