"""Native fixtures: build the enforcer, the driver double and the helpers once per session (plain cc)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
BUILD = NATIVE / "build"


@pytest.fixture(scope="session")
def native_build() -> Path:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("a C compiler (cc) is required to build native/ for these tests")
    r = subprocess.run(["make", "-C", str(NATIVE), "all"], capture_output=True, text=True)
    assert r.returncode == 0, f"make -C native all failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return BUILD


@pytest.fixture()
def slice_env(native_build: Path):
    """Environment for a process of a slice over the CPU driver double, enforcer preloaded."""

    def make(slice_path: Path | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "CUDA_DEVICE_"))}
        env["LD_LIBRARY_PATH"] = str(native_build / "double")
        env["LD_PRELOAD"] = str(native_build / "libgpuslice.so")
        env["GPUSLICE_LOG_LEVEL"] = "error"
        if slice_path is not None:
            env["GPUSLICE_SLICE"] = str(slice_path)
        env.update(extra)
        return env

    return make


def double_uuid(dev: int) -> str:
    """The UUID the driver double gives device ``dev`` (native/tests/double/double_common.h)."""
    b = [(k * 17 + dev) & 0xFF for k in range(16)]
    b[0] = 0xA0 + dev
    h = "".join(f"{x:02x}" for x in b)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
