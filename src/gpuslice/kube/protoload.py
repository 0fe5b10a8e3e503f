"""Load the gRPC modules generated at build time (:mod:`gpuslice.kube.protogen`) for one package, or say how
to get them: nothing is compiled at run time, and a copy older than its ``.proto`` files is refused."""

from __future__ import annotations

import importlib
from types import ModuleType

from gpuslice.kube import protogen
from gpuslice.spec.errors import GpusliceError


def how(package: str) -> str:
    names = ", ".join(protogen.PACKAGES[package])
    return (f"they are generated from {names} when gpuslice is built (pip install . / pip install -e ., "
            f"through setup.py with grpcio-tools); in a source checkout run `python -m {package}`")


def load_generated(package: str, what: str) -> dict[str, ModuleType]:
    """``{"<stem>_pb2": module, "<stem>_pb2_grpc": module, ...}`` of ``package``; ``what`` names the API in
    errors (``the device-plugin API``). Raises :class:`GpusliceError` when they are missing, cannot be
    imported, or were generated from other protos than the ones in the package's folder."""
    names = [n[:-3] for n in protogen.generated_names(package)]
    modules: dict[str, ModuleType] = {}
    for name in names:
        try:
            modules[name] = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(package):
                raise GpusliceError(f"{what} modules are missing ({exc.name}): {how(package)}") from None
            raise
        except ImportError as exc:  # e.g. generated for another protobuf major version
            raise GpusliceError(f"{what} modules cannot be imported ({exc}): {how(package)}") from exc
    where = protogen.folder(package)
    protos = [where / p for p in protogen.PACKAGES[package]]
    if all(p.exists() for p in protos) and protogen.digest(protos) != modules["_generated"].PROTO_SHA256:
        raise GpusliceError(f"{what} modules are older than {', '.join(map(str, protos))} (a proto changed "
                            f"since they were generated): {how(package)}")
    return modules
