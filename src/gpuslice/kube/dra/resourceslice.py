"""The node's ResourceSlice (``resource.k8s.io/v1``) as pure data: what kube-scheduler's DRA allocator sees.

One slice per node, named ``<node>-gpuslice.io``, pool = the node name, ``nodeName`` = the node. Its devices are
the node's placeable devices, as placement counts them: each GPU, or — on a MIG-enabled card — each MIG instance
(never the card itself). Every device has

* ``allowMultipleAllocations: true`` and three consumable capacities (``DRAConsumableCapacity``, beta and on by
  default since Kubernetes 1.36; the scheduler's allocator sums what claims consume and never lets a sum pass
  the value):

  ============ ======================================== ====================================================
  capacity     value                                    request policy (what one allocation consumes)
  ============ ======================================== ====================================================
  ``memory``   device memory × memoryScaling (bytes,    default: all of it (a claim that names no memory gets
               rounded down to a MiB)                   the device whole); validRange min = the minimum slice
                                                        (``--dra-min-memory``, 1Gi), step 1Mi (requests round up)
  ``compute``  100 (percent of the device's SM time)    default 0 (not paced); validRange 0..100, step 1
  ``slices``   the split count (10)                     exactly 1 (default 1, validRange 1..1): at most
                                                        split-count claims share a device, as HAMi's deviceSplitCount
  ============ ======================================== ====================================================

  Since every allocation takes at least the minimum slice of memory, a claim that takes the whole memory (the
  default) can only land on a device nobody else holds, and holds it alone: "whole GPUs" need no other knob.

* attributes (each a scalar; the DRA API allows 32 attributes + capacities per device, strings of ≤ 64 bytes):
  ``uuid``, ``index``, ``model`` (``H100-80GB-HBM3``), ``productName``, ``sms``, ``computeCapability``
  (a version, ``9.0.0``), ``numaNode`` (when known), ``nvlinkIsland`` (the same string for every device in one
  NVLink-connected group — the smallest UUID of the group, lower case; a device without links is its own island:
  ``matchAttribute: gpuslice.io/nvlinkIsland`` asks for devices that all talk over NVLink), ``nvlinkPeers`` (how
  many), ``pciBusID``, ``mig`` (bool), and on MIG instances ``migProfile`` and ``parentUUID``.

* a ``NoSchedule`` taint ``gpuslice.io/unhealthy`` on a device that is unhealthy or that discovery lost (device
  taints are GA in 1.37): running claims keep it, new ones do not get it.

Device names are DNS labels made from the UUID (``GPU-8f3c…`` → ``gpu-8f3c…``), stable across restarts.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gpuslice.spec import Device, SpecError, whole_number
from gpuslice.enforcer.policy import MAX_GRANTS_PER_DEVICE

DRIVER = "gpuslice.io"
API_VERSION = "resource.k8s.io/v1"
MEMORY, COMPUTE, SLICES = "memory", "compute", "slices"
MiB = 1024**2
DEFAULT_MIN_MEMORY = 1024 * MiB  # the enforcer counts 680 MiB per CUDA context (measured, PyTorch on an H100)
UNHEALTHY_TAINT = "gpuslice.io/unhealthy"
MAX_DEVICES = 128   # resource.k8s.io/v1 ResourceSliceMaxDevices
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Sharing:
    """How a node's devices may be shared: the same knobs as the device plugin's, plus the minimum slice."""

    split_count: int = 10
    memory_scaling: float = 1.0
    min_memory: int = DEFAULT_MIN_MEMORY

    def __post_init__(self) -> None:
        whole_number("split_count", self.split_count, 1, MAX_GRANTS_PER_DEVICE)  # a pacer lists no more
        if isinstance(self.memory_scaling, bool) or not isinstance(self.memory_scaling, (int, float)) \
                or not 0 < self.memory_scaling <= 100:
            raise SpecError("memory_scaling", self.memory_scaling, "a number above 0 and at most 100")
        whole_number("min_memory", self.min_memory, MiB, allowed="bytes, at least 1Mi, a whole number of MiB")
        if self.min_memory % MiB:
            raise SpecError("min_memory", self.min_memory, "a whole number of MiB (the memory request step)")


@dataclass(frozen=True)
class SliceDevice:
    """One placeable device as the ResourceSlice names it (a GPU, or a MIG instance of a card)."""

    name: str
    uuid: str
    index: int
    model: str
    product: str
    memory_total: int
    sms: int
    numa_node: int | None
    island: str
    peers: int
    pci_bus_id: str
    compute_capability: str
    card: Device               # the physical card (for MIG instances: its parent)
    profile: str = ""          # MIG profile, "" for a whole GPU

    @property
    def is_mig(self) -> bool:
        return bool(self.profile)


def device_name(uuid: str) -> str:
    """A DNS label for ``uuid``: lower case, other characters as ``-``; a hash when that is not possible."""
    name = re.sub(r"[^a-z0-9-]+", "-", uuid.lower()).strip("-")
    if _LABEL.fullmatch(name) and name == uuid.lower():
        return name
    return "dev-" + hashlib.sha256(uuid.encode()).hexdigest()[:32]


def nvlink_islands(devices: Sequence[Device]) -> dict[str, str]:
    """Each card's island: the smallest (lower-cased) UUID among the cards it reaches over NVLink."""
    parent = {d.uuid: d.uuid for d in devices}

    def root(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for d in devices:
        for p in d.nvlink_peers:
            if p in parent:
                a, b = sorted((root(d.uuid), root(p)))
                parent[b] = a
    return {u: root(u).lower() for u in parent}


def slice_devices(devices: Sequence[Device]) -> list[SliceDevice]:
    """The placeable devices of a node (MIG instances instead of MIG-enabled cards), in discovery order."""
    islands = nvlink_islands(devices)
    out: list[SliceDevice] = []
    for d in devices:
        common = dict(index=d.index, model=d.model or d.name, numa_node=d.numa_node, island=islands[d.uuid],
                      peers=len(d.nvlink_peers), pci_bus_id=d.pci_bus_id, compute_capability=d.compute_capability,
                      card=d)
        if d.mig_enabled:
            out += [SliceDevice(name=device_name(m.uuid), uuid=m.uuid, product=f"{d.name} MIG {m.profile}",
                                memory_total=m.memory_total, sms=m.sm_count, profile=m.profile, **common)
                    for m in d.mig_instances]
        else:
            out.append(SliceDevice(name=device_name(d.uuid), uuid=d.uuid, product=d.name,
                                   memory_total=d.memory_total, sms=d.sm_count, **common))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise SpecError("devices", names, "devices whose UUIDs give distinct DRA device names")
    if len(out) > MAX_DEVICES:
        raise SpecError("devices", len(out), f"at most {MAX_DEVICES} devices in one ResourceSlice")
    return out


def memory_capacity(dev: SliceDevice, sharing: Sharing) -> int:
    """What the slices' memory limits on ``dev`` may add up to (bytes, a whole number of MiB)."""
    return int(dev.memory_total * sharing.memory_scaling) // MiB * MiB


def _text(value: str) -> dict[str, str]:
    return {"string": value[:64]}


def _version(cc: str) -> dict[str, str] | None:
    return {"version": f"{cc}.0"} if re.fullmatch(r"\d+\.\d+", cc or "") else None


def device_entry(dev: SliceDevice, sharing: Sharing, healthy: bool = True) -> dict[str, Any]:
    """The ResourceSlice's entry for one device (the API's JSON)."""
    attrs: dict[str, Any] = {
        "uuid": _text(dev.uuid), "index": {"int": dev.index}, "model": _text(dev.model),
        "productName": _text(dev.product), "sms": {"int": dev.sms}, "nvlinkIsland": _text(dev.island),
        "nvlinkPeers": {"int": dev.peers}, "mig": {"bool": dev.is_mig},
    }
    if dev.numa_node is not None:
        attrs["numaNode"] = {"int": dev.numa_node}
    if dev.pci_bus_id:
        attrs["pciBusID"] = _text(dev.pci_bus_id)
    if (cc := _version(dev.compute_capability)) is not None:
        attrs["computeCapability"] = cc
    if dev.is_mig:
        attrs["migProfile"] = _text(dev.profile)
        attrs["parentUUID"] = _text(dev.card.uuid)
    memory = memory_capacity(dev, sharing)
    low = min(sharing.min_memory, memory)
    capacity = {
        MEMORY: {"value": str(memory), "requestPolicy": {
            "default": str(memory), "validRange": {"min": str(low), "step": str(MiB)}}},
        COMPUTE: {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
        SLICES: {"value": str(sharing.split_count), "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "1"}}},
    }
    entry: dict[str, Any] = {"name": dev.name, "attributes": attrs, "capacity": capacity,
                             "allowMultipleAllocations": True}
    if not healthy:
        entry["taints"] = [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]
    return entry


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def resource_slice_spec(node: str, devices: Sequence[Device], sharing: Sharing, *, generation: int = 1,
                        health: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``spec`` of the node's ResourceSlice. ``health``: ``{uuid: "Healthy" | "Unhealthy"}`` of cards (a MIG
    instance takes its card's)."""
    health = dict(health or {})
    entries = []
    for dev in slice_devices(devices):
        healthy = health.get(dev.card.uuid, "Healthy") == "Healthy" and health.get(dev.uuid, "Healthy") == "Healthy"
        entries.append(device_entry(dev, sharing, healthy))
    return {"driver": DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": entries}


def resource_slice(node: str, devices: Sequence[Device], sharing: Sharing, *, generation: int = 1,
                   health: Mapping[str, str] | None = None, node_uid: str = "") -> dict[str, Any]:
    """The whole ResourceSlice object; with ``node_uid``, owned by the Node (deleted with it)."""
    meta: dict[str, Any] = {"name": slice_name(node), "labels": {"app.kubernetes.io/managed-by": "gpuslice"}}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
            "spec": resource_slice_spec(node, devices, sharing, generation=generation, health=health)}
