"""Typed errors of device discovery: no driver or GPU, and unreadable device snapshots."""

from __future__ import annotations

from gpuslice.spec.errors import GpusliceError


class NoGpuError(GpusliceError):
    """No NVIDIA driver or no GPU on this machine (NVML could not be loaded or found no device)."""


class SnapshotError(GpusliceError):
    """A device snapshot file is missing or malformed."""


class SnapshotNotFound(SnapshotError):
    """No snapshot file and no bundled snapshot of that name."""
