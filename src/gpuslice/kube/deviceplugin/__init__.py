"""The kubelet device-plugin API v1beta1: ``api.proto`` here (our own copy, wire-compatible with the
kubelet's) and the Python gRPC code generated from it **when gpuslice is built**.

``setup.py`` runs ``grpc_tools.protoc`` in its ``build_py`` step through ``gpuslice.kube.protogen``
(grpcio-tools is pinned in ``[build-system].requires``), so a wheel, ``pip install .`` and ``pip install -e .`` all carry
``api_pb2.py``, ``api_pb2_grpc.py`` and ``_generated.py``; nothing is compiled at run time and grpcio-tools
is not a run-time dependency. In a source checkout whose ``api.proto`` changed, run
``python -m gpuslice.kube.deviceplugin`` (or reinstall) to generate them again.

``load()`` returns ``(api_pb2, api_pb2_grpc)`` or raises :class:`GpusliceError` saying how to get them.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PROTO = HERE / "api.proto"
PACKAGE = __name__  # gpuslice.kube.deviceplugin
_loaded: tuple[ModuleType, ModuleType] | None = None


def load() -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)``, generated at build time."""
    global _loaded
    if _loaded is None:
        from gpuslice.kube.protoload import load_generated

        modules = load_generated(PACKAGE, "the device-plugin API")
        _loaded = (modules["api_pb2"], modules["api_pb2_grpc"])
    return _loaded
