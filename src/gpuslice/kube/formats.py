"""The annotation formats of gpuslice on Kubernetes objects: what the agent, the extender and the device
plugin write on Nodes and Pods, and how each is read back.

Every format is versioned (``"version": 1``) JSON in one annotation value and documented in
``src/gpuslice/kube/README.md``; slices and grants inside are spelled by :mod:`gpuslice.spec.codec`, as
on every other wire. Decoders refuse what they do not understand with :class:`SpecError` naming the
annotation and the path of the bad value; nothing here talks to the API server.

Objects are plain dicts as the API server serialises them (camelCase: ``metadata.annotations``,
``spec.containers[].resources.limits``) — the extender and the webhook receive exactly that, and the
API wrapper (:mod:`gpuslice.kube.api`) returns the same.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from gpuslice.placement import DEFAULT_SPLIT_COUNT
from gpuslice.spec import (
    Device, Grant, HoldsGrant, MigInstance, Slice, SpecError, grant_from_json, grant_to_json, whole_number,
)

FORMAT_VERSION = 1

# ------------------------------------------------------------------------------------- annotation keys
NODE_DEVICES = "gpuslice.io/devices"          # written by the agent (kube-agent): what the node has
NODE_LEDGER = "gpuslice.io/ledger"            # written by the extender (bind, live resize): grants on the node (CAS)
NODE_ALLOCATING = "gpuslice.io/allocating"    # the allocation lock: pods bound here, Allocate not done (CAS)
POD_GRANT = "gpuslice.io/grant"               # written by the extender's bind: the pod's slices
POD_ALLOCATED = "gpuslice.io/allocated"       # written by the device plugin: containers allocated
POD_POLICY = "gpuslice.io/policy"             # per pod: "fgd" or "node=spread,gpu=binpack"
POD_NODE_POLICY = "gpuslice.io/node-policy"   # per pod, node level only
POD_GPU_POLICY = "gpuslice.io/gpu-policy"     # per pod, GPU level only
POD_COMPUTE_MODE = "gpuslice.io/compute-mode"  # per pod: hard | soft | off
POD_ENGINE = "gpuslice.io/engine"             # per pod: timeslice | spatial (MPS-backed)
POD_RESIZE = "gpuslice.io/resize"             # per pod, by users: new sizes of a container's slices (live)
POD_RESIZE_STATUS = "gpuslice.io/resize-status"  # written by the node agent and the extender: where it stands
POD_COLOCATION = "gpuslice.io/colocation"     # per pod: preemptive | shared | tidal (issue 13)
POD_TIDAL_SCHEDULE = "gpuslice.io/tidal-schedule"  # per pod, with colocation tidal: "8-20:30,20-8:100" (UTC hours)
HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
HAMI_USE_INDEX = "nvidia.com/use-gpuindexes"             # per pod: device indexes (nvidia-smi's) allowed
HAMI_NOUSE_INDEX = "nvidia.com/nouse-gpuindexes"         # per pod: device indexes not to use
HAMI_VULKAN = "hami.io/vulkan"                           # per pod: HAMi's Vulkan layer (not applied, warned)
# HAMi's other pod annotations and its device cordon (read by gpuslice.kube.hami) and ours beside them.
HAMI_VGPU_MODE = "nvidia.com/vgpu-mode"                  # per pod: hami-core | mig | mps (= engine spatial)
HAMI_NUMA_BIND = "nvidia.com/numa-bind"                  # per pod: "true" = each container's devices on one NUMA node
HAMI_SCORING_WEIGHTS = "hami.io/device-scoring-weights"  # per pod: "slot=1,core=1,memory=3"
HAMI_MIG_PREFERENCE = "nvidia.com/mig-profile-preference"  # per pod (dynamic MIG): not applied, warned
POD_MIG_PROFILE = "gpuslice.io/mig-profile"              # per pod: "3g.40gb" or "main=3g.40gb,side=1g.10gb"
HAMI_DEVICE_CORDON = "hami.io/device-cordon"             # per Node: GPU UUIDs that take nothing new
NODE_DEVICE_CORDON = "gpuslice.io/device-cordon"         # the same under gpuslice's name

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


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
CONTAINER_KINDS = ("app", "init", "sidecar")  # spec.containers; spec.initContainers; those with restartPolicy Always


@dataclass(frozen=True)
class ContainerGrant(HoldsGrant):
    """The grant of one container: its name, the :class:`Grant` (id ``k-<pod uid>-<container>``) and the
    container's kind: ``app`` (``spec.containers``), ``init`` (an init container: it runs alone, before the
    app containers, so its slices are not added to theirs — :meth:`PodGrant.charges`) or ``sidecar`` (an
    init container with ``restartPolicy: Always``: it runs beside everything after it)."""

    container: str
    grant: Grant
    kind: str = "app"

    def __post_init__(self) -> None:
        if self.kind not in CONTAINER_KINDS:
            raise SpecError("kind", self.kind, "one of " + ", ".join(CONTAINER_KINDS))


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

    def charges(self) -> tuple[tuple[tuple[Slice, ...], bool], ...]:
        """What the pod holds on its node, as ``(slices, exclusive)`` pairs for placement's ``apply``.

        Without init containers: each container's grant. An init container runs alone before the app
        containers (beside the sidecars declared before it), so per device the pod holds the sidecars'
        slices plus the larger of the app containers' sum and the largest init slice — memory and compute
        each (HAMi's ``max(sum(app), max(init))``, per device): the first app or sidecar slice on a device is
        raised by what an init container needs beyond the app containers there, or, with none there, the
        init containers' largest memory and compute become one slice. A device any container holds whole is
        held whole by the pod, as one slice."""
        if not any(c.kind == "init" for c in self.containers):
            return tuple((c.slices, c.exclusive) for c in self.containers)
        running = [c for c in self.containers if c.kind != "init"]
        inits = [c for c in self.containers if c.kind == "init"]
        app_sum: dict[str, list[int]] = {}
        for c in running:
            if c.kind == "app":
                for sl in c.slices:
                    total = app_sum.setdefault(sl.device_uuid, [0, 0])
                    total[0] += sl.memory_limit
                    total[1] += sl.compute
        init_max: dict[str, list[Any]] = {}
        for c in inits:
            for sl in c.slices:
                top = init_max.setdefault(sl.device_uuid, [0, 0, sl])
                top[0], top[1] = max(top[0], sl.memory_limit), max(top[1], sl.compute)
        whole = {u for c in self.containers if c.exclusive for u in c.uuids}
        shared: list[Slice] = []
        held: dict[str, Slice] = {}
        raised: set[str] = set()
        for c in running:
            for sl in c.slices:
                u = sl.device_uuid
                if u in init_max and u not in raised:
                    raised.add(u)
                    mem, comp = app_sum.get(u, [0, 0])
                    sl = replace(sl, memory_limit=sl.memory_limit + max(0, init_max[u][0] - mem),
                                 compute=min(100, sl.compute + max(0, init_max[u][1] - comp)))
                if u in whole:
                    prev = held.get(u)
                    held[u] = sl if prev is None else replace(
                        prev, memory_limit=prev.memory_limit + sl.memory_limit,
                        compute=min(100, prev.compute + sl.compute))
                else:
                    shared.append(sl)
        for u, (mem, comp, sl) in init_max.items():
            if u not in raised:
                sl = replace(sl, memory_limit=mem, compute=comp)
                if u in whole:
                    held[u] = sl
                else:
                    shared.append(sl)
        out: list[tuple[tuple[Slice, ...], bool]] = []
        if shared:
            out.append((tuple(shared), False))
        if held:
            out.append((tuple(held.values()), True))
        return tuple(out)


def grant_id_for(pod_uid: str, container: str) -> str:
    """A grant id unique per pod and container: ``k-<pod uid>-<container>`` (≤ 128 characters)."""
    text = re.sub(r"[^A-Za-z0-9._-]", "-", f"k-{pod_uid}-{container}")
    return text[:128]


def _containers_json(containers: Iterable[ContainerGrant]) -> list[dict[str, Any]]:
    # "kind" only for init containers and sidecars: an app container's object is what it always was.
    return [{"name": c.container, **grant_to_json(c.grant), **({"kind": c.kind} if c.kind != "app" else {})}
            for c in containers]


def _containers_from(where: str, raw: Any) -> tuple[ContainerGrant, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError(where, raw, "a non-empty list of containers")
    out = []
    for n, item in enumerate(raw):
        cw = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise SpecError(cw, item, "an object with name, grant, exclusive, slices")
        kind = item.get("kind", "app")
        if kind not in CONTAINER_KINDS:
            raise SpecError(f"{cw}.kind", kind, "one of " + ", ".join(CONTAINER_KINDS))
        out.append(ContainerGrant(container=_str(f"{cw}.name", item.get("name")), grant=grant_from_json(item, cw),
                                  kind=kind))
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
        """What the grants hold (:meth:`PodGrant.charges`: init containers counted as HAMi does) and the
        UUIDs held whole."""
        shared, exclusive = [], set()
        for g in self.entries.values():
            for slices, whole in g.charges():
                shared.extend(slices)
                if whole:
                    exclusive.update(s.device_uuid for s in slices)
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


def cordoned(obj: Mapping[str, Any]) -> frozenset[str]:
    """Device UUIDs a Node's ``hami.io/device-cordon`` / ``gpuslice.io/device-cordon`` take out of new
    placement (comma-separated; the grants already there stay). Anything but a string is refused."""
    anns = annotations(obj)
    out: set[str] = set()
    for key in (HAMI_DEVICE_CORDON, NODE_DEVICE_CORDON):
        value = anns.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise SpecError(key, value, "GPU UUIDs separated by commas")
        out |= {u.strip() for u in value.split(",") if u.strip()}
    return frozenset(out)


def device_counts(grant: PodGrant) -> frozenset[int]:
    """The device counts of the grant's containers: what the kubelet's Allocate calls will carry (IDs)."""
    return frozenset(len(c.slices) for c in grant.containers)


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
