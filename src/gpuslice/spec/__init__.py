"""The vocabulary of gpuslice, shared by every part: requests, slices, grants and devices, the one unit
parser, their one JSON spelling, and the typed errors.

=============  =============================================================================================
module         owns
=============  =============================================================================================
``units``      memory sizes and compute shares as written by humans and manifests (``4GiB``, ``50%``, ``30``)
``colocation`` ``Colocation`` (preemptive / shared / tidal) and the tidal schedule's parser
``model``      ``Priority``, ``ComputeMode``, ``Engine``, ``Request``, ``Slice``, ``Grant``, ``Device``, ``MigInstance``
``codec``      the one JSON spelling of ``Request``, ``Slice`` and ``Grant`` on every wire
``errors``     ``GpusliceError`` (runtime, exit 1) and ``SpecError`` (field, value, what is allowed)
``files``      whole-file atomic writes (readers see the old text or the new, never a part)
``resize``     ``Resize``: the new sizes of a granted slice (live resize)
=============  =============================================================================================

Everything here is importable from ``gpuslice.spec`` itself. It imports no other part of gpuslice: every
other layer sits above it (``importlinter`` contract in ``pyproject.toml``).
"""

from gpuslice.spec.codec import (
    grant_from_json, grant_to_json, request_from_json, request_to_json, slice_from_json, slice_to_json,
)
from gpuslice.spec.colocation import Colocation, parse_tidal_schedule
from gpuslice.spec.errors import GpusliceError, SpecError
from gpuslice.spec.model import (
    COMPUTE_MODES, ComputeMode, Device, Engine, Grant, HoldsGrant, MigInstance, Priority, Request, Slice, parse_models, whole_number,
)
from gpuslice.spec.resize import Resize
from gpuslice.spec.units import (
    GiB, KiB, MemoryAmount, MiB, TiB, format_bytes, human_bytes, parse_bytes, parse_compute, parse_memory,
)

__all__ = [
    "COMPUTE_MODES", "Colocation", "ComputeMode", "Device", "Engine", "GiB", "Grant", "GpusliceError", "HoldsGrant", "KiB", "MemoryAmount", "MiB",
    "MigInstance", "Priority", "Request", "Resize", "Slice", "SpecError", "TiB", "format_bytes", "grant_from_json",
    "grant_to_json", "human_bytes", "parse_bytes", "parse_compute", "parse_memory", "parse_models",
    "parse_tidal_schedule", "request_from_json", "request_to_json", "slice_from_json", "slice_to_json", "whole_number",
]
