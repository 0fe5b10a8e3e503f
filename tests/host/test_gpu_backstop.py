"""On a real GPU: the agent's backstop ends a slice whose process cleared LD_PRELOAD and allocated past the
limit, and three colluding processes over their slice, and leaves an honest slice filled to its limit alone
(NVML's count of it stays within the tolerance). One round of ``bench/backstop_detection.py`` (the benchmark
repeats it and reports the timings: ``bash bench/backstop_detection.sh``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _torch_python() -> str:
    for python in dict.fromkeys([sys.executable, "python3", "/usr/bin/python3"]):
        if subprocess.run([python, "-c", "import torch, httpx, uvicorn"], capture_output=True).returncode == 0:
            return python
    pytest.skip("no Python with torch and gpuslice's dependencies for the GPU workload")


@pytest.mark.gpu
def test_the_backstop_ends_slices_that_bypass_the_enforcer_and_spares_an_honest_one(tmp_path):
    # ours first, then what the caller had: the GPU image's own typer is older than ours (.whl/ carries ours)
    env = {**os.environ, "OUT": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("GPUSLICE_DEVICE_SNAPSHOT", None)
    done = subprocess.run([_torch_python(), str(REPO / "bench" / "gpu" / "backstop_detection.py"), "--repeats", "1"],
                          env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "backstop.jsonl").read_text().splitlines()]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    by = {r["scenario"]: r for r in rows}
    assert by["bypass"]["killed"] and by["collude"]["killed"] and not by["honest"]["killed"]
    assert by["honest"]["reported_s"] is None  # never even reported
    assert by["bypass"]["ended_s"] >= 2.0  # not before the grace
