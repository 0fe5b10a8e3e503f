"""A pod's GPU request: what each container asks for (from its resource limits, with the cluster's
defaults), the pod's policy and device constraints (from its annotations, gpuslice's and HAMi's).

The extender parses the pod itself in filter, prioritize and bind: pod resource limits are immutable and
are what the kubelet allocates by, so they, not an annotation anyone could have written at creation, are
the request. The webhook parses the same way to refuse a bad pod at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from gpuslice.kube import hami
from gpuslice.kube.formats import (
    HAMI_GPU_POLICY, HAMI_MIG_PREFERENCE, HAMI_NODE_POLICY, HAMI_NOUSE_TYPE, HAMI_NOUSE_UUID, HAMI_USE_TYPE,
    HAMI_NOUSE_INDEX, HAMI_SCORING_WEIGHTS, HAMI_USE_INDEX, HAMI_USE_UUID, HAMI_VULKAN, HAMI_VGPU_MODE, POD_COLOCATION, POD_COMPUTE_MODE, POD_ENGINE, POD_GPU_POLICY, POD_MIG_PROFILE, POD_TIDAL_SCHEDULE,
    POD_NODE_POLICY, POD_POLICY, NodeDevices, annotations,
)
from gpuslice.kube.resources import KubeConfig, limits_of, mib_quantity, one_of, whole_quantity
from gpuslice.placement import POLICIES, PlacementPolicy
from gpuslice.spec import Colocation, ComputeMode, Device, Engine, MemoryAmount, MiB, Priority, Request, SpecError, parse_models, parse_tidal_schedule


# ------------------------------------------------------------------------------------- pod requests
@dataclass(frozen=True)
class MigAsk:
    """Whole MIG instances for one container (HAMi's ``vgpu-mode: mig``, or ``nvidia.com/mig-<profile>``):
    ``count`` instances of ``profile`` (any profile when ''), each with at least ``memory`` (None: any).
    Instances that exist are placed as devices; gpuslice never creates or changes MIG partitions."""

    count: int
    memory: MemoryAmount | None = None
    profile: str = ""
    resource: str = ""  # the nvidia.com/mig-<profile> name it was asked by (the webhook rewrites it)


@dataclass(frozen=True)
class ContainerRequest:
    name: str
    index: int  # in spec.containers (kind app) or spec.initContainers (init, sidecar)
    request: Request
    kind: str = "app"  # app | init | sidecar (formats.CONTAINER_KINDS)
    mig: MigAsk | None = None

    @property
    def part(self) -> str:
        """The pod spec list the container is in."""
        return "containers" if self.kind == "app" else "initContainers"


@dataclass(frozen=True)
class PodRequest:
    """The GPU requests of a pod's containers (only containers that ask for GPU slices; init containers
    and sidecars first, in spec order), its per-pod policy (``None`` = the cluster's), devices it must not
    use, and HAMi's per-pod rules (:mod:`gpuslice.kube.hami`)."""

    containers: tuple[ContainerRequest, ...]
    policy: PlacementPolicy | None = None
    avoid_models: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    avoid_uuids: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what was ignored, HAMi-style (the webhook shows them as warnings)
    use_indexes: tuple[int, ...] = ()  # nvidia.com/use-gpuindexes: only these device indexes
    avoid_indexes: tuple[int, ...] = ()  # nvidia.com/nouse-gpuindexes
    mode: str = ""  # nvidia.com/vgpu-mode: '' (any device), hami-core (no MIG instance) or mig
    mutex: bool = False  # hami.io/gpu-scheduler-policy mutex: only devices nobody uses
    numa_bind: bool = False  # nvidia.com/numa-bind: each container's devices on one NUMA node
    numa_prefer: bool = False  # gpu-scheduler-policy numa: on one NUMA node where one has room, else any

    @property
    def empty(self) -> bool:
        return not self.containers

    @property
    def device_counts(self) -> frozenset[int]:
        """Device counts of the GPU containers (the allocation lock is per count)."""
        return frozenset(c.request.count for c in self.containers)

    @property
    def simple(self) -> bool:
        """Whether the shared fleet can place it: app containers only, no MIG instances, no per-pod device
        rule (the rest is placed node by node, :meth:`Extender._place_all`)."""
        return not (self.avoid_models or self.avoid_uuids or self.use_uuids or self.use_indexes
                    or self.avoid_indexes or self.mode or self.mutex or self.numa_bind or self.numa_prefer
                    or any(c.kind != "app" or c.mig for c in self.containers))


PRIORITY_MAX = 2**31 - 1


@dataclass(frozen=True)
class Asked:
    """What one container's limits say, each as ``(resource name, value)`` or None."""

    count: tuple[str, int] | None
    mem_mib: tuple[str, int] | None
    mem_bytes: tuple[str, int] | None
    mem_pct: tuple[str, int] | None
    cores: tuple[str, int] | None
    prio: tuple[str, int] | None
    mig: tuple[str, int] | None  # nvidia.com/mig-<profile>: instances

    @property
    def gpu(self) -> bool:
        """Asks for a GPU by any name but the priority."""
        return any(x is not None for x in (self.count, self.mem_mib, self.mem_bytes, self.mem_pct, self.cores, self.mig))


def asked(container: Mapping[str, Any], cfg: KubeConfig, where: str) -> Asked:
    """Read one container's GPU limits (values checked, contradictions between names refused)."""
    names = cfg.names
    limits = limits_of(container)
    migs = [n for n in limits if hami.MIG_RESOURCE.fullmatch(str(n))]
    if len(migs) > 1:
        raise SpecError(f"{where}.resources.limits", ", ".join(sorted(migs)), "one MIG profile per container")
    return Asked(
        count=one_of(limits, names.count, where, lambda k, v: whole_quantity(k, v, 0, 64, "a whole number of devices 0..64")),
        mem_mib=one_of(limits, names.memory_mib, where, mib_quantity),
        mem_bytes=one_of(limits, names.memory_bytes, where, lambda k, v: whole_quantity(
            k, v, 1, 2**60, "a size like 4Gi or 4096Mi (whole bytes)")),
        # HAMi accepts 0..100; 0 reserves nothing there (and HAMi-core reads a 0 limit as none): see below
        mem_pct=one_of(limits, names.memory_percent, where, lambda k, v: whole_quantity(
            k, v, 0, 100, "a whole percent of one device's memory from 0 to 100")),
        cores=one_of(limits, names.compute, where, lambda k, v: whole_quantity(
            k, v, 0, 100, "a whole percent of one device's SM time from 0 to 100")),
        prio=one_of(limits, names.priority, where, lambda k, v: whole_quantity(
            k, v, 0, PRIORITY_MAX, "a whole number: 0 = high priority, 1 or more = low (HAMi's rule)")),
        mig=one_of(limits, migs, where, lambda k, v: whole_quantity(k, v, 0, 64, "a whole number of MIG instances 0..64")),
    )


def container_request(container: Mapping[str, Any], cfg: KubeConfig, where: str,
                      mode: ComputeMode | None = None, models: tuple[str, ...] = (),
                      notes: list[str] | None = None, engine: Engine = Engine.TIMESLICE,
                      colocation: "PodColocation | None" = None) -> Request | None:
    """The request of one container from its resource limits, with HAMi's defaults filled; ``None`` when
    the container asks for no GPU. Contradictions raise :class:`SpecError` naming the resources.

    HAMi's rules where they differ from a plain reading (``src/gpuslice/kube/README.md`` lists them):
    no count and ``defaultGPUNum`` 0 → not a GPU container (its memory/cores are ignored); a priority
    without any GPU request is ignored; priority 0 is high and every larger whole number low; cores 100
    take the devices whole (exclusive), with or without a memory size; memory percent 0 is no memory
    request (the default applies). One rule is gpuslice's own: cores below 100 with no memory and no
    ``defaultMem`` get the same percent of each device's memory (:meth:`Request.with_default_memory`), not
    the whole card. What is ignored or defaulted is said in ``notes`` (the webhook returns them as admission
    warnings)."""
    names = cfg.names
    limits = limits_of(container)
    a = asked(container, cfg, where)
    count, mem_mib, mem_bytes, mem_pct, cores, prio = a.count, a.mem_mib, a.mem_bytes, a.mem_pct, a.cores, a.prio

    def note(text: str) -> None:
        if notes is not None:
            notes.append(f"{where}: {text}")

    if not a.gpu:
        if prio is not None:  # HAMi passes the priority on to a container that has no GPU: no effect
            note(f"{prio[0]} is ignored: the container asks for no GPU ({names.advertised})")
        return None
    if mem_pct is not None and mem_pct[1] == 0:
        # HAMi reserves nothing for 0 % and HAMi-core reads the resulting 0 limit as "no limit"; gpuslice
        # reserves what it limits, so 0 % is read as no memory request: the cluster's default applies.
        note(f"{mem_pct[0]}: 0 reserves nothing and lifts the memory limit in HAMi; gpuslice limits what it "
             "reserves, so the container gets the default memory instead (write a percent from 1 to 100 or "
             f"{names.memory_mib[0]} for a limit)")
        mem_pct = None
    given_mem = [x for x in (mem_mib, mem_bytes, mem_pct) if x is not None]
    if len(given_mem) > 1:
        shown = ", ".join(f"{n}={limits[n]}" for n, _ in given_mem)
        sizes = ", ".join((*names.memory_mib, *names.memory_bytes))
        raise SpecError(f"{where}.resources.limits", shown,
                        f"one memory request: a size ({sizes}) or a percent ({names.memory_percent[0]}), not both")
    if count is None:
        if cfg.default_gpu_num == 0:  # HAMi: no count and no default count -> not a GPU container
            asked_names = ", ".join(n for n, _ in (*given_mem, *([cores] if cores else []), *([prio] if prio else [])))
            note(f"{asked_names} ignored: no {names.advertised} and no default GPU count (defaultGPUNum is 0), "
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
    memory = _memory(mem_mib, mem_bytes, mem_pct, cfg)
    compute = cores[1] if cores is not None else cfg.default_cores
    # HAMi: "Coresreq=100 indicates it want this card exclusively" — an idle card, nobody else after it,
    # whatever memory was asked for (the slice's memory limit is still what was asked).
    exclusive = compute == 100
    priority = Priority.HIGH if prio is not None and prio[1] == 0 else Priority.LOW
    if engine is Engine.SPATIAL and n_devices > 1:
        shown = f"{count[0]}={limits[count[0]]}" if count else f"defaultGPUNum {n_devices}"
        raise SpecError(f"{where}.resources.limits", shown, "1 device: a spatial (MPS) container is the client of "
                        f"one device's MPS daemon ({POD_ENGINE}: spatial or {HAMI_VGPU_MODE}: mps)")
    request = (colocation or PodColocation()).apply(
        dict(count=n_devices, memory=memory, compute=compute, priority=priority, mode=mode or cfg.default_mode,
             exclusive=exclusive, models=models, engine=engine), cfg)
    if request.compute_only and not given_mem:  # gpuslice's rule; HAMi gives such a container the whole card
        request = request.with_default_memory()
        if cores is not None:  # cores from defaultCores: the cluster's documented rule, no warning per pod
            note(f"no GPU memory given: {request.memory} of each device's memory, the same share as its "
                 f"{compute}% of compute, so the device stays shareable (give {names.memory_mib[0]} or "
                 f"{names.memory_percent[0]}, or set defaultMem, to choose)")
    return request


def _memory(mem_mib: tuple[str, int] | None, mem_bytes: tuple[str, int] | None, mem_pct: tuple[str, int] | None,
            cfg: KubeConfig) -> MemoryAmount | None:
    """The memory a container asked for (one of the three, checked before), or the cluster's default."""
    if mem_mib is not None:
        return MemoryAmount(bytes=mem_mib[1] * MiB)
    if mem_bytes is not None:
        return MemoryAmount(bytes=mem_bytes[1])
    if mem_pct is not None:
        return None if mem_pct[1] == 100 else MemoryAmount(percent=float(mem_pct[1]))
    if cfg.default_memory_mib:
        return MemoryAmount(bytes=cfg.default_memory_mib * MiB)
    return None  # HAMi: no memory and no default -> the whole device (100%); see compute_only below


def mig_request(container: Mapping[str, Any], cfg: KubeConfig, where: str, profile: str,
                mode: ComputeMode | None = None, notes: list[str] | None = None) -> tuple[Request, MigAsk] | None:
    """Whole MIG instances for a container that asks by ``nvidia.com/mig-<profile>``, or whose pod is in
    HAMi's ``vgpu-mode: mig`` (``profile``: the pod's ``gpuslice.io/mig-profile`` for it, '' = any): its
    count is the number of instances (HAMi's defaults as for slices), its memory the least each must
    have. ``None`` when the container asks for no GPU. An instance is held whole: cores are moot."""
    a = asked(container, cfg, where)
    names = cfg.names
    if not a.gpu:
        return None
    if a.mig is not None:
        others = [x[0] for x in (a.count, a.mem_mib, a.mem_bytes, a.mem_pct, a.cores) if x is not None]
        if others:
            raise SpecError(f"{where}.resources.limits", ", ".join([a.mig[0], *others]),
                            f"{a.mig[0]} alone: it asks for whole MIG instances of that profile, so a count, memory "
                            f"or cores beside it contradict it (for instances by size use {names.advertised} with "
                            f"{names.memory_mib[0]} and the annotation nvidia.com/vgpu-mode: mig)")
        if a.mig[1] == 0:
            return None
        mig = MigAsk(count=a.mig[1], profile=hami.mig_profile_of(a.mig[0]), resource=a.mig[0])
    else:
        base = container_request(container, cfg, where, mode=mode, notes=notes)
        if base is None:
            return None
        if a.cores is not None:
            (notes if notes is not None else []).append(
                f"{where}: {a.cores[0]} is ignored: a MIG instance is held whole, with its own share of the GPU")
        memory = None
        if a.mem_mib is not None:
            memory = MemoryAmount(bytes=a.mem_mib[1] * MiB)
        elif a.mem_bytes is not None:
            memory = MemoryAmount(bytes=a.mem_bytes[1])
        elif a.mem_pct is not None and a.mem_pct[1]:
            memory = MemoryAmount(percent=float(a.mem_pct[1]))
        mig = MigAsk(count=base.count, memory=memory, profile=profile)
    priority = Priority.HIGH if a.prio is not None and a.prio[1] == 0 else Priority.LOW
    request = Request(count=mig.count, memory=None, compute=0, priority=priority, mode=mode or cfg.default_mode,
                      exclusive=True, models=(mig.profile,) if mig.profile else ())
    return request, mig


def pod_policy(anns: Mapping[str, str], cfg: KubeConfig) -> tuple[PlacementPolicy | None, hami.GpuPolicy]:
    """The pod's policy from ``gpuslice.io/policy`` / ``…/node-policy`` / ``…/gpu-policy`` (or HAMi's
    ``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy``, the latter a comma list with
    ``numa`` / ``mutex``, and ``hami.io/device-scoring-weights``); ``None`` = the cluster's. Also the GPU
    policy's flags (:class:`gpuslice.kube.hami.GpuPolicy`)."""
    base = cfg.policy
    node, gpu = base.node, base.gpu
    changed = False
    flags = hami.GpuPolicy(order=None)
    if POD_POLICY in anns:
        try:
            p = PlacementPolicy.parse(anns[POD_POLICY])
        except SpecError as exc:
            raise SpecError(f"metadata.annotations[{POD_POLICY}]", anns[POD_POLICY], exc.allowed) from None
        node, gpu, changed = p.node, p.gpu, True
    for key, level in ((HAMI_NODE_POLICY, "node"), (POD_NODE_POLICY, "node"),
                       (HAMI_GPU_POLICY, "gpu"), (POD_GPU_POLICY, "gpu")):
        if key not in anns:
            continue
        if level == "gpu":
            flags = hami.gpu_policy(anns[key], key)
            gpu = flags.order or gpu
        else:
            value = str(anns[key]).strip().lower()
            if value not in POLICIES:
                raise SpecError(f"metadata.annotations[{key}]", anns[key], "one of " + ", ".join(POLICIES))
            node = value
        changed = True
    weights = hami.scoring_weights(anns)
    if not changed and weights is None:
        return None, flags
    # numa: keep multi-device grants on one NUMA node where possible (gpuslice's topology preference)
    return replace(base, node=node, gpu=gpu, weights=weights if weights is not None else base.weights,
                   topology=base.topology or flags.numa), flags


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


def privileged_problem(container: Mapping[str, Any], where: str) -> None:
    """HAMi refuses GPU slices for a privileged container, and so do we: it sees every device of the node
    and can undo what holds it to its slice (the read-only preload mount, the device list)."""
    sc = container.get("securityContext") or {}
    if isinstance(sc, Mapping) and sc.get("privileged") is True:
        raise SpecError(f"{where}.securityContext.privileged", True, (
            "false on a container with GPU slices: a privileged container sees every GPU of the node and can "
            "lift its limits (HAMi refuses it too); drop privileged, or give the container no GPU resources"))


def _spec_containers(spec: Mapping[str, Any]) -> list[tuple[str, int, Any]]:
    """(kind, index, container) of the init containers (and sidecars: restartPolicy Always) in order,
    then the app containers: the order the kubelet allocates devices in."""
    out = []
    for k, c in enumerate(spec.get("initContainers") or []):
        always = isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
        out.append(("sidecar" if always else "init", k, c))
    containers = spec.get("containers")
    if not isinstance(containers, list):
        raise SpecError("pod.spec.containers", containers, "a list of containers")
    out += [("app", k, c) for k, c in enumerate(containers)]
    return out


def pod_request(pod: Mapping[str, Any], cfg: KubeConfig, namespace: str | None = None) -> PodRequest:
    """The GPU requests of ``pod`` (a dict as the API server sends it) from its containers' resource
    limits (init containers and sidecars included, as HAMi counts them) and its annotations. Raises
    :class:`SpecError` naming the field on contradictions, and :class:`PriorityRefused` when a container asks
    for high priority in a namespace (``namespace``, else the pod's, else ``default``) the cluster's
    ``high_priority`` policy leaves out."""
    if not isinstance(pod, Mapping):
        raise SpecError("pod", type(pod).__name__, "a Pod object")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("pod.spec", spec, "an object with containers")
    anns = annotations(pod)
    if namespace is None:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    if not all(isinstance(v, str) for v in anns.values()):
        raise SpecError("metadata.annotations", anns, "string values")
    mode = None
    if POD_COMPUTE_MODE in anns:
        mode = ComputeMode.parse(anns[POD_COMPUTE_MODE], f"metadata.annotations[{POD_COMPUTE_MODE}]")
    models = _list_annotation(anns, HAMI_USE_TYPE)
    vgpu = hami.vgpu_mode(anns)
    engine = pod_engine(anns, cfg, vgpu)
    coloc = PodColocation.of(anns)
    if vgpu == "mps":
        vgpu = "hami-core"  # HAMi's MPS mode shares whole GPUs, never a MIG instance
    profiles = hami.mig_profiles(anns)
    gpu_names = set(cfg.names.all())
    out = []
    notes: list[str] = []
    for kind, k, c in _spec_containers(spec):
        part = "containers" if kind == "app" else "initContainers"
        if not isinstance(c, Mapping):
            raise SpecError(f"spec.{part}[{k}]", c, "a container object")
        name = c.get("name")
        where = f"spec.{part}[{k}]" + (f"({name})" if name else "")
        limits = limits_of(c)
        asks_gpu = bool(gpu_names & set(limits)) or any(hami.MIG_RESOURCE.fullmatch(str(n)) for n in limits)
        if not isinstance(name, str) or not name:
            if asks_gpu:
                raise SpecError(f"spec.{part}[{k}].name", name, "a container name")
            continue
        if asks_gpu:
            privileged_problem(c, where)
        profile = profiles.get(name, profiles.get("", ""))
        raw_mig = any(hami.MIG_RESOURCE.fullmatch(str(n)) for n in limits)
        if vgpu == "hami-core" and (raw_mig or profile):
            raise SpecError(f"metadata.annotations[{HAMI_VGPU_MODE}]", anns[HAMI_VGPU_MODE],
                            f"mig (or none): {where} asks for MIG instances, which hami-core mode never uses")
        if engine is Engine.SPATIAL and (vgpu == "mig" or raw_mig or profile):
            raise SpecError(f"metadata.annotations[{POD_ENGINE}]", anns.get(POD_ENGINE, engine.value),
                            f"timeslice: {where} asks for whole MIG instances, which gpuslice serves time-sliced")
        if vgpu == "mig" or profile or raw_mig:
            got = mig_request(c, cfg, where, profile, mode=mode, notes=notes)
            if got is not None:
                _high_priority_allowed(c, got[0], cfg, where, namespace)
                out.append(ContainerRequest(name=name, index=k, request=got[0], kind=kind, mig=got[1]))
            continue
        req = container_request(c, cfg, where, mode=mode, models=models, notes=notes, engine=engine, colocation=coloc)
        if req is not None:
            _high_priority_allowed(c, req, cfg, where, namespace)
            out.append(ContainerRequest(name=name, index=k, request=req, kind=kind))
    unknown = set(profiles) - {"", *(c.name for c in out)}
    if unknown:
        raise SpecError(f"metadata.annotations[{POD_MIG_PROFILE}]", anns[POD_MIG_PROFILE],
                        f"profiles of this pod's GPU containers (no GPU container named {', '.join(sorted(unknown))})")
    policy, flags = pod_policy(anns, cfg)
    if out:
        _pod_notes(anns, policy or cfg.policy, notes)
    return PodRequest(containers=tuple(out), policy=policy,
                      avoid_models=_list_annotation(anns, HAMI_NOUSE_TYPE),
                      use_uuids=_list_annotation(anns, HAMI_USE_UUID),
                      avoid_uuids=_list_annotation(anns, HAMI_NOUSE_UUID), notes=tuple(notes),
                      use_indexes=_index_annotation(anns, HAMI_USE_INDEX),
                      avoid_indexes=_index_annotation(anns, HAMI_NOUSE_INDEX), mode=vgpu, mutex=flags.mutex,
                      numa_bind=hami.numa_bind(anns), numa_prefer=flags.numa)


def _high_priority_allowed(container: Mapping[str, Any], req: Request, cfg: KubeConfig, where: str,
                           namespace: str) -> None:
    """The cluster's high-priority policy (:class:`HighPriorityNamespaces`), naming the container's limit."""
    if req.priority is Priority.HIGH:
        key = asked(container, cfg, where).prio
        name = key[0] if key else cfg.names.priority[0]
        cfg.high_priority.check(namespace, f"{where}.resources.limits[{name}]", limits_of(container).get(name, "0"))


@dataclass(frozen=True)
class PodColocation:
    """``gpuslice.io/colocation`` and ``gpuslice.io/tidal-schedule`` of a pod (None: not annotated). Applied to
    each time-sliced container's request; errors name the annotation. Without the annotation the cluster's
    default applies (``--default-colocation``, chart ``sharing.colocation``), a tidal default only to the
    low-priority hard containers (a high-priority server in the same cluster stays preemptive)."""

    colocation: Colocation | None = None
    schedule: str = ""

    @classmethod
    def of(cls, anns: Mapping[str, str]) -> "PodColocation":
        col = None
        if POD_COLOCATION in anns:
            col = Colocation.parse(anns[POD_COLOCATION], f"metadata.annotations[{POD_COLOCATION}]")
        sched = ""
        if POD_TIDAL_SCHEDULE in anns:
            key = f"metadata.annotations[{POD_TIDAL_SCHEDULE}]"
            sched = parse_tidal_schedule(anns[POD_TIDAL_SCHEDULE], key)
            if not sched or col is not Colocation.TIDAL:
                raise SpecError(key, anns[POD_TIDAL_SCHEDULE], f"spans like 8-20:30, with {POD_COLOCATION}: tidal")
        return cls(col, sched)

    def apply(self, fields: dict[str, Any], cfg: KubeConfig) -> Request:
        if self.colocation is None:
            col = cfg.default_colocation
            if col is Colocation.TIDAL and (fields["priority"] is not Priority.LOW or fields["mode"] is not ComputeMode.HARD
                                            or fields["engine"] is not Engine.TIMESLICE):
                col = Colocation.PREEMPTIVE
            return Request(**fields, colocation=col)
        try:
            return Request(**fields, colocation=self.colocation, tidal_schedule=self.schedule)
        except SpecError as exc:
            if exc.field not in ("colocation", "tidal_schedule"):
                raise
            key = POD_COLOCATION if exc.field == "colocation" else POD_TIDAL_SCHEDULE
            raise SpecError(f"metadata.annotations[{key}]", exc.value, exc.allowed) from None


def pod_engine(anns: Mapping[str, str], cfg: KubeConfig, vgpu: str) -> Engine:
    """``gpuslice.io/engine`` (timeslice | spatial), else HAMi's ``vgpu-mode: mps`` (spatial), else the
    cluster's default (``--default-engine``, chart ``sharing.engine``). The two annotations must agree."""
    key = f"metadata.annotations[{POD_ENGINE}]"
    engine = Engine.parse(anns[POD_ENGINE], key) if POD_ENGINE in anns else None
    if vgpu == "mps":
        if engine is Engine.TIMESLICE:
            raise SpecError(key, anns[POD_ENGINE], f"spatial, or no {POD_ENGINE}: {HAMI_VGPU_MODE}: mps asks for "
                            "MPS-backed (spatial) slices")
        return Engine.SPATIAL
    return engine or cfg.default_engine


def _index_annotation(anns: Mapping[str, str], key: str) -> tuple[int, ...]:
    """HAMi's ``use-gpuindexes`` / ``nouse-gpuindexes``: device indexes (as nvidia-smi numbers them) by commas."""
    names = _list_annotation(anns, key)
    if not all(n.isdigit() for n in names):
        raise SpecError(f"metadata.annotations[{key}]", anns[key], "device indexes like 0,1 separated by commas")
    return tuple(int(n) for n in names)


def _pod_notes(anns: Mapping[str, str], policy: PlacementPolicy, notes: list[str]) -> None:
    """Admission warnings for pod annotations that HAMi reads and gpuslice applies differently."""
    if str(anns.get(HAMI_VULKAN, "")).strip().lower() == "true":
        notes.append(f"metadata.annotations[{HAMI_VULKAN}]: gpuslice's enforcer limits CUDA (and NVML) only; "
                     "Vulkan memory and work of this pod are not held to its slice")
    if policy.weights is not None and policy.gpu not in ("binpack", "spread"):
        notes.append(f"metadata.annotations[{HAMI_SCORING_WEIGHTS}] is ignored: it weighs the binpack "
                     f"and spread device scores, and this pod's GPU policy is {policy.gpu}")
    if HAMI_MIG_PREFERENCE in anns:
        notes.append(f"metadata.annotations[{HAMI_MIG_PREFERENCE}] is ignored: gpuslice creates no MIG instances; "
                     "it gives the smallest existing instance that holds the request (name one profile with "
                     "gpuslice.io/mig-profile)")


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
    :func:`gpu_type_matches` —, use-gpuuuid and nouse-gpuuuid, use-gpuindexes and nouse-gpuindexes; in
    ``vgpu-mode: hami-core`` every MIG instance)."""
    out: set[str] = set()
    for d in devices.devices:
        ids = {d.uuid} | {m.uuid for m in d.mig_instances}
        if req.mode == "hami-core":
            out |= {m.uuid for m in d.mig_instances}
        if (req.use_indexes and d.index not in req.use_indexes) or d.index in req.avoid_indexes:
            out |= ids
        if req.avoid_models and gpu_type_matches(d, req.avoid_models):
            out |= ids
        if req.avoid_uuids and ids & set(req.avoid_uuids):
            out |= ids & set(req.avoid_uuids) or ids
        if req.use_uuids:
            out |= ids - set(req.use_uuids)
    return out


def memory_text(amount: MemoryAmount | None) -> str:
    return "whole device" if amount is None else str(amount)
