"""The vocabulary of gpuslice: requests, slices, grants and devices, and the one unit parser.

Everything a human or a manifest writes (``4GiB``, ``4096Mi``, ``3000``, ``50%``, ``30``) goes through
:func:`parse_memory` and :func:`parse_compute`; inside the program memory is always bytes (``int``) and
compute is always a whole percent of one device's SM time (``int`` 0..100).

Memory units (one parser, used by the CLI, the slice file writer, the Kubernetes codec):

=================  ====================================================
written            means
=================  ====================================================
``3000``           3000 MiB — a bare number is MiB, as HAMi's ``gpumem``
``512B``           bytes
``4Ki`` ``4KiB``   binary: ×1024 (also Mi/MiB, Gi/GiB, Ti/TiB)
``4k`` ``4K``      binary as well (docker / HAMi env style: ``3000m``)
``4KB`` ``4GB``    decimal: ×1000, ×10⁹ (as disk vendors write them)
``50%``            a share of one device's memory, resolved at placement
=================  ====================================================

Bad input raises :class:`SpecError`, which names the field, echoes the value and says what is allowed.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_MEMORY_UNITS: dict[str, int] = {
    "b": 1,
    "ki": KiB, "kib": KiB, "k": KiB,
    "mi": MiB, "mib": MiB, "m": MiB,
    "gi": GiB, "gib": GiB, "g": GiB,
    "ti": TiB, "tib": TiB, "t": TiB,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_MEMORY_FORM = "a size like 4GiB, 4096Mi, 512MB, 3000 (MiB) or a share like 50%"
_COMPUTE_FORM = "a whole percent of one device's SM time from 0 to 100, like 30 or 30%"
_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?)"
_MEMORY_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>[A-Za-z]*|%)$")
_COMPUTE_RE = re.compile(r"^(?P<num>[0-9]+)\s*%?$")


class SpecError(ValueError):
    """A request, slice or grant field that is not allowed. Carries the field, the value and the rule."""

    def __init__(self, field_name: str, value: object, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name}: {value!r} is not allowed; expected {allowed}")


# --------------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class MemoryAmount:
    """Memory as written by a user: an absolute size in bytes, or a percent of one device."""

    bytes: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.percent is None):
            raise SpecError("memory", self, "exactly one of bytes or percent")

    def resolve(self, device_total: int) -> int:
        """Bytes this amount means on a device with ``device_total`` bytes (percent rounds down)."""
        if self.bytes is not None:
            return self.bytes
        assert self.percent is not None
        return int(device_total * self.percent // 100)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{self.percent:g}%"


def parse_memory(value: str | int, field_name: str = "memory") -> MemoryAmount:
    """Parse a human memory amount. ``int`` means bytes; strings follow the table in the module doc."""
    if isinstance(value, bool):
        raise SpecError(field_name, value, _MEMORY_FORM)
    if isinstance(value, int):
        if value <= 0:
            raise SpecError(field_name, value, "a positive number of bytes")
        return MemoryAmount(bytes=value)
    if not isinstance(value, str):
        raise SpecError(field_name, value, _MEMORY_FORM)
    match = _MEMORY_RE.match(value.strip())
    if not match:
        raise SpecError(field_name, value, _MEMORY_FORM)
    num, unit = float(match["num"]), match["unit"]
    if unit == "%":
        if not 0 < num <= 100:
            raise SpecError(field_name, value, "a share above 0% and at most 100%")
        return MemoryAmount(percent=num)
    scale = MiB if unit == "" else _MEMORY_UNITS.get(unit.lower())
    if scale is None:
        raise SpecError(field_name, value, _MEMORY_FORM + f"; unit {unit!r} is unknown")
    size = int(round(num * scale))
    if size <= 0:
        raise SpecError(field_name, value, "a size above zero")
    return MemoryAmount(bytes=size)


def parse_bytes(value: str | int, field_name: str = "memory") -> int:
    """Parse an absolute size (no percent) into bytes."""
    amount = parse_memory(value, field_name)
    if amount.bytes is None:
        raise SpecError(field_name, value, "an absolute size like 4GiB (a percent is not allowed here)")
    return amount.bytes


def parse_compute(value: str | int, field_name: str = "compute") -> int:
    """Parse a compute share: ``30`` or ``30%`` → 30. 0 means no reserved share (best effort)."""
    if isinstance(value, bool):
        raise SpecError(field_name, value, _COMPUTE_FORM)
    text = str(value).strip() if isinstance(value, (int, str)) else None
    match = _COMPUTE_RE.match(text) if text is not None else None
    if not match:
        raise SpecError(field_name, value, _COMPUTE_FORM)
    share = int(match["num"])
    if share > 100:
        raise SpecError(field_name, value, _COMPUTE_FORM)
    return share


def format_bytes(size: int) -> str:
    """The shortest exact binary form: 4294967296 → '4GiB', 1536 MiB → '1536MiB', 1000 → '1000B'."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def human_bytes(size: int) -> str:
    """Rounded form for tables: 1.5 GiB, 300 MiB."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


# --------------------------------------------------------------------------------------------- enums
class Priority(enum.IntEnum):
    """HAMi's numbering: 0 is high (latency-critical), 1 is low (batch / preemptible)."""

    HIGH = 0
    LOW = 1

    @classmethod
    def parse(cls, value: str | int, field_name: str = "priority") -> "Priority":
        text = str(value).strip().lower()
        table = {"0": cls.HIGH, "high": cls.HIGH, "1": cls.LOW, "low": cls.LOW}
        if isinstance(value, bool) or text not in table:
            raise SpecError(field_name, value, "high or low (HAMi numbering: 0 = high, 1 = low)")
        return table[text]


class ComputeMode(str, enum.Enum):
    """How the compute share is held: hard = never above, soft = may borrow idle time, off = unpaced."""

    HARD = "hard"
    SOFT = "soft"
    OFF = "off"

    @classmethod
    def parse(cls, value: str, field_name: str = "mode") -> "ComputeMode":
        # HAMi's GPU_CORE_UTILIZATION_POLICY names map onto ours.
        aliases = {"force": "hard", "default": "soft", "disable": "off"}
        text = aliases.get(str(value).strip().lower(), str(value).strip().lower())
        try:
            return cls(text)
        except ValueError:
            raise SpecError(field_name, value, "hard, soft or off (HAMi: force, default, disable)") from None


# --------------------------------------------------------------------------------------------- objects
def _check_int(field_name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        upper = "" if high is None else f" and at most {high}"
        raise SpecError(field_name, value, f"a whole number at least {low}{upper}")
    return value


@dataclass(frozen=True)
class Request:
    """What a workload asks for. ``memory=None`` means the whole memory of each device.

    ``compute`` is the reserved share of each device (0 = none reserved, not paced: HAMi's default).
    ``exclusive`` asks for whole devices (nobody else may share them). ``models`` restricts device
    models (e.g. ``("V100M16", "V100M32")``); empty means any.
    """

    count: int = 1
    memory: MemoryAmount | None = None
    compute: int = 0
    priority: Priority = Priority.LOW
    mode: ComputeMode = ComputeMode.HARD
    weight: int = 1
    exclusive: bool = False
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_int("count", self.count, 1, 64)
        _check_int("compute", self.compute, 0, 100)
        _check_int("weight", self.weight, 1, 16)
        if self.memory is not None and not isinstance(self.memory, MemoryAmount):
            raise SpecError("memory", self.memory, "a MemoryAmount (use parse_memory)")
        if not isinstance(self.priority, Priority):
            raise SpecError("priority", self.priority, "a Priority")
        if not isinstance(self.mode, ComputeMode):
            raise SpecError("mode", self.mode, "a ComputeMode")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Request":
        """Build from loosely typed input (CLI, JSON, annotations): every field parsed and checked."""
        known = {"count", "memory", "compute", "priority", "mode", "weight", "exclusive", "models"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], "one of the fields " + ", ".join(sorted(known)))
        kwargs: dict[str, Any] = {}
        if "count" in data:
            kwargs["count"] = _parse_count(data["count"])
        if data.get("memory") is not None:
            kwargs["memory"] = parse_memory(data["memory"])
        if "compute" in data:
            kwargs["compute"] = parse_compute(data["compute"])
        if "priority" in data:
            kwargs["priority"] = Priority.parse(data["priority"])
        if "mode" in data:
            kwargs["mode"] = ComputeMode.parse(data["mode"])
        if "weight" in data:
            kwargs["weight"] = _parse_count(data["weight"], "weight", 16)
        if "exclusive" in data:
            kwargs["exclusive"] = _parse_bool(data["exclusive"], "exclusive")
        if "models" in data:
            kwargs["models"] = parse_models(data["models"])
        return cls(**kwargs)


def _parse_count(value: object, field_name: str = "count", high: int = 64) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not 1 <= number <= high:
        raise SpecError(field_name, value, f"a whole number from 1 to {high}")
    return number


def _parse_bool(value: object, field_name: str) -> bool:
    table = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    key = str(value).strip().lower()
    if key not in table:
        raise SpecError(field_name, value, "true or false")
    return table[key]


def parse_models(value: object, field_name: str = "models") -> tuple[str, ...]:
    """``"V100M16|V100M32"`` (the trace's form), a comma list, or a sequence → ('V100M16', 'V100M32')."""
    if isinstance(value, str):
        parts = [p.strip() for p in re.split(r"[|,]", value)]
    elif isinstance(value, (list, tuple)):
        parts = [str(p).strip() for p in value]
    else:
        raise SpecError(field_name, value, "model names separated by | or ,")
    if any(not p for p in parts) and value not in ("", [], ()):
        raise SpecError(field_name, value, "model names separated by | or , with none empty")
    return tuple(p for p in parts if p)


@dataclass(frozen=True)
class Slice:
    """A granted share of one device."""

    device_uuid: str
    memory_limit: int
    compute: int = 0
    priority: Priority = Priority.LOW
    mode: ComputeMode = ComputeMode.HARD
    weight: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.device_uuid, str) or not self.device_uuid.strip():
            raise SpecError("device_uuid", self.device_uuid, "a device UUID like GPU-…")
        _check_int("memory_limit", self.memory_limit, 1)
        _check_int("compute", self.compute, 0, 100)
        _check_int("weight", self.weight, 1, 16)


@dataclass(frozen=True)
class Grant:
    """The slices given to one container or process group, under one id."""

    grant_id: str
    slices: tuple[Slice, ...]
    owner: str = ""

    def __post_init__(self) -> None:
        if not self.grant_id or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", self.grant_id):
            raise SpecError("grant_id", self.grant_id, "1-128 letters, digits, '.', '_' or '-'")
        if not self.slices:
            raise SpecError("slices", self.slices, "at least one slice")
        uuids = [s.device_uuid for s in self.slices]
        if len(set(uuids)) != len(uuids):
            raise SpecError("slices", uuids, "at most one slice per device")


@dataclass(frozen=True)
class MigInstance:
    """One MIG GPU instance as NVML reports it."""

    uuid: str
    profile: str
    memory_total: int
    sm_count: int


@dataclass(frozen=True)
class Device:
    """One physical GPU (or MIG-enabled card with its instances) as discovered through NVML."""

    uuid: str
    index: int
    name: str
    memory_total: int
    sm_count: int
    model: str = ""
    numa_node: int | None = None
    nvlink_peers: tuple[str, ...] = ()
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    compute_mode: str = "Default"
    pci_bus_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.uuid:
            raise SpecError("uuid", self.uuid, "a device UUID")
        _check_int("index", self.index, 0)
        _check_int("memory_total", self.memory_total, 1)
        _check_int("sm_count", self.sm_count, 0)
