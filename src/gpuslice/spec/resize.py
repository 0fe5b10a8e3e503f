"""A live resize: the new size of a granted slice (``gpuslice resize``, the agent's ``POST
/v1/grants/{id}/resize``, the ``gpuslice.io/resize`` pod annotation). Only sizes change: a grant keeps its
devices, engine and processes; placement decides whether the new sizes fit (:func:`gpuslice.placement.resize`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from gpuslice.spec.errors import SpecError
from gpuslice.spec.model import ComputeMode, Priority, Slice, _parse_bool
from gpuslice.spec.units import MAX_MEMORY_BYTES, MemoryAmount, parse_compute, parse_memory

FIELDS = ("memory", "compute", "priority", "mode", "evict")


@dataclass(frozen=True)
class Resize:
    """What changes (None = unchanged). ``memory`` resolves per device (``50%`` of each device). ``evict``:
    a memory size below what the slice's processes hold now is applied anyway and those processes are ended
    (without it such a resize is refused, saying how much is in use)."""

    memory: MemoryAmount | None = None
    compute: int | None = None
    priority: Priority | None = None
    mode: ComputeMode | None = None
    evict: bool = False

    def __post_init__(self) -> None:
        if self.memory is None and self.compute is None and self.priority is None and self.mode is None:
            raise SpecError("resize", {}, "at least one of memory, compute, priority, mode")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Resize":
        """From loosely typed input (CLI, JSON, an annotation): every field parsed and checked."""
        if not isinstance(data, Mapping):
            raise SpecError("resize", data, "an object with memory, compute, priority, mode, evict")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], "one of the fields " + ", ".join(FIELDS))
        return cls(memory=_memory(data["memory"]) if data.get("memory") is not None else None,
                   compute=parse_compute(data["compute"]) if data.get("compute") is not None else None,
                   priority=Priority.parse(data["priority"]) if data.get("priority") is not None else None,
                   mode=ComputeMode.parse(data["mode"]) if data.get("mode") is not None else None,
                   evict=_parse_bool(data.get("evict", False), "evict"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.memory is not None:
            out["memory"] = str(self.memory)
        if self.compute is not None:
            out["compute"] = self.compute
        if self.priority is not None:
            out["priority"] = self.priority.name.lower()
        if self.mode is not None:
            out["mode"] = self.mode.value
        if self.evict:
            out["evict"] = True
        return out

    def applied(self, s: Slice, device_total: int) -> Slice:
        """Slice ``s`` after the resize, on a device of ``device_total`` bytes."""
        memory = s.memory_limit if self.memory is None else self.memory.resolve(device_total)
        if memory < 1:
            raise SpecError("memory", str(self.memory), f"at least 1 byte on {s.device_uuid}")
        return replace(s, memory_limit=memory, compute=s.compute if self.compute is None else self.compute,
                       priority=s.priority if self.priority is None else self.priority,
                       mode=s.mode if self.mode is None else self.mode)


def _memory(value: Any) -> MemoryAmount:
    """A resize's memory as a request's (``Request.from_json``): a bare number, JSON's too, is MiB, and no size
    past MAX_MEMORY_BYTES (issue 15: the socket API's bare number means what the README says everywhere)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return parse_memory(text, max_bytes=MAX_MEMORY_BYTES)
