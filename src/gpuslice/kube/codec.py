"""The Kubernetes codec: annotations and resource names <-> gpuslice's vocabulary.

Every format here is versioned (``"version": 1``) JSON in one annotation value and documented in
``src/gpuslice/kube/README.md``. Decoders refuse what they do not understand with :class:`SpecError`
naming the annotation (or resource) and the allowed values; nothing here talks to the API server.

Objects are plain dicts as the API server serialises them (camelCase: ``metadata.annotations``,
``spec.containers[].resources.limits``) — the extender and the webhook receive exactly that, and the
API wrapper (:mod:`gpuslice.kube.api`) returns the same.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence

from gpuslice.placement import DEFAULT_SPLIT_COUNT, NodeState, PlacementPolicy, apply
from gpuslice.spec import (
    ComputeMode, Device, MemoryAmount, MigInstance, MiB, Priority, Request, Slice, SpecError, parse_models,
    whole_number,
)

FORMAT_VERSION = 1

# ------------------------------------------------------------------------------------- annotation keys
NODE_DEVICES = "gpuslice.io/devices"          # written by the agent (kube-agent): what the node has
NODE_LEDGER = "gpuslice.io/ledger"            # written by the extender's bind: grants on the node (CAS)
NODE_ALLOCATING = "gpuslice.io/allocating"    # the allocation lock: pods bound here, Allocate not done (CAS)
POD_REQUEST = "gpuslice.io/request"           # written by the webhook: the normalised request
POD_GRANT = "gpuslice.io/grant"               # written by the extender's bind: the pod's slices
POD_ALLOCATED = "gpuslice.io/allocated"       # written by the device plugin: containers allocated
POD_POLICY = "gpuslice.io/policy"             # per pod: "fgd" or "node=spread,gpu=binpack"
POD_NODE_POLICY = "gpuslice.io/node-policy"   # per pod, node level only
POD_GPU_POLICY = "gpuslice.io/gpu-policy"     # per pod, GPU level only
POD_COMPUTE_MODE = "gpuslice.io/compute-mode"  # per pod: hard | soft | off
HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


# ------------------------------------------------------------------------------------- configuration
# HAMi's default resource names (its chart's resourceName, resourceMem, resourceMemPercentage,
# resourceCores, resourcePriority); each is configurable, as in HAMi.
HAMI_RESOURCE_NAMES = {"count": "nvidia.com/gpu", "memory": "nvidia.com/gpumem",
                       "memory_percentage": "nvidia.com/gpumem-percentage", "cores": "nvidia.com/gpucores",
                       "priority": "nvidia.com/priority"}
# gpuslice's own names, always read besides the configured ones (gpu-memory takes a quantity like 4Gi).
GPUSLICE_RESOURCE_NAMES = {"count": "gpuslice.io/gpu", "memory_bytes": "gpuslice.io/gpu-memory",
                           "memory_percentage": "gpuslice.io/gpu-memory-percentage",
                           "cores": "gpuslice.io/gpu-compute", "priority": "gpuslice.io/priority"}
# An extended resource name: a DNS subdomain prefix outside kubernetes.io, a slash, a name.
_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def check_resource_name(key: str, value: Any) -> str:
    """``value`` as an extended resource name (``example.com/gpu``), or :class:`SpecError` naming ``key``."""
    if not isinstance(value, str) or not _RESOURCE_NAME.fullmatch(value):
        raise SpecError(key, value, "an extended resource name like nvidia.com/gpu (domain/name)")
    domain = value.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain.startswith("requests."):
        raise SpecError(key, value, "a name outside the kubernetes.io domain (those are Kubernetes' own)")
    return value


@dataclass(frozen=True)
class ResourceNames:
    """Extended-resource names read from container limits. Each kind accepts several names (the configured
    HAMi-style one first, then gpuslice's own); a container naming one kind twice with different values is
    refused. Build a configured set with :meth:`configured`; the defaults are HAMi's names."""

    count: tuple[str, ...] = ("nvidia.com/gpu", "gpuslice.io/gpu")
    memory_mib: tuple[str, ...] = ("nvidia.com/gpumem",)                  # a whole number of MiB (HAMi)
    memory_bytes: tuple[str, ...] = ("gpuslice.io/gpu-memory",)           # a Kubernetes quantity: 4Gi
    memory_percent: tuple[str, ...] = ("nvidia.com/gpumem-percentage", "gpuslice.io/gpu-memory-percentage")
    compute: tuple[str, ...] = ("nvidia.com/gpucores", "gpuslice.io/gpu-compute")
    priority: tuple[str, ...] = ("nvidia.com/priority", "gpuslice.io/priority")

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for kind in ("count", "memory_mib", "memory_bytes", "memory_percent", "compute", "priority"):
            names = getattr(self, kind)
            if not isinstance(names, tuple) or (kind != "memory_bytes" and not names):
                raise SpecError(f"resource names.{kind}", names, "a tuple of extended resource names")
            for n in names:
                check_resource_name(f"resource names.{kind}", n)
                if seen.get(n, kind) != kind:
                    raise SpecError(f"resource names.{kind}", n, f"a name not already used for {seen[n]}")
                seen[n] = kind

    @classmethod
    def configured(cls, *, count: str = HAMI_RESOURCE_NAMES["count"], memory: str = HAMI_RESOURCE_NAMES["memory"],
                   memory_percentage: str = HAMI_RESOURCE_NAMES["memory_percentage"],
                   cores: str = HAMI_RESOURCE_NAMES["cores"],
                   priority: str = HAMI_RESOURCE_NAMES["priority"]) -> "ResourceNames":
        """HAMi's five configurable names (``resourceName``, ``resourceMem``, ``resourceMemPercentage``,
        ``resourceCores``, ``resourcePriority``), each followed by gpuslice's own name of that kind.
        ``count`` is also what the device plugin advertises."""
        given = {"count": count, "memory": memory, "memory_percentage": memory_percentage, "cores": cores,
                 "priority": priority}
        for key, value in given.items():
            check_resource_name(f"resource name ({key})", value)
        ours = GPUSLICE_RESOURCE_NAMES

        def pair(a: str, b: str) -> tuple[str, ...]:
            return (a,) if a == b else (a, b)

        return cls(count=pair(count, ours["count"]), memory_mib=(memory,),
                   memory_bytes=() if memory == ours["memory_bytes"] else (ours["memory_bytes"],),
                   memory_percent=pair(memory_percentage, ours["memory_percentage"]),
                   compute=pair(cores, ours["cores"]), priority=pair(priority, ours["priority"]))

    def all(self) -> tuple[str, ...]:
        return (*self.count, *self.memory_mib, *self.memory_bytes, *self.memory_percent,
                *self.compute, *self.priority)

    @property
    def advertised(self) -> str:
        """The resource the device plugin advertises (devices × split count)."""
        return self.count[0]


@dataclass(frozen=True)
class KubeConfig:
    """Cluster-wide knobs of the Kubernetes adapters (Helm values map onto these).

    ``default_memory_mib`` / ``default_cores`` / ``default_gpu_num`` follow HAMi's ``defaultMem``,
    ``defaultCores`` and ``defaultGPUNum``: a container that asks for GPU memory or cores but no GPU count
    gets ``default_gpu_num`` devices; one that gives no memory gets ``default_memory_mib`` MiB per device,
    or the whole device when that is 0; one that gives no cores gets ``default_cores`` percent.
    """

    names: ResourceNames = field(default_factory=ResourceNames)
    default_memory_mib: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    default_mode: ComputeMode = ComputeMode.HARD
    scheduler_name: str = "gpuslice-scheduler"
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)

    def __post_init__(self) -> None:
        whole_number("default_memory_mib", self.default_memory_mib, 0, allowed="a whole number of MiB, 0 = whole device")
        whole_number("default_cores", self.default_cores, 0, 100, allowed="a whole percent from 0 to 100")
        whole_number("default_gpu_num", self.default_gpu_num, 0, 64, allowed="a whole number from 0 to 64 (0 = no default)")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", self.scheduler_name or ""):
            raise SpecError("scheduler_name", self.scheduler_name, "a DNS subdomain like gpuslice-scheduler")


# ------------------------------------------------------------------------------------- small helpers
def annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    return dict(meta.get("annotations") or {})


def _load(key: str, text: Any) -> dict[str, Any]:
    if not isinstance(text, str):
        raise SpecError(key, text, "a JSON object in a string (annotation value)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(key, text[:80], f"JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise SpecError(key, text[:80], "a JSON object")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise SpecError(f"{key}.version", version, f"{FORMAT_VERSION} (this gpuslice reads version {FORMAT_VERSION})")
    return data


def _dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def _str(key: str, value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise SpecError(key, value, "a string" if allow_empty else "a non-empty string")
    return value


# ------------------------------------------------------------------------------------- node devices
@dataclass(frozen=True)
class NodeDevices:
    """What the node's agent published: devices, their health, and the node's sharing knobs."""

    devices: tuple[Device, ...]
    health: Mapping[str, str] = field(default_factory=dict)  # uuid -> Healthy | Unhealthy
    split_count: int = DEFAULT_SPLIT_COUNT
    memory_scaling: float = 1.0
    updated: float = 0.0  # unix seconds of the agent's last publication

    def healthy(self, uuid: str) -> bool:
        return self.health.get(uuid, HEALTHY) == HEALTHY


def encode_node_devices(devices: Sequence[Device], *, health: Mapping[str, str] | None = None,
                        split_count: int = DEFAULT_SPLIT_COUNT, memory_scaling: float = 1.0,
                        now: float | None = None) -> str:
    """The value of ``gpuslice.io/devices`` for a node with ``devices``."""
    whole_number("split_count", split_count, 1, 1000)
    if not isinstance(memory_scaling, (int, float)) or not 0 < memory_scaling <= 100:
        raise SpecError("memory_scaling", memory_scaling, "a number above 0 and at most 100")
    health = dict(health or {})
    items = []
    for d in devices:
        item: dict[str, Any] = {
            "uuid": d.uuid, "index": d.index, "name": d.name, "model": d.model or d.name,
            "memory": d.memory_total, "sms": d.sm_count, "numa": d.numa_node,
            "nvlink": list(d.nvlink_peers), "health": health.get(d.uuid, HEALTHY),
        }
        if d.pci_bus_id:
            item["pci"] = d.pci_bus_id
        minor = d.extra.get("minor") if isinstance(d.extra, dict) else None
        if isinstance(minor, int):
            item["minor"] = minor
        if d.mig_enabled:
            item["mig"] = [{"uuid": m.uuid, "profile": m.profile, "memory": m.memory_total, "sms": m.sm_count}
                           for m in d.mig_instances]
        items.append(item)
    return _dump({"version": FORMAT_VERSION, "splitCount": split_count, "memoryScaling": memory_scaling,
                  "updated": round(time.time() if now is None else now, 3), "devices": items})


def decode_node_devices(text: Any) -> NodeDevices:
    """Parse ``gpuslice.io/devices``; errors name the field as ``gpuslice.io/devices.devices[2].memory``."""
    key = NODE_DEVICES
    data = _load(key, text)
    raw = data.get("devices")
    if not isinstance(raw, list):
        raise SpecError(f"{key}.devices", raw, "a list of devices")
    split = whole_number(f"{key}.splitCount", data.get("splitCount", DEFAULT_SPLIT_COUNT), 1, 1000)
    scaling = data.get("memoryScaling", 1.0)
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not 0 < scaling <= 100:
        raise SpecError(f"{key}.memoryScaling", scaling, "a number above 0 and at most 100")
    updated = data.get("updated", 0.0)
    if isinstance(updated, bool) or not isinstance(updated, (int, float)):
        raise SpecError(f"{key}.updated", updated, "unix seconds")
    devices, health = [], {}
    for n, item in enumerate(raw):
        where = f"{key}.devices[{n}]"
        if not isinstance(item, dict):
            raise SpecError(where, item, "an object")
        uuid = _str(f"{where}.uuid", item.get("uuid"))
        numa = item.get("numa")
        if numa is not None:
            whole_number(f"{where}.numa", numa, 0)
        nvlink = item.get("nvlink", [])
        if not isinstance(nvlink, list) or not all(isinstance(p, str) for p in nvlink):
            raise SpecError(f"{where}.nvlink", nvlink, "a list of peer UUIDs")
        state = item.get("health", HEALTHY)
        if state not in (HEALTHY, UNHEALTHY):
            raise SpecError(f"{where}.health", state, f"{HEALTHY} or {UNHEALTHY}")
        migs = []
        mig_raw = item.get("mig")
        if mig_raw is not None:
            if not isinstance(mig_raw, list):
                raise SpecError(f"{where}.mig", mig_raw, "a list of MIG instances")
            for k, m in enumerate(mig_raw):
                mw = f"{where}.mig[{k}]"
                if not isinstance(m, dict):
                    raise SpecError(mw, m, "an object")
                migs.append(MigInstance(uuid=_str(f"{mw}.uuid", m.get("uuid")),
                                        profile=_str(f"{mw}.profile", m.get("profile")),
                                        memory_total=whole_number(f"{mw}.memory", m.get("memory"), 1),
                                        sm_count=whole_number(f"{mw}.sms", m.get("sms", 0), 0)))
        extra = {}
        if isinstance(item.get("minor"), int) and not isinstance(item.get("minor"), bool):
            extra["minor"] = item["minor"]
        devices.append(Device(
            uuid=uuid, index=whole_number(f"{where}.index", item.get("index", n), 0),
            name=_str(f"{where}.name", item.get("name", item.get("model", "")), allow_empty=True),
            memory_total=whole_number(f"{where}.memory", item.get("memory"), 1),
            sm_count=whole_number(f"{where}.sms", item.get("sms", 0), 0),
            model=_str(f"{where}.model", item.get("model", ""), allow_empty=True),
            numa_node=numa, nvlink_peers=tuple(nvlink), mig_enabled=mig_raw is not None,
            mig_instances=tuple(migs), pci_bus_id=str(item.get("pci", "")), extra=extra))
        health[uuid] = state
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise SpecError(f"{key}.devices", uuids, "devices with distinct UUIDs")
    return NodeDevices(tuple(devices), health, split, float(scaling), float(updated))


# ------------------------------------------------------------------------------------- grants
@dataclass(frozen=True)
class ContainerGrant:
    """The slices of one container, under one grant id."""

    container: str
    grant_id: str
    slices: tuple[Slice, ...]
    exclusive: bool = False

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(s.device_uuid for s in self.slices)


@dataclass(frozen=True)
class PodGrant:
    """Everything granted to one pod on one node (the pod's ``gpuslice.io/grant`` and its ledger entry)."""

    node: str
    pod_uid: str
    namespace: str
    pod: str
    containers: tuple[ContainerGrant, ...]
    bound_at: float = 0.0  # unix seconds when the extender committed it

    def container(self, name: str) -> ContainerGrant | None:
        for c in self.containers:
            if c.container == name:
                return c
        return None

    def slices(self) -> list[Slice]:
        return [s for c in self.containers for s in c.slices]


def grant_id_for(pod_uid: str, container: str) -> str:
    """A grant id unique per pod and container: ``k-<pod uid>-<container>`` (≤ 128 characters)."""
    text = re.sub(r"[^A-Za-z0-9._-]", "-", f"k-{pod_uid}-{container}")
    return text[:128]


def _slice_json(s: Slice) -> dict[str, Any]:
    return {"uuid": s.device_uuid, "memory": s.memory_limit, "compute": s.compute,
            "priority": int(s.priority), "mode": s.mode.value, "weight": s.weight}


def _slice_from(where: str, data: Any) -> Slice:
    if not isinstance(data, dict):
        raise SpecError(where, data, "an object with uuid, memory, compute, priority, mode, weight")
    try:
        return Slice(device_uuid=_str(f"{where}.uuid", data.get("uuid")),
                     memory_limit=whole_number(f"{where}.memory", data.get("memory"), 1),
                     compute=whole_number(f"{where}.compute", data.get("compute", 0), 0, 100),
                     priority=Priority.parse(data.get("priority", 1), f"{where}.priority"),
                     mode=ComputeMode.parse(data.get("mode", "hard"), f"{where}.mode"),
                     weight=whole_number(f"{where}.weight", data.get("weight", 1), 1, 16))
    except SpecError as exc:
        if exc.field.startswith(where):
            raise
        raise SpecError(f"{where}.{exc.field}", exc.value, exc.allowed) from None


def _containers_json(containers: Iterable[ContainerGrant]) -> list[dict[str, Any]]:
    return [{"name": c.container, "grant": c.grant_id, "exclusive": c.exclusive,
             "slices": [_slice_json(s) for s in c.slices]} for c in containers]


def _containers_from(where: str, raw: Any) -> tuple[ContainerGrant, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(where, raw, "a non-empty list of containers")
    out = []
    for n, item in enumerate(raw):
        cw = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise SpecError(cw, item, "an object with name, grant, slices")
        slices = item.get("slices")
        if not isinstance(slices, list) or not slices:
            raise SpecError(f"{cw}.slices", slices, "a non-empty list of slices")
        exclusive = item.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise SpecError(f"{cw}.exclusive", exclusive, "true or false")
        gid = _str(f"{cw}.grant", item.get("grant"))
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", gid):
            raise SpecError(f"{cw}.grant", gid, "1-128 letters, digits, '.', '_' or '-'")
        out.append(ContainerGrant(container=_str(f"{cw}.name", item.get("name")), grant_id=gid,
                                  slices=tuple(_slice_from(f"{cw}.slices[{k}]", s) for k, s in enumerate(slices)),
                                  exclusive=exclusive))
    return tuple(out)


def encode_pod_grant(grant: PodGrant) -> str:
    """The value of the pod annotation ``gpuslice.io/grant``."""
    return _dump({"version": FORMAT_VERSION, "node": grant.node, "uid": grant.pod_uid,
                  "namespace": grant.namespace, "pod": grant.pod, "boundAt": round(grant.bound_at, 3),
                  "containers": _containers_json(grant.containers)})


def decode_pod_grant(text: Any) -> PodGrant:
    key = POD_GRANT
    data = _load(key, text)
    bound = data.get("boundAt", 0.0)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        raise SpecError(f"{key}.boundAt", bound, "unix seconds")
    return PodGrant(node=_str(f"{key}.node", data.get("node")), pod_uid=_str(f"{key}.uid", data.get("uid")),
                    namespace=_str(f"{key}.namespace", data.get("namespace", ""), allow_empty=True),
                    pod=_str(f"{key}.pod", data.get("pod", ""), allow_empty=True),
                    containers=_containers_from(f"{key}.containers", data.get("containers")),
                    bound_at=float(bound))


@dataclass(frozen=True)
class Ledger:
    """The node's ledger (``gpuslice.io/ledger``): pod UID -> grant. The extender changes it only with a
    resourceVersion-conditioned update of the Node, so two binds can never both take the same capacity."""

    entries: Mapping[str, PodGrant] = field(default_factory=dict)

    def with_entry(self, grant: PodGrant) -> "Ledger":
        table = dict(self.entries)
        table[grant.pod_uid] = grant
        return Ledger(table)

    def without(self, pod_uids: Iterable[str]) -> "Ledger":
        drop = set(pod_uids)
        return Ledger({k: v for k, v in self.entries.items() if k not in drop})

    def slices(self) -> tuple[list[Slice], set[str]]:
        """All granted slices and the UUIDs held whole."""
        shared, exclusive = [], set()
        for g in self.entries.values():
            for c in g.containers:
                shared.extend(c.slices)
                if c.exclusive:
                    exclusive.update(c.uuids)
        return shared, exclusive

    def by_grant_id(self) -> dict[str, tuple[PodGrant, ContainerGrant]]:
        return {c.grant_id: (g, c) for g in self.entries.values() for c in g.containers}


def encode_ledger(ledger: Ledger) -> str:
    entries = {}
    for uid, g in sorted(ledger.entries.items()):
        entries[uid] = {"namespace": g.namespace, "pod": g.pod, "boundAt": round(g.bound_at, 3),
                        "containers": _containers_json(g.containers)}
    return _dump({"version": FORMAT_VERSION, "entries": entries})


def decode_ledger(text: Any, node: str) -> Ledger:
    """Parse ``gpuslice.io/ledger``; a missing annotation is an empty ledger (pass ``None``)."""
    if text is None or text == "":
        return Ledger({})
    key = NODE_LEDGER
    data = _load(key, text)
    raw = data.get("entries")
    if not isinstance(raw, dict):
        raise SpecError(f"{key}.entries", raw, "an object of pod UID -> grant")
    out = {}
    for uid, item in raw.items():
        where = f"{key}.entries[{uid}]"
        if not isinstance(item, dict):
            raise SpecError(where, item, "an object")
        bound = item.get("boundAt", 0.0)
        if isinstance(bound, bool) or not isinstance(bound, (int, float)):
            raise SpecError(f"{where}.boundAt", bound, "unix seconds")
        out[uid] = PodGrant(node=node, pod_uid=uid,
                            namespace=_str(f"{where}.namespace", item.get("namespace", ""), allow_empty=True),
                            pod=_str(f"{where}.pod", item.get("pod", ""), allow_empty=True),
                            containers=_containers_from(f"{where}.containers", item.get("containers")),
                            bound_at=float(bound))
    return Ledger(out)


# ------------------------------------------------------------------------------------- allocation lock
def decode_allocating(text: Any) -> frozenset[str]:
    """``gpuslice.io/allocating`` on a Node: ``{"version": 1, "pods": ["<uid>", ...]}`` — pods the extender
    bound to the node whose containers the device plugin has not all allocated yet (missing = none).
    The details of each (its containers, when it was bound) are its ledger entry."""
    if text is None or text == "":
        return frozenset()
    data = _load(NODE_ALLOCATING, text)
    raw = data.get("pods")
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise SpecError(f"{NODE_ALLOCATING}.pods", raw, "a list of pod UIDs")
    return frozenset(raw)


def encode_allocating(uids: Iterable[str]) -> str | None:
    """The annotation value, or ``None`` (delete the key) when no pod holds the lock."""
    uids = sorted(set(uids))
    return _dump({"version": FORMAT_VERSION, "pods": uids}) if uids else None


def device_counts(grant: PodGrant) -> frozenset[int]:
    """The device counts of the grant's containers: what the kubelet's Allocate calls will carry (IDs)."""
    return frozenset(len(c.slices) for c in grant.containers)


PHANTOM = "(not published)"  # the name of a device a grant holds but the node no longer publishes


def phantom_devices(devices: NodeDevices, ledger: Ledger) -> tuple[Device, ...]:
    """Devices the ledger grants on that the node no longer publishes (a GPU lost with pods still running
    on it, an agent restarted without it, a changed MIG layout). They stand in the placement view as
    devices that take nothing new while their grants keep counting, so the node's other devices stay
    schedulable and nothing is freed before garbage collection takes the grants back."""
    known = {d.uuid for d in devices.devices} | {m.uuid for d in devices.devices for m in d.mig_instances}
    held: dict[str, int] = {}
    for g in ledger.entries.values():
        for c in g.containers:
            for sl in c.slices:
                if sl.device_uuid not in known:
                    held[sl.device_uuid] = held.get(sl.device_uuid, 0) + sl.memory_limit
    # Big enough for what is granted on it whatever the node's memory scaling (a reserve below 1 would
    # otherwise make the grants look like an over-commit).
    scale = min(1.0, devices.memory_scaling)
    first = len(devices.devices)
    return tuple(Device(uuid=u, index=first + k, name=PHANTOM, memory_total=int(mem / scale) + 1, sm_count=0,
                        model=PHANTOM)
                 for k, (u, mem) in enumerate(sorted(held.items())))


def node_state(name: str, devices: NodeDevices, ledger: Ledger, *,
               blocked: Iterable[str] = ()) -> NodeState:
    """The placement view of a node: its devices, what the ledger already grants, and devices that may
    not take new slices (unhealthy ones, devices the ledger names but the node no longer publishes — see
    :func:`phantom_devices` —, plus ``blocked``, e.g. a pod's ``nouse-gpuuuid``).

    A ledger that over-commits a device (it cannot, unless edited by hand) raises :class:`SpecError`.
    """
    shared, exclusive = ledger.slices()
    phantoms = phantom_devices(devices, ledger)
    state = NodeState.from_devices(name, (*devices.devices, *phantoms), shared, exclusive=exclusive,
                                   split_count=devices.split_count, memory_scaling=devices.memory_scaling)
    stop = set(blocked) | {u for u, h in devices.health.items() if h != HEALTHY} | {d.uuid for d in phantoms}
    if stop:
        parents = {d.uuid for d in devices.devices}
        changed = []
        for d in state.devices:
            if d.uuid in stop or (d.parent_uuid in stop and d.parent_uuid in parents):
                d = replace(d, exclusive_taken=True)  # nothing new lands here; its grants stay counted
            changed.append(d)
        state = replace(state, devices=tuple(changed))
    return state


def apply_grant(state: NodeState, grant: PodGrant) -> NodeState:
    for c in grant.containers:
        state = apply(state, c.slices, exclusive=c.exclusive)
    return state


# ------------------------------------------------------------------------------------- pod requests
@dataclass(frozen=True)
class ContainerRequest:
    name: str
    index: int
    request: Request


@dataclass(frozen=True)
class PodRequest:
    """The GPU requests of a pod's containers (only containers that ask for GPU slices), its per-pod
    policy (``None`` = the cluster's), and devices it must not use."""

    containers: tuple[ContainerRequest, ...]
    policy: PlacementPolicy | None = None
    avoid_models: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    avoid_uuids: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what was ignored, HAMi-style (the webhook shows them as warnings)

    @property
    def empty(self) -> bool:
        return not self.containers

    @property
    def device_counts(self) -> frozenset[int]:
        """Device counts of the GPU containers (the allocation lock is per count)."""
        return frozenset(c.request.count for c in self.containers)


def parse_quantity(key: str, value: Any) -> Decimal:
    """A Kubernetes quantity (``4Gi``, ``3000``, ``1e3``) as an exact Decimal; errors name ``key``."""
    from kubernetes.utils import parse_quantity as _pq

    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SpecError(key, value, "a Kubernetes quantity like 3000 or 4Gi")
    try:
        return Decimal(_pq(value))
    except (ValueError, InvalidOperation, TypeError):
        raise SpecError(key, value, "a Kubernetes quantity like 3000 or 4Gi") from None


def _whole(key: str, value: Any, low: int, high: int, what: str) -> int:
    q = parse_quantity(key, value)
    if q != q.to_integral_value() or not low <= q <= high:
        raise SpecError(key, value, what)
    return int(q)


def _mib(key: str, value: Any) -> int:
    """HAMi's ``gpumem``: a whole number of MiB, as any quantity (the API server stores 3000 as ``3k``).
    A binary suffix like ``3Gi`` would mean 3·2³⁰ MiB; the bound (16 TiB) refuses it with a hint."""
    what = "a whole number of MiB like 3000 (at most 16 TiB; for sizes with units use gpuslice.io/gpu-memory: 4Gi)"
    return _whole(key, value, 1, 2**24, what)


def _one_of(limits: Mapping[str, Any], names: Sequence[str], where: str, convert) -> tuple[str, Any] | None:
    found = [(n, convert(f"{where}.resources.limits[{n}]", limits[n])) for n in names if n in limits]
    if not found:
        return None
    values = {v for _, v in found}
    if len(values) > 1:
        shown = ", ".join(f"{n}={limits[n]}" for n, _ in found)
        raise SpecError(f"{where}.resources.limits", shown,
                        "the same value under each name that means the same thing (they contradict)")
    return found[0]


def _limits(container: Mapping[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    limits = dict(res.get("requests") or {})
    limits.update(res.get("limits") or {})  # extended resources: limits are authoritative
    return limits


PRIORITY_MAX = 2**31 - 1


def container_request(container: Mapping[str, Any], cfg: KubeConfig, where: str,
                      mode: ComputeMode | None = None, models: tuple[str, ...] = (),
                      notes: list[str] | None = None) -> Request | None:
    """The request of one container from its resource limits, with HAMi's defaults filled; ``None`` when
    the container asks for no GPU. Contradictions raise :class:`SpecError` naming the resources.

    HAMi's rules where they differ from a plain reading (``src/gpuslice/kube/README.md`` lists them):
    no count and ``defaultGPUNum`` 0 → not a GPU container (its memory/cores are ignored); a priority
    without any GPU request is ignored; priority 0 is high and every larger whole number low; cores 100
    take the devices whole (exclusive), with or without a memory size. What is ignored is said in
    ``notes`` (the webhook returns them as admission warnings)."""
    names = cfg.names
    limits = _limits(container)
    count = _one_of(limits, names.count, where, lambda k, v: _whole(k, v, 0, 64, "a whole number of devices 0..64"))
    mem_mib = _one_of(limits, names.memory_mib, where, _mib)
    mem_bytes = _one_of(limits, names.memory_bytes, where, lambda k, v: _whole(
        k, v, 1, 2**60, "a size like 4Gi or 4096Mi (whole bytes)"))
    mem_pct = _one_of(limits, names.memory_percent, where, lambda k, v: _whole(
        k, v, 1, 100, "a whole percent of one device's memory from 1 to 100"))
    cores = _one_of(limits, names.compute, where, lambda k, v: _whole(
        k, v, 0, 100, "a whole percent of one device's SM time from 0 to 100"))
    prio = _one_of(limits, names.priority, where, lambda k, v: _whole(
        k, v, 0, PRIORITY_MAX, "a whole number: 0 = high priority, 1 or more = low (HAMi's rule)"))

    def note(text: str) -> None:
        if notes is not None:
            notes.append(f"{where}: {text}")

    if count is None and mem_mib is None and mem_bytes is None and mem_pct is None and cores is None:
        if prio is not None:  # HAMi passes the priority on to a container that has no GPU: no effect
            note(f"{prio[0]} is ignored: the container asks for no GPU ({names.advertised})")
        return None
    given_mem = [x for x in (mem_mib, mem_bytes, mem_pct) if x is not None]
    if len(given_mem) > 1:
        shown = ", ".join(f"{n}={limits[n]}" for n, _ in given_mem)
        sizes = ", ".join((*names.memory_mib, *names.memory_bytes))
        raise SpecError(f"{where}.resources.limits", shown,
                        f"one memory request: a size ({sizes}) or a percent ({names.memory_percent[0]}), not both")
    if count is None:
        if cfg.default_gpu_num == 0:  # HAMi: no count and no default count -> not a GPU container
            asked = ", ".join(n for n, _ in (*given_mem, *([cores] if cores else []), *([prio] if prio else [])))
            note(f"{asked} ignored: no {names.advertised} and no default GPU count (defaultGPUNum is 0), "
                 "so the container gets no GPU")
            return None
        n_devices = cfg.default_gpu_num
    else:
        n_devices = count[1]
        if n_devices == 0:
            if given_mem or cores is not None:
                raise SpecError(f"{where}.resources.limits[{count[0]}]", limits[count[0]],
                                "at least 1 when GPU memory or cores are requested")
            return None
    memory: MemoryAmount | None
    if mem_mib is not None:
        memory = MemoryAmount(bytes=mem_mib[1] * MiB)
    elif mem_bytes is not None:
        memory = MemoryAmount(bytes=mem_bytes[1])
    elif mem_pct is not None:
        memory = None if mem_pct[1] == 100 else MemoryAmount(percent=float(mem_pct[1]))
    elif cfg.default_memory_mib:
        memory = MemoryAmount(bytes=cfg.default_memory_mib * MiB)
    else:
        memory = None  # HAMi: no memory and no default -> the whole device (100%)
    compute = cores[1] if cores is not None else cfg.default_cores
    # HAMi: "Coresreq=100 indicates it want this card exclusively" — an idle card, nobody else after it,
    # whatever memory was asked for (the slice's memory limit is still what was asked).
    exclusive = compute == 100
    priority = Priority.HIGH if prio is not None and prio[1] == 0 else Priority.LOW
    return Request(count=n_devices, memory=memory, compute=compute, priority=priority,
                   mode=mode or cfg.default_mode, exclusive=exclusive, models=models)


def pod_policy(anns: Mapping[str, str], cfg: KubeConfig) -> PlacementPolicy | None:
    """The pod's policy from ``gpuslice.io/policy`` / ``…/node-policy`` / ``…/gpu-policy`` (or HAMi's
    ``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy``); ``None`` = the cluster's."""
    base = cfg.policy
    node, gpu = base.node, base.gpu
    changed = False
    if POD_POLICY in anns:
        try:
            p = PlacementPolicy.parse(anns[POD_POLICY])
        except SpecError as exc:
            raise SpecError(f"metadata.annotations[{POD_POLICY}]", anns[POD_POLICY], exc.allowed) from None
        node, gpu, changed = p.node, p.gpu, True
    for key, level in ((HAMI_NODE_POLICY, "node"), (POD_NODE_POLICY, "node"),
                       (HAMI_GPU_POLICY, "gpu"), (POD_GPU_POLICY, "gpu")):
        if key in anns:
            value = str(anns[key]).strip().lower()
            from gpuslice.placement import POLICIES

            if value not in POLICIES:
                raise SpecError(f"metadata.annotations[{key}]", anns[key], "one of " + ", ".join(POLICIES))
            if level == "node":
                node = value
            else:
                gpu = value
            changed = True
    if not changed:
        return None
    return replace(base, node=node, gpu=gpu)


def _list_annotation(anns: Mapping[str, str], key: str) -> tuple[str, ...]:
    if key not in anns:
        return ()
    try:
        return parse_models(anns[key], f"metadata.annotations[{key}]")
    except SpecError:
        raise
    except Exception:
        raise SpecError(f"metadata.annotations[{key}]", anns[key], "names separated by , or |") from None


def pod_shape_problem(pod: Any) -> str:
    """What makes ``pod`` not a Pod object at all ('' when its shape is fine). Callers answer such
    payloads with HTTP 400; contradictions inside a well-formed pod are :class:`SpecError` instead."""
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata", {}), Mapping):
        return "must be a Pod object with metadata"
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return "spec must be an object"
    for part in ("containers", "initContainers"):
        items = spec.get(part) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            return f"spec.{part} must be a list of container objects"
        for c in items:
            res = c.get("resources") or {}
            if not isinstance(res, Mapping) or not all(isinstance(res.get(k) or {}, Mapping)
                                                       for k in ("limits", "requests")):
                return f"spec.{part}[{c.get('name')!r}].resources must hold limits/requests objects"
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    if not isinstance(anns, Mapping):
        return "metadata.annotations must be an object"
    return ""


def pod_request(pod: Mapping[str, Any], cfg: KubeConfig) -> PodRequest:
    """The GPU requests of ``pod`` (a dict as the API server sends it) from its containers' resource
    limits and its annotations. Raises :class:`SpecError` naming the field on contradictions."""
    if not isinstance(pod, Mapping):
        raise SpecError("pod", type(pod).__name__, "a Pod object")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("pod.spec", spec, "an object with containers")
    anns = annotations(pod)
    if not all(isinstance(v, str) for v in anns.values()):
        raise SpecError("metadata.annotations", anns, "string values")
    mode = None
    if POD_COMPUTE_MODE in anns:
        mode = ComputeMode.parse(anns[POD_COMPUTE_MODE], f"metadata.annotations[{POD_COMPUTE_MODE}]")
    models = _list_annotation(anns, HAMI_USE_TYPE)
    containers = spec.get("containers")
    if not isinstance(containers, list):
        raise SpecError("pod.spec.containers", containers, "a list of containers")
    gpu_names = set(cfg.names.all())
    for k, init in enumerate(spec.get("initContainers") or []):
        if isinstance(init, Mapping) and gpu_names & set(_limits(init)):
            raise SpecError(f"spec.initContainers[{k}].resources.limits", sorted(gpu_names & set(_limits(init))),
                            "no GPU slices in init containers (gpuslice grants them to regular containers only)")
    out = []
    notes: list[str] = []
    for k, c in enumerate(containers):
        if not isinstance(c, Mapping):
            raise SpecError(f"spec.containers[{k}]", c, "a container object")
        name = c.get("name")
        where = f"spec.containers[{k}]" + (f"({name})" if name else "")
        if not isinstance(name, str) or not name:
            if gpu_names & set(_limits(c)):
                raise SpecError(f"spec.containers[{k}].name", name, "a container name")
            continue
        req = container_request(c, cfg, where, mode=mode, models=models, notes=notes)
        if req is not None:
            out.append(ContainerRequest(name=name, index=k, request=req))
    return PodRequest(containers=tuple(out), policy=pod_policy(anns, cfg),
                      avoid_models=_list_annotation(anns, HAMI_NOUSE_TYPE),
                      use_uuids=_list_annotation(anns, HAMI_USE_UUID),
                      avoid_uuids=_list_annotation(anns, HAMI_NOUSE_UUID), notes=tuple(notes))


def gpu_type_matches(device: Device, patterns: Iterable[str]) -> bool:
    """HAMi's ``checkGPUtype``: a ``use-gputype`` / ``nouse-gputype`` entry matches a card when it is a
    case-insensitive substring of the card's type. HAMi's type is ``NVIDIA-<NVML name>``
    (``NVIDIA-NVIDIA H100 80GB HBM3``); we test that, the NVML name and our model (``H100-80GB-HBM3``),
    so ``H100``, ``h100``, ``80GB HBM3`` and ``H100-80GB`` all match an H100 80GB."""
    return _type_matches(device.name, device.model, patterns)


def _type_matches(name: str, model: str, patterns: Iterable[str]) -> bool:
    texts = [t.upper() for t in (name, model, f"NVIDIA-{name}" if name else "") if t]
    return any(p.strip().upper() in t for p in patterns for t in texts)


def device_kinds(devices: Iterable[Device]) -> set[tuple[str, str]]:
    """``(model, NVML name)`` of each device: the model is what placement's exact ``models`` rule compares."""
    return {(d.model or d.name, d.name) for d in devices}


def resolve_gpu_types(req: PodRequest, kinds: Iterable[tuple[str, str]]) -> PodRequest:
    """The pod's ``use-gputype`` patterns (HAMi: substrings of the card type) turned into the exact model
    names placement matches: every model among ``kinds`` (``(model, name)`` pairs of the fleet or the node)
    that a pattern matches. When none matches the patterns stay, so nothing fits and the reason names them."""
    if not any(c.request.models for c in req.containers):
        return req
    kinds = list(kinds)
    out = []
    for c in req.containers:
        patterns = c.request.models
        if patterns:
            matched = sorted({model for model, name in kinds if _type_matches(name, model, patterns)})
            c = replace(c, request=replace(c.request, models=tuple(matched) or patterns))
        out.append(c)
    return replace(req, containers=tuple(out))


def blocked_devices(devices: NodeDevices, req: PodRequest) -> set[str]:
    """Devices of this node the pod may not use (HAMi's nouse-gputype — a substring of the card type, see
    :func:`gpu_type_matches` —, use-gpuuuid and nouse-gpuuuid)."""
    out: set[str] = set()
    for d in devices.devices:
        ids = {d.uuid} | {m.uuid for m in d.mig_instances}
        if req.avoid_models and gpu_type_matches(d, req.avoid_models):
            out |= ids
        if req.avoid_uuids and ids & set(req.avoid_uuids):
            out |= ids & set(req.avoid_uuids) or ids
        if req.use_uuids:
            out |= ids - set(req.use_uuids)
    return out


# ------------------------------------------------------------------------------------- normalised request
def encode_pod_request(req: PodRequest) -> str:
    """The value of ``gpuslice.io/request`` the webhook writes: what was asked, with defaults filled."""
    items = []
    for c in req.containers:
        r = c.request
        items.append({"name": c.name, "index": c.index, "count": r.count,
                      "memory": None if r.memory is None else str(r.memory), "compute": r.compute,
                      "priority": int(r.priority), "mode": r.mode.value, "weight": r.weight,
                      "exclusive": r.exclusive, "models": list(r.models)})
    data: dict[str, Any] = {"version": FORMAT_VERSION, "containers": items}
    if req.policy is not None:
        data["policy"] = req.policy.name
    return _dump(data)


def decode_pod_request(text: Any) -> list[tuple[str, Request]]:
    key = POD_REQUEST
    data = _load(key, text)
    raw = data.get("containers")
    if not isinstance(raw, list):
        raise SpecError(f"{key}.containers", raw, "a list")
    out = []
    for n, item in enumerate(raw):
        where = f"{key}.containers[{n}]"
        if not isinstance(item, dict):
            raise SpecError(where, item, "an object")
        name = _str(f"{where}.name", item.get("name"))
        fields = {k: item[k] for k in ("count", "memory", "compute", "priority", "mode", "weight",
                                       "exclusive", "models") if item.get(k) is not None}
        try:
            out.append((name, Request.from_mapping(fields)))
        except SpecError as exc:
            raise SpecError(f"{where}.{exc.field}", exc.value, exc.allowed) from None
    return out


# ------------------------------------------------------------------------------------- allocation marks
def decode_allocated(text: Any) -> set[str]:
    """``gpuslice.io/allocated``: ``{"version": 1, "containers": ["a", "b"]}`` — containers the device
    plugin already answered Allocate for (missing annotation = none)."""
    if text is None or text == "":
        return set()
    data = _load(POD_ALLOCATED, text)
    raw = data.get("containers")
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise SpecError(f"{POD_ALLOCATED}.containers", raw, "a list of container names")
    return set(raw)


def encode_allocated(containers: Iterable[str]) -> str:
    return _dump({"version": FORMAT_VERSION, "containers": sorted(set(containers))})


def memory_text(amount: MemoryAmount | None) -> str:
    return "whole device" if amount is None else str(amount)

