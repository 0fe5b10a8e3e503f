"""Shared test configuration: GPU tests run only where NVML finds a GPU."""

from __future__ import annotations

import pytest


def _have_gpu() -> bool:
    try:
        from gpuslice.node.devices import discover_nvml

        return bool(discover_nvml())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _have_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
