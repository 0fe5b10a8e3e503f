"""Namespace quotas on GPU devices, memory and compute, as HAMi's "extended ResourceQuota".

A ResourceQuota in the pod's namespace names the limits with the ``limits.`` prefix —
``limits.nvidia.com/gpumem: 20000`` (MiB), ``limits.nvidia.com/gpucores: 200`` (percent points),
``limits.nvidia.com/gpu: 4`` (devices), or gpuslice's ``limits.gpuslice.io/gpu-memory: 40Gi`` /
``limits.gpuslice.io/gpu-compute`` / ``limits.gpuslice.io/gpu``. The API server charges nothing for
``limits.<extended resource>`` (it counts extended resources only under ``requests.``), so these are
gpuslice's to enforce, with HAMi's semantics: a container's memory and compute count once per device
(``gpumem: 3000`` on 2 devices is 6000 MiB); per pod, app containers and sidecars add up and an init
container counts when it alone is larger (``max(sum(app), max(init + sidecars))``).

Where it is enforced:

* **admission** (the webhook): pods already granted in the namespace (their ``gpuslice.io/grant``) plus
  this pod's request; a memory percent or a whole device is not known before placement and is left out;
* **filter** and **bind** (the extender, authoritative): what the node ledgers grant in the namespace plus
  the pod — at bind its grant as placed, percents resolved — so a pod over quota stays Pending with the
  reason, and binds one namespace at a time in this extender.

Used and limits are exported as ``gpuslice_quota_used`` / ``gpuslice_quota_limit`` (:class:`QuotaCollector`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterable, Iterator, Mapping

from gpuslice.kube import formats
from gpuslice.kube.podrequest import PodRequest
from gpuslice.kube.resources import KubeConfig, parse_quantity
from gpuslice.spec import MiB, SpecError, human_bytes

log = logging.getLogger("gpuslice.quota")
PREFIX = "limits."
KINDS = ("devices", "memory", "compute")
UNITS = {"devices": "devices", "memory": "bytes", "compute": "percent"}


@dataclass(frozen=True)
class Usage:
    """What a pod or a namespace holds: devices, memory (bytes) and compute (percent points), each counted
    per device. ``partial``: some memory was not known (a percent or a whole device before placement)."""

    devices: int = 0
    memory: int = 0
    compute: int = 0
    partial: bool = False

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.devices + other.devices, self.memory + other.memory, self.compute + other.compute,
                     self.partial or other.partial)

    def get(self, kind: str) -> int:
        return int(getattr(self, kind))


def _pod_total(parts: Iterable[tuple[str, Usage]]) -> Usage:
    """HAMi's pod total from (container kind, usage): the larger of the running containers' sum (app
    containers and sidecars) and each init container with the sidecars beside it."""
    running, sidecars, inits = Usage(), Usage(), []
    for kind, u in parts:
        if kind == "init":
            inits.append(u)
            continue
        running = running + u
        if kind == "sidecar":
            sidecars = sidecars + u
    out = running
    for u in inits:
        u = u + sidecars
        out = Usage(max(out.devices, u.devices), max(out.memory, u.memory), max(out.compute, u.compute),
                    out.partial or u.partial)
    return out


def request_usage(req: PodRequest) -> Usage:
    """A pod's charge from its request (memory × devices, as HAMi); a percent / whole-device memory is
    left out and marked ``partial``."""
    parts = []
    for c in req.containers:
        r = c.request
        memory = c.mig.memory if c.mig is not None else r.memory
        per = memory.bytes if memory is not None else None  # None: a percent or the whole device
        parts.append((c.kind, Usage(r.count, (per or 0) * r.count, 0 if c.mig is not None else r.compute * r.count,
                                    per is None)))
    return _pod_total(parts)


def grant_usage(grant: formats.PodGrant) -> Usage:
    """A granted pod's charge from its slices as placed (memory known exactly)."""
    return _pod_total((c.kind, Usage(len(c.slices), sum(s.memory_limit for s in c.slices),
                                     sum(s.compute for s in c.slices))) for c in grant.containers)


@dataclass(frozen=True)
class Limit:
    kind: str
    value: int  # devices, bytes or percent points
    source: str  # "<quota name>: <key>"
    scale: int = 1  # what one unit of the quota's number is (MiB for HAMi's gpumem)


def quota_keys(cfg: KubeConfig) -> dict[str, tuple[str, int]]:
    """``limits.<resource>`` → (kind, multiplier to devices / bytes / percent)."""
    names = cfg.names
    out: dict[str, tuple[str, int]] = {}
    for n in names.count:
        out[PREFIX + n] = ("devices", 1)
    for n in names.memory_mib:
        out[PREFIX + n] = ("memory", MiB)
    for n in names.memory_bytes:
        out[PREFIX + n] = ("memory", 1)
    for n in names.compute:
        out[PREFIX + n] = ("compute", 1)
    return out


def limits_of(quotas: Iterable[Mapping[str, Any]], cfg: KubeConfig) -> dict[str, Limit]:
    """The tightest GPU limit of each kind among a namespace's ResourceQuotas (each quota holds on its own,
    so the smallest binds). A value that is not a quantity is logged and skipped, never enforced wrong."""
    keys = quota_keys(cfg)
    out: dict[str, Limit] = {}
    for q in quotas:
        name = str((q.get("metadata") or {}).get("name", "?"))
        hard = (q.get("spec") or {}).get("hard") or {}
        if not isinstance(hard, Mapping):
            continue
        for key, raw in hard.items():
            if key not in keys:
                continue
            kind, scale = keys[key]
            try:
                value = parse_quantity(f"ResourceQuota {name} spec.hard[{key}]", raw)
            except SpecError as exc:
                log.warning("%s", exc)
                continue
            limit = Limit(kind, int(value * Decimal(scale)), f"{name}: {key}", scale)
            if kind not in out or limit.value < out[kind].value:
                out[kind] = limit
    return out


def _shown(limit: Limit, value: int) -> str:
    if limit.kind == "memory":
        return f"{value // MiB} MiB" if limit.scale == MiB else human_bytes(value)
    return f"{value}{'%' if limit.kind == 'compute' else ''}"


def exceeded(namespace: str, limits: Mapping[str, Limit], used: Usage, adding: Usage) -> str:
    """Why ``adding`` does not fit the namespace's quota ('' when it does)."""
    for kind in KINDS:
        limit = limits.get(kind)
        if limit is None:
            continue
        after = used.get(kind) + adding.get(kind)
        if after > limit.value:
            what = {"devices": "GPU devices", "memory": "GPU memory (memory × devices, as HAMi counts it)",
                    "compute": "GPU compute (cores × devices, as HAMi counts it)"}[kind]
            return (f"namespace {namespace} is over its {what} quota ({limit.source}): {_shown(limit, limit.value)} "
                    f"allowed, {_shown(limit, used.get(kind))} granted, this pod adds {_shown(limit, adding.get(kind))}")
    return ""


def namespace_usage(entries: Iterable[formats.PodGrant], namespace: str, skip: str = "") -> Usage:
    total = Usage()
    for g in entries:
        if g.namespace == namespace and g.pod_uid != skip:
            total = total + grant_usage(g)
    return total


# ------------------------------------------------------------------------------------- admission
class AdmissionQuota:
    """The webhook's check: the namespace's ResourceQuotas and the grants of its live pods (two reads,
    only for GPU pods). An API failure admits the pod (the extender still enforces at bind)."""

    def __init__(self, api: Any, cfg: KubeConfig):
        self.api = api
        self.cfg = cfg

    def __call__(self, namespace: str, pod: Mapping[str, Any], req: PodRequest) -> str:
        try:
            limits = limits_of(self.api.list_resource_quotas(namespace), self.cfg)
            if not limits:
                return ""
            grants = []
            for p in self.api.list_pods(namespace=namespace):
                if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                text = ((p.get("metadata") or {}).get("annotations") or {}).get(formats.POD_GRANT)
                if text:
                    try:
                        grants.append(formats.decode_pod_grant(text))
                    except SpecError:
                        continue
        except Exception as exc:  # the API server away: admit, bind still checks
            log.warning("quota of namespace %s not checked at admission: %s", namespace, exc)
            return ""
        return exceeded(namespace, limits, namespace_usage(grants, namespace), request_usage(req))


# ------------------------------------------------------------------------------------- extender
class QuotaBook:
    """The extender's quotas: every namespace's ResourceQuotas (listed at most every ``ttl`` seconds, and
    afresh for a bind) against what the node ledgers grant there."""

    def __init__(self, api: Any, cfg: KubeConfig, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.cfg = cfg
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._by_ns: dict[str, dict[str, Limit]] = {}
        self._ns_locks: dict[str, threading.Lock] = {}

    def namespace_lock(self, namespace: str) -> threading.Lock:
        with self._lock:
            return self._ns_locks.setdefault(namespace, threading.Lock())

    def all_limits(self, fresh: bool = False) -> dict[str, dict[str, Limit]]:
        with self._lock:
            if not fresh and self.clock() - self._at < self.ttl:
                return self._by_ns
        try:
            quotas = self.api.list_resource_quotas("")
        except Exception:
            with self._lock:  # not asked again before ttl (filter calls come by the hundred)
                self._at = self.clock()
            raise
        by_ns: dict[str, list[Mapping[str, Any]]] = {}
        for q in quotas:
            by_ns.setdefault(str((q.get("metadata") or {}).get("namespace", "")), []).append(q)
        table = {ns: lim for ns, items in by_ns.items() if (lim := limits_of(items, self.cfg))}
        with self._lock:
            self._by_ns, self._at = table, self.clock()
        return table

    def check(self, namespace: str, entries: Callable[[], Iterable[formats.PodGrant]], adding: Usage, *,
              skip: str = "", fresh: bool = False) -> str:
        """Why ``adding`` does not fit ``namespace``'s quota ('' when it does or there is none); ``entries``
        (called only for a namespace with a quota) gives every grant on the nodes."""
        try:
            limits = self.all_limits(fresh).get(namespace)
        except Exception as exc:
            if fresh:  # a bind must not pass a quota it could not read
                return f"namespace {namespace}: its GPU quotas cannot be read ({exc})"
            log.warning("quotas not read: %s", exc)
            return ""
        if not limits:
            return ""
        return exceeded(namespace, limits, namespace_usage(entries(), namespace, skip), adding)


class QuotaCollector:
    """Prometheus: ``gpuslice_quota_limit`` and ``gpuslice_quota_used`` per namespace and resource
    (devices, memory in bytes, compute in percent points) for namespaces with a GPU quota."""

    def __init__(self, book: QuotaBook, entries: Callable[[], Iterable[formats.PodGrant]]):
        self.book = book
        self.entries = entries

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        limit = GaugeMetricFamily("gpuslice_quota_limit", "A namespace's GPU quota (limits.* of its "
                                  "ResourceQuotas; devices, bytes or percent points).", labels=["namespace", "resource", "quota"])
        used = GaugeMetricFamily("gpuslice_quota_used", "What the node ledgers grant in the namespace, counted "
                                 "as the quota counts it.", labels=["namespace", "resource"])
        try:
            table = self.book.all_limits()
        except Exception as exc:
            log.warning("quota metrics: %s", exc)
            table = {}
        grants = list(self.entries())
        for ns, limits in sorted(table.items()):
            total = namespace_usage(grants, ns)
            for kind, lim in limits.items():
                limit.add_metric([ns, UNITS[kind], lim.source], lim.value)
                used.add_metric([ns, UNITS[kind]], total.get(kind))
        yield limit
        yield used


__all__ = ["AdmissionQuota", "Limit", "QuotaBook", "QuotaCollector", "Usage", "exceeded", "grant_usage",
           "limits_of", "namespace_usage", "quota_keys", "request_usage"]
