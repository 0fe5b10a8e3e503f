"""Builders of realistic Pod / Node JSON (as the API server sends them) for the kube tests."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from gpuslice.kube import formats
from gpuslice.spec import Device

H100 = 81559 * 1024**2  # H100 80GB HBM3 memory as NVML reports it (81559 MiB)


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{index}"))


def devices(node: str, count: int = 2, memory: int = H100, model: str = "H100-80GB-HBM3") -> list[Device]:
    """As discovery describes them: model ``H100-80GB-HBM3``, NVML name ``NVIDIA H100 80GB HBM3`` (another
    model gets the name ``NVIDIA <model>``)."""
    name = "NVIDIA H100 80GB HBM3" if model == "H100-80GB-HBM3" else f"NVIDIA {model}"
    return [Device(uuid=gpu_uuid(node, i), index=i, name=name, memory_total=memory,
                   sm_count=132, model=model, numa_node=i // 4) for i in range(count)]


def node(name: str, count: int = 2, memory: int = H100, split: int = 10, rv: str = "1",
         ledger: str | None = None, model: str = "H100-80GB-HBM3") -> dict[str, Any]:
    anns = {formats.NODE_DEVICES: formats.encode_node_devices(devices(name, count, memory, model), split_count=split)}
    if ledger is not None:
        anns[formats.NODE_LEDGER] = ledger
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv, "annotations": anns,
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(count * split)},
                       "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                       "nvidia.com/gpu": str(count * split)}}}


def pod(name: str, limits: dict[str, str] | None = None, *, namespace: str = "default",
        annotations: dict[str, str] | None = None, containers: list[dict[str, Any]] | None = None,
        uid: str | None = None) -> dict[str, Any]:
    if containers is None:
        containers = [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                       "command": ["python", "train.py"],
                       "resources": {"limits": dict(limits or {}), "requests": dict(limits or {})}}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                            "resourceVersion": "100", "creationTimestamp": "2026-11-22T17:00:00Z"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": containers, "restartPolicy": "Never", "schedulerName": "default-scheduler",
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}]},
            "status": {"phase": "Pending", "qosClass": "BestEffort"}}
