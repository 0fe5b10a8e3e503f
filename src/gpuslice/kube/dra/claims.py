"""A ResourceClaim's allocation, read for one node, and the grant it amounts to.

kube-scheduler's DRA allocator writes ``status.allocation`` of a claim: per allocated device its request name,
driver, pool, device name, a ``shareID`` (devices with ``allowMultipleAllocations``) and ``consumedCapacity``
(what this allocation took of each capacity, after the request policy rounded it). :func:`read_allocation` keeps
the results of our driver in this node's pool, checked field by field; :func:`claim_grant` turns them into the
:class:`~gpuslice.spec.Grant` the slice file is written from:

* one slice per device: memory limit = consumed ``memory`` (a device whose whole memory capacity was consumed is
  held whole and gets ``max(capacity, physical memory)``, as in placement), compute = consumed ``compute``;
* a device allocated twice to the same claim (``count: 2`` without ``distinctAttribute: gpuslice.io/uuid``) is
  one slice of the sum — what the claim holds of it;
* priority, compute mode and weight come from the claim's (or its DeviceClass's) opaque configuration for
  ``gpuslice.io`` (later entries win, as the API orders them: class first, then claim)::

      config:
      - opaque:
          driver: gpuslice.io
          parameters: {apiVersion: gpuslice.io/v1, kind: SliceParameters, priority: high, mode: soft, weight: 2}

* the slice file has one compute share for all devices of a grant, so a claim whose devices got different compute
  shares is refused (use one claim per share).

Grant ids are ``dra-<claim uid>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from gpuslice.kube.dra.resourceslice import COMPUTE, DRIVER, MEMORY, Sharing, SliceDevice, memory_capacity
from gpuslice.kube.resources import HighPriorityNamespaces, parse_quantity
from gpuslice.spec import (Colocation, ComputeMode, Grant, Priority, Slice, SpecError, parse_tidal_schedule,
                           whole_number)

PARAMETERS_API = "gpuslice.io/v1"
PARAMETERS_KIND = "SliceParameters"
_PARAMETER_KEYS = ("apiVersion", "kind", "priority", "mode", "weight", "colocation", "tidalSchedule")


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of ``status.allocation.devices.results`` for our driver."""

    request: str
    pool: str
    device: str
    share_id: str = ""
    consumed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Parameters:
    """The opaque ``SliceParameters`` of a claim; ``mode`` None = the node's default."""

    priority: Priority = Priority.LOW
    mode: ComputeMode | None = None
    weight: int = 1
    colocation: Colocation = Colocation.PREEMPTIVE  # issue 13; tidal: low priority, mode hard
    tidal_schedule: str = ""


@dataclass(frozen=True)
class ClaimAllocation:
    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]
    parameters: Parameters = Parameters()
    pods: tuple[str, ...] = ()  # status.reservedFor: the pods using the claim

    @property
    def grant_id(self) -> str:
        return grant_id(self.uid)


def grant_id(claim_uid: str) -> str:
    return f"dra-{claim_uid}"


def _obj(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(where, value, "an object")
    return value


def _list(where: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(where, value, "a list")
    return value


def _text(where: str, value: Any, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise SpecError(where, value, "a non-empty string" if required else "a string")
    return value


def _consumed(where: str, raw: Any) -> dict[str, int]:
    out = {}
    for key, value in _obj(where, raw or {}).items():
        q = parse_quantity(f"{where}.{key}", value)
        if q != q.to_integral_value() or q < 0:
            raise SpecError(f"{where}.{key}", value, "a whole, non-negative quantity")
        out[str(key)] = int(q)
    return out


def parameters(where: str, raw: Any) -> Parameters:
    """``SliceParameters`` from an opaque configuration's ``parameters``; unknown keys are refused."""
    data = _obj(where, raw)
    unknown = sorted(set(data) - set(_PARAMETER_KEYS))
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", data[unknown[0]], "one of " + ", ".join(_PARAMETER_KEYS))
    if data.get("apiVersion", PARAMETERS_API) != PARAMETERS_API or data.get("kind", PARAMETERS_KIND) != PARAMETERS_KIND:
        raise SpecError(f"{where}.kind", f"{data.get('apiVersion')}/{data.get('kind')}",
                        f"{PARAMETERS_API}/{PARAMETERS_KIND}")
    return Parameters(
        priority=Priority.parse(data["priority"], f"{where}.priority") if "priority" in data else Priority.LOW,
        mode=ComputeMode.parse(data["mode"], f"{where}.mode") if "mode" in data else None,
        weight=whole_number(f"{where}.weight", data.get("weight", 1), 1, 16),
        colocation=Colocation.parse(data.get("colocation", "preemptive"), f"{where}.colocation"),
        tidal_schedule=parse_tidal_schedule(data.get("tidalSchedule", ""), f"{where}.tidalSchedule"))


def read_allocation(claim: Mapping[str, Any], pool: str, driver: str = DRIVER) -> ClaimAllocation:
    """The claim's devices of ``driver`` in ``pool`` (this node); refuses an unallocated claim and any field of
    the wrong shape, naming it (``status.allocation.devices.results[1].consumedCapacity.memory``)."""
    meta = _obj("metadata", claim.get("metadata"))
    ref = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        raise SpecError(f"{ref}: status.allocation", None, "an allocated claim (kube-scheduler allocates it "
                        "when it schedules the pod)")
    where = f"{ref}: status.allocation.devices"
    devs = _obj(where, _obj("status.allocation", alloc).get("devices") or {})
    found = []
    for i, r in enumerate(_list(f"{where}.results", devs.get("results"))):
        at = f"{where}.results[{i}]"
        r = _obj(at, r)
        if r.get("driver") != driver or r.get("pool") != pool:
            continue
        found.append(AllocatedDevice(request=_text(f"{at}.request", r.get("request")), pool=pool,
                                     device=_text(f"{at}.device", r.get("device")),
                                     share_id=_text(f"{at}.shareID", r.get("shareID"), required=False),
                                     consumed=_consumed(f"{at}.consumedCapacity", r.get("consumedCapacity"))))
    if not found:
        raise SpecError(f"{where}.results", [], f"at least one device of driver {driver} in pool {pool} "
                        "(the claim was allocated for another node or driver)")
    requests = {d.request for d in found}
    params = Parameters()
    for i, c in enumerate(_list(f"{where}.config", devs.get("config"))):
        at = f"{where}.config[{i}]"
        c = _obj(at, c)
        opaque = c.get("opaque")
        if not opaque or _obj(f"{at}.opaque", opaque).get("driver") != driver:
            continue
        applies = _list(f"{at}.requests", c.get("requests"))
        if applies and not requests & {str(a).split("/")[0] for a in applies}:
            continue
        params = parameters(f"{at}.opaque.parameters", opaque.get("parameters"))
    pods = tuple(str(r.get("name", "")) for r in _list(f"{ref}: status.reservedFor", claim["status"].get("reservedFor"))
                 if isinstance(r, dict) and r.get("resource") == "pods")
    return ClaimAllocation(uid=_text(f"{ref}: metadata.uid", meta.get("uid")),
                           namespace=_text(f"{ref}: metadata.namespace", meta.get("namespace")),
                           name=_text(f"{ref}: metadata.name", meta.get("name")), devices=tuple(found),
                           parameters=params, pods=pods)


def claim_grant(alloc: ClaimAllocation, devices: Mapping[str, SliceDevice], sharing: Sharing,
                default_mode: ComputeMode = ComputeMode.HARD,
                high_priority: HighPriorityNamespaces = HighPriorityNamespaces()) -> Grant:
    """The grant of an allocated claim on this node (``devices``: the node's devices by DRA name). A claim
    asking for high priority in a namespace ``high_priority`` leaves out is refused (:class:`PriorityRefused`)."""
    if alloc.parameters.priority is Priority.HIGH:
        high_priority.check(alloc.namespace, f"ResourceClaim {alloc.namespace}/{alloc.name}: SliceParameters.priority",
                            "high")
    memory: dict[str, int] = {}
    compute: dict[str, int] = {}
    order: list[SliceDevice] = []
    for d in alloc.devices:
        dev = devices.get(d.device)
        if dev is None:
            raise SpecError(f"ResourceClaim {alloc.namespace}/{alloc.name}: device", d.device,
                            f"a device this node publishes ({', '.join(sorted(devices)) or 'none'})")
        if dev.uuid not in memory:
            order.append(dev)
            memory[dev.uuid] = compute[dev.uuid] = 0
        memory[dev.uuid] += d.consumed.get(MEMORY, memory_capacity(dev, sharing))
        compute[dev.uuid] += d.consumed.get(COMPUTE, 0)
    shares = {compute[dev.uuid] for dev in order}
    if len(shares) > 1:
        raise SpecError(f"ResourceClaim {alloc.namespace}/{alloc.name}: compute", sorted(shares),
                        "one compute share for every device of a claim (a slice file holds one); use a claim per share")
    mode = alloc.parameters.mode or default_mode
    slices, whole = [], []
    for dev in order:
        cap = memory_capacity(dev, sharing)
        held_whole = memory[dev.uuid] >= cap
        whole.append(held_whole)
        limit = max(cap, dev.memory_total) if held_whole else memory[dev.uuid]
        p = alloc.parameters
        try:
            slices.append(Slice(device_uuid=dev.uuid, memory_limit=limit, compute=min(compute[dev.uuid], 100),
                                priority=p.priority, mode=mode, weight=p.weight, colocation=p.colocation,
                                tidal_schedule=p.tidal_schedule))
        except SpecError as exc:  # the co-location rules: named as the claim's parameters
            key = {"tidal_schedule": "tidalSchedule"}.get(exc.field, exc.field)
            raise SpecError(f"ResourceClaim {alloc.namespace}/{alloc.name}: SliceParameters.{key}", exc.value,
                            exc.allowed) from None
    return Grant(grant_id=alloc.grant_id, slices=tuple(slices), exclusive=all(whole))


def containers_with_claim(pod: Mapping[str, Any], claim_name: str) -> set[str]:
    """The names of ``pod``'s containers (init containers included) that get the ResourceClaim ``claim_name``:
    ``resources.claims[].name`` names an entry of ``spec.resourceClaims`` that is the claim itself
    (``resourceClaimName``) or a template the claim was made from (``status.resourceClaimStatuses``)."""
    spec = pod.get("spec") or {}
    entries = {e.get("name") for e in spec.get("resourceClaims") or [] if isinstance(e, dict)
               and e.get("resourceClaimName") == claim_name}
    entries |= {s.get("name") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                if isinstance(s, dict) and s.get("resourceClaimName") == claim_name}
    entries.discard(None)
    found = set()
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            claims = ((c.get("resources") or {}).get("claims") or []) if isinstance(c, dict) else []
            if any(isinstance(r, dict) and r.get("name") in entries for r in claims):
                found.add(str(c.get("name")))
    return found
