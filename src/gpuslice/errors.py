"""Typed errors shared by every part. Each carries enough context to print one clear line."""

from __future__ import annotations


class GpusliceError(Exception):
    """Base of every runtime error gpuslice raises on purpose; the CLI prints it and exits 1."""


class NoGpuError(GpusliceError):
    """No NVIDIA driver or no GPU on this machine (NVML could not be loaded or found no device)."""


class SnapshotError(GpusliceError):
    """A device snapshot file is missing or malformed."""
