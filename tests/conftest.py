"""Shared test configuration: GPU tests (``@pytest.mark.gpu``) run only where NVML finds a GPU.

They are *skipped* only when the machine has no GPU or no NVIDIA driver (NVML cannot start or reports no
device). Anything else — ``pynvml`` (nvidia-ml-py) or gpuslice failing to import, NVML failing in an
unexpected way — *fails* them, so a broken install cannot pass as "no GPU". With ``GPUSLICE_REQUIRE_GPU=1``
(GPU boxes and their scripts) a missing GPU fails them too.

Test helpers shared across folders (``tests/support/``: the local-mode agent process, a region-file
writer) are put on ``sys.path`` here, once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))

REQUIRE_ENV = "GPUSLICE_REQUIRE_GPU"
_GATE = pytest.StashKey[str]()


def gpu_status() -> tuple[str, str]:
    """("ok" | "none" | "broken", what was found or why not)."""
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py)
    except Exception as exc:  # an install problem, not "no GPU"
        return "broken", f"pynvml (nvidia-ml-py) cannot be imported: {exc!r}"
    try:
        from gpuslice.host.errors import NoGpuError
        from gpuslice.host.devices import discover_nvml
    except Exception as exc:
        return "broken", f"gpuslice's device discovery cannot be imported: {exc!r}"
    try:
        devices = discover_nvml()
    except NoGpuError as exc:
        return "none", str(exc)
    except Exception as exc:
        return "broken", f"NVML device discovery failed: {exc!r}"
    return "ok", f"{len(devices)} GPU(s) through NVML"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    status, why = gpu_status()
    if status == "ok":
        return
    required = os.environ.get(REQUIRE_ENV) == "1"
    if status == "none" and not required:
        skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU ({why})")
        for item in gpu_items:
            item.add_marker(skip)
        return
    reason = f"{REQUIRE_ENV}=1 but no usable GPU: {why}" if status == "none" else f"GPU check broken: {why}"
    for item in gpu_items:
        item.stash[_GATE] = reason


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = item.stash.get(_GATE, None)
    if reason is not None:
        pytest.fail(reason, pytrace=False)
