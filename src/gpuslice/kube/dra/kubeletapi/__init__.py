"""The kubelet's DRA plugin API (``dra_v1.proto``, service ``v1.DRAPlugin``) and plugin-registration API
(``pluginregistration_v1.proto``), verbatim copies of k8s.io/kubelet v0.37.2, with their Python gRPC code
generated **when gpuslice is built** (``setup.py`` → :mod:`gpuslice.kube.protogen`, grpcio-tools pinned in
``[build-system].requires``). In a source checkout whose protos changed, run
``python -m gpuslice.kube.dra.kubeletapi`` (or reinstall).

``load()`` returns the four modules or raises :class:`~gpuslice.spec.GpusliceError` saying how to get them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PACKAGE = __name__  # gpuslice.kube.dra.kubeletapi


@dataclass(frozen=True)
class KubeletAPI:
    dra: ModuleType           # dra_v1_pb2: NodePrepareResourcesRequest, Claim, Device, ...
    dra_grpc: ModuleType      # dra_v1_pb2_grpc: DRAPluginServicer, DRAPluginStub
    reg: ModuleType           # pluginregistration_v1_pb2: PluginInfo, RegistrationStatus, ...
    reg_grpc: ModuleType      # pluginregistration_v1_pb2_grpc: RegistrationServicer, RegistrationStub


_loaded: KubeletAPI | None = None


def load() -> KubeletAPI:
    global _loaded
    if _loaded is None:
        from gpuslice.kube.protoload import load_generated

        m = load_generated(PACKAGE, "the kubelet DRA plugin API")
        _loaded = KubeletAPI(m["dra_v1_pb2"], m["dra_v1_pb2_grpc"], m["pluginregistration_v1_pb2"],
                             m["pluginregistration_v1_pb2_grpc"])
    return _loaded
