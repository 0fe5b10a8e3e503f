"""Fixtures of local-mode tests: a private state dir, a device snapshot instead of NVML, the enforcer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nodekit import AgentProcess

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = "h100-80gb"


@pytest.fixture
def state_env(tmp_path, monkeypatch) -> dict[str, str]:
    """Env of a private local-mode node: state dir under tmp_path, devices from the H100 snapshot."""
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUSLICE_DEVICE_SNAPSHOT", SNAPSHOT)
    monkeypatch.setenv("GPUSLICE_KILL_GRACE", "2")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="session")
def enforcer_lib() -> Path:
    """The real libgpuslice.so: ``$GPUSLICE_ENFORCER_LIB`` when it names a file (a prebuilt library), else
    native/build's, built with `make -C native` if needed (a failed build fails the test)."""
    given = os.environ.get("GPUSLICE_ENFORCER_LIB")
    if given and Path(given).is_file():
        return Path(given)
    lib = REPO / "native" / "build" / "libgpuslice.so"
    if not lib.exists():
        subprocess.run(["make", "-C", str(REPO / "native"), "build/libgpuslice.so"], check=True,
                       capture_output=True, timeout=180)
    return lib


@pytest.fixture
def agent(state_env):
    running = AgentProcess(state_env)
    yield running
    running.stop()
