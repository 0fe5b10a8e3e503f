"""The GPU gate of tests/conftest.py: GPU tests skip only for "no GPU / no driver"; an NVML import error or an
unexpected NVML failure fails them (errors at setup); GPUSLICE_REQUIRE_GPU=1 fails them when no GPU is found. Each case runs
pytest on tests/local/test_gpu_local.py with a stand-in ``pynvml`` first on the path (any machine, GPU or not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

NO_DRIVER = """
class NVMLError(Exception):
    pass
def nvmlInit():
    raise NVMLError("Driver Not Loaded")
"""
BROKEN_IMPORT = "raise ImportError('libnvidia-ml.so.1: version mismatch (stand-in)')\n"
ODD_FAILURE = """
class NVMLError(Exception):
    pass
def nvmlInit():
    pass
def nvmlShutdown():
    pass
def nvmlDeviceGetCount():
    raise TypeError("unexpected NVML answer (stand-in)")
"""


def run_gpu_tests(tmp_path: Path, fake_pynvml: str, require: str | None) -> tuple[int, str]:
    fake = tmp_path / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "pynvml.py").write_text(fake_pynvml)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSLICE_REQUIRE_GPU", "GPUSLICE_DEVICE_SNAPSHOT")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(REPO / "src")])
    if require is not None:
        env["GPUSLICE_REQUIRE_GPU"] = require
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider",
                           "tests/local/test_gpu_local.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    return proc.returncode, proc.stdout + proc.stderr


def test_no_driver_skips(tmp_path):
    code, out = run_gpu_tests(tmp_path, NO_DRIVER, None)
    assert code == 0 and "3 skipped" in out and "no NVIDIA driver found" in out, out


def test_no_driver_fails_when_a_gpu_is_required(tmp_path):
    code, out = run_gpu_tests(tmp_path, NO_DRIVER, "1")
    assert code == 1 and "3 errors" in out and "GPUSLICE_REQUIRE_GPU=1 but no usable GPU" in out, out


@pytest.mark.parametrize("fake, words", [(BROKEN_IMPORT, "pynvml (nvidia-ml-py) cannot be imported"),
                                         (ODD_FAILURE, "NVML device discovery failed")])
def test_broken_nvml_fails_instead_of_skipping(tmp_path, fake, words):
    code, out = run_gpu_tests(tmp_path, fake, None)
    assert code == 1 and "3 errors" in out and "skipped" not in out and words in out, out
