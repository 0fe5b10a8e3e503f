"""A pod's GPU request: what each container asks for (from its resource limits, with the cluster's
defaults), the pod's policy and device constraints (from its annotations, gpuslice's and HAMi's).

The extender parses the pod itself in filter, prioritize and bind: pod resource limits are immutable and
are what the kubelet allocates by, so they, not an annotation anyone could have written at creation, are
the request. The webhook parses the same way to refuse a bad pod at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from gpuslice.kube.formats import (
    HAMI_GPU_POLICY, HAMI_NODE_POLICY, HAMI_NOUSE_TYPE, HAMI_NOUSE_UUID, HAMI_USE_TYPE, HAMI_USE_UUID,
    POD_COMPUTE_MODE, POD_GPU_POLICY, POD_NODE_POLICY, POD_POLICY, NodeDevices, annotations,
)
from gpuslice.kube.resources import KubeConfig, limits_of, mib_quantity, one_of, whole_quantity
from gpuslice.placement import POLICIES, PlacementPolicy
from gpuslice.spec import ComputeMode, Device, MemoryAmount, MiB, Priority, Request, SpecError, parse_models


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


PRIORITY_MAX = 2**31 - 1


def container_request(container: Mapping[str, Any], cfg: KubeConfig, where: str,
                      mode: ComputeMode | None = None, models: tuple[str, ...] = (),
                      notes: list[str] | None = None) -> Request | None:
    """The request of one container from its resource limits, with HAMi's defaults filled; ``None`` when
    the container asks for no GPU. Contradictions raise :class:`SpecError` naming the resources.

    HAMi's rules where they differ from a plain reading (``src/gpuslice/kube/README.md`` lists them):
    no count and ``defaultGPUNum`` 0 → not a GPU container (its memory/cores are ignored); a priority
    without any GPU request is ignored; priority 0 is high and every larger whole number low; cores 100
    take the devices whole (exclusive), with or without a memory size. One rule is gpuslice's own: cores
    below 100 with no memory and no ``defaultMem`` get the same percent of each device's memory
    (:meth:`Request.with_default_memory`), not the whole card. What is ignored or defaulted is said in
    ``notes`` (the webhook returns them as admission warnings)."""
    names = cfg.names
    limits = limits_of(container)
    count = one_of(limits, names.count, where, lambda k, v: whole_quantity(k, v, 0, 64, "a whole number of devices 0..64"))
    mem_mib = one_of(limits, names.memory_mib, where, mib_quantity)
    mem_bytes = one_of(limits, names.memory_bytes, where, lambda k, v: whole_quantity(
        k, v, 1, 2**60, "a size like 4Gi or 4096Mi (whole bytes)"))
    mem_pct = one_of(limits, names.memory_percent, where, lambda k, v: whole_quantity(
        k, v, 1, 100, "a whole percent of one device's memory from 1 to 100"))
    cores = one_of(limits, names.compute, where, lambda k, v: whole_quantity(
        k, v, 0, 100, "a whole percent of one device's SM time from 0 to 100"))
    prio = one_of(limits, names.priority, where, lambda k, v: whole_quantity(
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
    memory = _memory(mem_mib, mem_bytes, mem_pct, cfg)
    compute = cores[1] if cores is not None else cfg.default_cores
    # HAMi: "Coresreq=100 indicates it want this card exclusively" — an idle card, nobody else after it,
    # whatever memory was asked for (the slice's memory limit is still what was asked).
    exclusive = compute == 100
    priority = Priority.HIGH if prio is not None and prio[1] == 0 else Priority.LOW
    request = Request(count=n_devices, memory=memory, compute=compute, priority=priority,
                      mode=mode or cfg.default_mode, exclusive=exclusive, models=models)
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
        if isinstance(init, Mapping) and gpu_names & set(limits_of(init)):
            raise SpecError(f"spec.initContainers[{k}].resources.limits", sorted(gpu_names & set(limits_of(init))),
                            "no GPU slices in init containers (gpuslice grants them to regular containers only)")
    out = []
    notes: list[str] = []
    for k, c in enumerate(containers):
        if not isinstance(c, Mapping):
            raise SpecError(f"spec.containers[{k}]", c, "a container object")
        name = c.get("name")
        where = f"spec.containers[{k}]" + (f"({name})" if name else "")
        if not isinstance(name, str) or not name:
            if gpu_names & set(limits_of(c)):
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


def memory_text(amount: MemoryAmount | None) -> str:
    return "whole device" if amount is None else str(amount)
