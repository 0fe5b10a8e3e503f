"""The kubelet device-plugin API v1beta1: ``api.proto`` here (our own copy, wire-compatible with the
kubelet's) and the Python gRPC code generated from it **when gpuslice is built**.

``setup.py`` runs ``grpc_tools.protoc`` in its ``build_py`` step (grpcio-tools is pinned in
``[build-system].requires``), so a wheel, ``pip install .`` and ``pip install -e .`` all carry
``api_pb2.py``, ``api_pb2_grpc.py`` and ``_generated.py``; nothing is compiled at run time and grpcio-tools
is not a run-time dependency. In a source checkout whose ``api.proto`` changed, run
``python -m gpuslice.kube.deviceplugin`` (or reinstall) to generate them again.

``load()`` returns ``(api_pb2, api_pb2_grpc)`` or raises :class:`GpusliceError` saying how to get them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType

from gpuslice.spec.errors import GpusliceError

HERE = Path(__file__).resolve().parent
PROTO = HERE / "api.proto"
PACKAGE = __name__  # gpuslice.kube.deviceplugin
HOW = ("they are generated from api.proto when gpuslice is built (pip install . / pip install -e ., "
       "through setup.py with grpcio-tools); in a source checkout run `python -m gpuslice.kube.deviceplugin`")
_loaded: tuple[ModuleType, ModuleType] | None = None


def load() -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)``, generated at build time."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        from gpuslice.kube.deviceplugin import _generated, api_pb2, api_pb2_grpc
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(PACKAGE):
            raise GpusliceError(f"the device-plugin API modules are missing ({exc.name}): {HOW}") from None
        raise
    except ImportError as exc:  # e.g. generated for another protobuf major version
        raise GpusliceError(f"the device-plugin API modules cannot be imported ({exc}): {HOW}") from exc
    if PROTO.exists():
        now = hashlib.sha256(PROTO.read_bytes()).hexdigest()
        if now != _generated.PROTO_SHA256:
            raise GpusliceError(f"the device-plugin API modules are older than {PROTO} (api.proto changed "
                                f"since they were generated): {HOW}")
    _loaded = (api_pb2, api_pb2_grpc)
    return _loaded
