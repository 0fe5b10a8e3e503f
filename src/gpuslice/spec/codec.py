"""The one JSON spelling of a request, a slice and a grant, on every wire: the local ledger, the agent's
socket API, Kubernetes annotations (``gpuslice.io/grant``, ``gpuslice.io/ledger``).

====================  ===================================================================================
``Slice``             ``{"uuid": "GPU-…", "memory": <bytes>, "compute": 0..100, "priority": 0|1,
                      "mode": "hard"|"soft"|"off", "weight": 1..16, "engine": "spatial"}`` (compute,
                      priority, mode, weight and engine may be left out: 0, 1 = low, hard, 1, timeslice;
                      ``engine`` is written only when it is not ``timeslice``, so documents of slices
                      without it read and write as before), ``"colocation": "shared"|"tidal"`` and
                      ``"tidal_schedule": "0-8:100,…"`` likewise only when not ``preemptive`` / empty
``Grant``             ``{"grant": "<id>", "exclusive": bool, "slices": [Slice, …]}`` — a record that
                      contains a grant (a ledger row, a pod's container) adds its own keys beside these
``Request``           ``{"count": 1..64, "memory": "4GiB"|"50%"|null, "compute": 0..100, "priority": 0|1,
                      "mode": …, "weight": 1..16, "exclusive": bool, "models": ["…"],
                      "engine": "timeslice"|"spatial"}`` (null or missing: the default; ``engine`` is
                      written only when not ``timeslice``; ``colocation``, ``tidal_schedule`` as in Slice)
====================  ===================================================================================

Decoders check every field and raise :class:`SpecError` whose field is the path of the bad value in the
document (``where`` is the path of the object itself, e.g. ``gpuslice.io/ledger.entries[u1].containers[0]``),
so a refusal names exactly what to fix. ``x_from_json(x_to_json(v)) == v`` for every valid ``v``.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpuslice.spec.errors import SpecError
from gpuslice.spec.colocation import Colocation, parse_tidal_schedule
from gpuslice.spec.model import GRANT_ID, ComputeMode, Engine, Grant, Priority, Request, Slice, whole_number

SLICE_KEYS = ("uuid", "memory", "compute", "priority", "mode", "weight", "engine", "colocation", "tidal_schedule")
GRANT_KEYS = ("grant", "exclusive", "slices")
REQUEST_KEYS = ("count", "memory", "compute", "priority", "mode", "weight", "exclusive", "models", "engine",
                "colocation", "tidal_schedule")


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object(where: str, data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(where or "body", data, f"an object with {what}")
    return data


def _prefixed(where: str, exc: SpecError) -> SpecError:
    """``exc`` with its field placed under ``where`` (once)."""
    if not where or exc.field.startswith(where):
        return exc
    return SpecError(_at(where, exc.field), exc.value, exc.allowed)


# ------------------------------------------------------------------------------------------- slice
def _engine_json(engine: Engine) -> dict[str, str]:
    """``{"engine": …}`` for a spatial slice or request; nothing for the default (older documents stay
    byte for byte what they were)."""
    return {} if engine is Engine.TIMESLICE else {"engine": engine.value}


def _coloc_json(item: Request | Slice) -> dict[str, str]:
    """``colocation`` / ``tidal_schedule`` where they are not the defaults (older documents unchanged)."""
    out = {} if item.colocation is Colocation.PREEMPTIVE else {"colocation": item.colocation.value}
    return {**out, "tidal_schedule": item.tidal_schedule} if item.tidal_schedule else out


def slice_to_json(item: Slice) -> dict[str, Any]:
    return {"uuid": item.device_uuid, "memory": item.memory_limit, "compute": item.compute,
            "priority": int(item.priority), "mode": item.mode.value, "weight": item.weight,
            **_engine_json(item.engine), **_coloc_json(item)}


def slice_from_json(data: Any, where: str = "") -> Slice:
    data = _object(where, data, ", ".join(SLICE_KEYS))
    uuid = data.get("uuid")
    if not isinstance(uuid, str) or not uuid.strip():
        raise SpecError(_at(where, "uuid"), uuid, "a device UUID like GPU-…")
    try:
        return Slice(device_uuid=uuid,
                     memory_limit=whole_number(_at(where, "memory"), data.get("memory"), 1),
                     compute=whole_number(_at(where, "compute"), data.get("compute", 0), 0, 100),
                     priority=Priority.parse(data.get("priority", 1), _at(where, "priority")),
                     mode=ComputeMode.parse(data.get("mode", "hard"), _at(where, "mode")),
                     weight=whole_number(_at(where, "weight"), data.get("weight", 1), 1, 16),
                     engine=Engine.parse(data.get("engine", "timeslice"), _at(where, "engine")),
                     colocation=Colocation.parse(data.get("colocation", "preemptive"), _at(where, "colocation")),
                     tidal_schedule=parse_tidal_schedule(data.get("tidal_schedule", ""), _at(where, "tidal_schedule")))
    except SpecError as exc:
        raise _prefixed(where, exc) from None


# ------------------------------------------------------------------------------------------- grant
def grant_to_json(grant: Grant) -> dict[str, Any]:
    return {"grant": grant.grant_id, "exclusive": grant.exclusive,
            "slices": [slice_to_json(s) for s in grant.slices]}


def grant_from_json(data: Any, where: str = "") -> Grant:
    """A grant from an object holding at least :data:`GRANT_KEYS` (other keys are the container's)."""
    data = _object(where, data, ", ".join(GRANT_KEYS))
    gid = data.get("grant")
    if not isinstance(gid, str) or not GRANT_ID.fullmatch(gid):
        raise SpecError(_at(where, "grant"), gid, "1-128 letters, digits, '.', '_' or '-'")
    exclusive = data.get("exclusive", False)
    if not isinstance(exclusive, bool):
        raise SpecError(_at(where, "exclusive"), exclusive, "true or false")
    slices = data.get("slices")
    if not isinstance(slices, list) or not slices:
        raise SpecError(_at(where, "slices"), slices, "a non-empty list of slices")
    items = tuple(slice_from_json(s, f"{_at(where, 'slices')}[{k}]") for k, s in enumerate(slices))
    try:
        return Grant(grant_id=gid, slices=items, exclusive=exclusive)
    except SpecError as exc:
        raise _prefixed(where, exc) from None


# ------------------------------------------------------------------------------------------- request
def request_to_json(request: Request) -> dict[str, Any]:
    return {"count": request.count, "memory": None if request.memory is None else str(request.memory),
            "compute": request.compute, "priority": int(request.priority), "mode": request.mode.value,
            "weight": request.weight, "exclusive": request.exclusive, "models": list(request.models),
            **_engine_json(request.engine), **_coloc_json(request)}


def request_from_json(data: Any, where: str = "") -> Request:
    """A request from an object of :data:`REQUEST_KEYS`; a null value means the default."""
    data = _object(where or "request", data, "count, memory, compute, priority, mode, …")
    try:
        return Request.from_mapping({k: v for k, v in data.items() if v is not None})
    except SpecError as exc:
        raise _prefixed(where, exc) from None
