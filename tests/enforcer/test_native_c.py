"""The native C tests that matter most, from pytest: the enforcer end to end over the CPU driver
double with build/libgpuslice.so LD_PRELOADed (as in production), and the config checker.
(`make -C native test` runs these and the ASan/UBSan builds; this keeps a plain `pytest` honest.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .conftest import NATIVE


def test_enforcer_preloaded_over_the_driver_double(native_build: Path) -> None:
    r = subprocess.run(["make", "-C", str(NATIVE), "build/tests/preload/test_enforcer"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "CUDA_DEVICE_"))}
    env.update(LD_LIBRARY_PATH=str(native_build / "double"), LD_PRELOAD=str(native_build / "libgpuslice.so"),
               GS_TEST_PRELOAD="1")
    r = subprocess.run([str(native_build / "tests" / "preload" / "test_enforcer")], env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "0 failed" in r.stderr


def test_harmless_in_processes_that_never_touch_cuda(native_build: Path) -> None:
    """As under /etc/ld.so.preload: ordinary programs run unchanged, even with a broken slice."""
    env = dict(os.environ, LD_PRELOAD=str(native_build / "libgpuslice.so"), GPUSLICE_SLICE="/nonexistent")
    r = subprocess.run(["sh", "-c", "echo hello | tr a-z A-Z"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "HELLO\n" and r.stderr == ""


def test_config_check_reports_errors_naming_the_key(native_build: Path, tmp_path: Path) -> None:
    p = tmp_path / "s"
    p.write_text("version=1\nmemory_limit=4g\ncomptue=30\n")
    r = subprocess.run([str(native_build / "gpuslice-config-check"), str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and "line 3: unknown key 'comptue'" in r.stderr
