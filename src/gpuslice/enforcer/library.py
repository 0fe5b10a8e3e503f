"""Where the enforcer library (libgpuslice.so) is: env, the checkout's build folder (``make -C native``), or
the copy a wheel carries in ``gpuslice/lib/`` (setup.py builds native/ into every wheel)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from gpuslice.spec.errors import GpusliceError


class EnforcerNotFound(GpusliceError):
    """libgpuslice.so was not found where gpuslice looks for it."""


ENFORCER_ENV = "GPUSLICE_ENFORCER_LIB"
LIB_NAME = "libgpuslice.so"


def candidates() -> list[Path]:
    """The places looked at, in order (without the env override)."""
    repo = Path(__file__).resolve().parents[3] / "native" / "build" / LIB_NAME
    packaged = Path(str(resources.files("gpuslice"))) / "lib" / LIB_NAME
    return [repo, packaged]


def find_enforcer() -> Path:
    """The absolute path of libgpuslice.so, or :class:`EnforcerNotFound` saying where we looked."""
    explicit = os.environ.get(ENFORCER_ENV)
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not path.is_file():
            raise EnforcerNotFound(f"{ENFORCER_ENV}={explicit} names no file; point it at a built {LIB_NAME}")
        return path
    for path in candidates():
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates())
    raise EnforcerNotFound(f"{LIB_NAME} not found (looked in {looked}); build it with `make -C native` "
                           f"or set {ENFORCER_ENV}=/path/to/{LIB_NAME}")
