"""Kubernetes resource names and quantities, translated into gpuslice's vocabulary: HAMi's names (and
gpuslice's own), the cluster's defaults (HAMi's ``defaultMem``/``defaultCores``/``defaultGPUNum``) in
:class:`KubeConfig`, and the quantity grammar of the API server.

Kubernetes quantities (``4Gi``, ``3k``, ``1e3``) are the API server's syntax, where ``k``/``M``/``G`` are
decimal and ``m`` means milli: they have their own parser here on purpose, apart from gpuslice's human
units (:mod:`gpuslice.spec.units`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from gpuslice.placement import PlacementPolicy
from gpuslice.spec import Colocation, ComputeMode, Engine, SpecError, whole_number

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


NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PriorityRefused(SpecError):
    """High priority asked in a namespace the cluster's policy does not allow it in (the webhook answers 403)."""


@dataclass(frozen=True)
class HighPriorityNamespaces:
    """Which namespaces' pods and claims may be high priority (``--high-priority-namespace``, chart
    ``sharing.highPriorityNamespaces``; issue 15). A high-priority slice makes the low-priority slices on its
    device wait while its work is queued (bounded: native/README-compute.md, "Co-location"), so asking for it
    is asking to slow other tenants down; in Kubernetes the tenant is the namespace. ``("*",)``, the default,
    lets every namespace ask, as HAMi does (its ``nvidia.com/priority: 0`` has no rule); an empty tuple lets
    none. Plain data, checked by the webhook, the extender's bind and live resize, and the DRA driver."""

    names: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        allowed = "'*' (every namespace) or namespace names (DNS labels like online-serving)"
        if not isinstance(self.names, tuple) or not all(isinstance(n, str) for n in self.names):
            raise SpecError("high_priority_namespaces", self.names, allowed)
        for n in self.names:
            if n != "*" and not NAMESPACE_RE.fullmatch(n):
                raise SpecError("high_priority_namespaces", n, allowed)
        if "*" in self.names and len(self.names) > 1:
            raise SpecError("high_priority_namespaces", self.names, "'*' alone, or namespace names without '*'")

    def allows(self, namespace: str) -> bool:
        return "*" in self.names or namespace in self.names

    def describe(self) -> str:
        return "every namespace" if "*" in self.names else (", ".join(self.names) or "no namespace")

    def check(self, namespace: str, field_name: str, value: object) -> None:
        """Raise :class:`PriorityRefused` naming ``field_name`` unless ``namespace`` may ask for high priority."""
        if not self.allows(namespace):
            raise PriorityRefused(field_name, value, f"low priority: namespace {namespace!r} may not ask for high "
                                  f"priority (allowed in: {self.describe()}; a cluster administrator sets "
                                  "sharing.highPriorityNamespaces)")


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
    default_engine: Engine = Engine.TIMESLICE  # for pods without gpuslice.io/engine (chart: sharing.engine)
    # for pods without gpuslice.io/colocation (chart: sharing.colocation); a tidal default applies to the
    # low-priority, hard containers only (the others stay preemptive: tidal is theirs alone)
    default_colocation: Colocation = Colocation.PREEMPTIVE
    scheduler_name: str = "gpuslice-scheduler"
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    # Pods naming these schedulers (or none) are sent to scheduler_name; a pod naming another is left to
    # it, as HAMi does (which takes over default-scheduler only).
    adopt_schedulers: tuple[str, ...] = ("default-scheduler",)
    high_priority: HighPriorityNamespaces = field(default_factory=HighPriorityNamespaces)

    def __post_init__(self) -> None:
        whole_number("default_memory_mib", self.default_memory_mib, 0, allowed="a whole number of MiB, 0 = whole device")
        whole_number("default_cores", self.default_cores, 0, 100, allowed="a whole percent from 0 to 100")
        whole_number("default_gpu_num", self.default_gpu_num, 0, 64, allowed="a whole number from 0 to 64 (0 = no default)")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", self.scheduler_name or ""):
            raise SpecError("scheduler_name", self.scheduler_name, "a DNS subdomain like gpuslice-scheduler")
        if not isinstance(self.adopt_schedulers, tuple) or not all(
                isinstance(n, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", n) for n in self.adopt_schedulers):
            raise SpecError("adopt_schedulers", self.adopt_schedulers, "scheduler names (DNS subdomains) like default-scheduler")


def parse_quantity(key: str, value: Any) -> Decimal:
    """A Kubernetes quantity (``4Gi``, ``3000``, ``1e3``) as an exact Decimal; errors name ``key``."""
    from kubernetes.utils import parse_quantity as _pq

    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SpecError(key, value, "a Kubernetes quantity like 3000 or 4Gi")
    try:
        return Decimal(_pq(value))
    except (ValueError, InvalidOperation, TypeError):
        raise SpecError(key, value, "a Kubernetes quantity like 3000 or 4Gi") from None


def whole_quantity(key: str, value: Any, low: int, high: int, what: str) -> int:
    q = parse_quantity(key, value)
    if q != q.to_integral_value() or not low <= q <= high:
        raise SpecError(key, value, what)
    return int(q)


def mib_quantity(key: str, value: Any) -> int:
    """HAMi's ``gpumem``: a whole number of MiB, as any quantity (the API server stores 3000 as ``3k``).
    A binary suffix like ``3Gi`` would mean 3·2³⁰ MiB; the bound (16 TiB) refuses it with a hint."""
    what = "a whole number of MiB like 3000 (at most 16 TiB; for sizes with units use gpuslice.io/gpu-memory: 4Gi)"
    return whole_quantity(key, value, 1, 2**24, what)


def one_of(limits: Mapping[str, Any], names: Sequence[str], where: str, convert) -> tuple[str, Any] | None:
    found = [(n, convert(f"{where}.resources.limits[{n}]", limits[n])) for n in names if n in limits]
    if not found:
        return None
    values = {v for _, v in found}
    if len(values) > 1:
        shown = ", ".join(f"{n}={limits[n]}" for n, _ in found)
        raise SpecError(f"{where}.resources.limits", shown,
                        "the same value under each name that means the same thing (they contradict)")
    return found[0]


def limits_of(container: Mapping[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    limits = dict(res.get("requests") or {})
    limits.update(res.get("limits") or {})  # extended resources: limits are authoritative
    return limits
