"""The vocabulary of gpuslice: requests, slices, grants and devices, and the one unit parser.

Everything a human or a manifest writes (``4GiB``, ``4096Mi``, ``3000``, ``50%``, ``30``) goes through
:func:`parse_memory` and :func:`parse_compute`; inside the program memory is always bytes (``int``) and
compute is always a whole percent of one device's SM time (``int`` 0..100).

Memory units (one parser: the CLI, requests, the ledger and the slice file all call
:func:`parse_memory` / :func:`parse_bytes`; units are case-insensitive):

=================  ====================================================
written            means
=================  ====================================================
``3000``           3000 MiB — a bare number is MiB, as HAMi's ``gpumem``
                   (the caller may say otherwise: ``bare_unit=1`` makes it
                   bytes, as in the slice file)
``512B``           bytes
``4Ki`` ``4KiB``   binary: ×1024 (also Mi/MiB, Gi/GiB, Ti/TiB)
``4k`` ``4K``      binary as well (docker / HAMi env style: ``3000m``)
``4KB`` ``4GB``    decimal: ×1000, ×10⁹ (as disk vendors write them)
``1.5GiB``         a fraction is exact (1536 MiB); it is rounded to a whole byte
``50%``            a share of one device's memory, resolved at placement
                   (``12.5%`` too: above 0 and at most 100)
=================  ====================================================

``strict=True`` accepts only the slice file's grammar, which the enforcer's C parser
(``native/src/config.c``, ``gs_parse_bytes``) reads the same way: whole digits followed directly by
one of the units above, no spaces, no fraction, no percent.

Not parsed here: Kubernetes resource quantities (``gpuslice.kube.codec.parse_quantity``) follow the
Kubernetes quantity grammar, where ``k``/``M``/``G`` are decimal (×1000) and ``m`` means milli. That is
the API server's syntax, not a human unit of gpuslice, so it has its own parser on purpose.

Bad input raises :class:`SpecError`, which names the field, echoes the value and says what is allowed.
"""

from __future__ import annotations

import enum
import re
from decimal import Decimal, ROUND_HALF_UP
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

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

_COMPUTE_FORM = "a whole percent of one device's SM time from 0 to 100, like 30 or 30%"
_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?)"
_MEMORY_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>[A-Za-z]*|%)$")
_STRICT_MEMORY_RE = re.compile(r"^(?P<num>[0-9]+)(?P<unit>[A-Za-z]{0,3})$")  # the C parser's grammar
_COMPUTE_RE = re.compile(r"^(?P<num>[0-9]+)\s*%?$")


def _memory_form(bare_unit: int, allow_percent: bool, strict: bool) -> str:
    """The allowed forms, as an error message says them."""
    bare = "3000 (MiB)" if bare_unit == MiB else f"3000 (×{bare_unit} bytes)" if bare_unit != 1 else "4294967296 (bytes)"
    if strict:
        return f"a whole number directly followed by a unit, like {bare}, 4g, 4Gi, 4GiB or 4096Mi"
    return f"a size like 4GiB, 4096Mi, 512MB, {bare}" + (" or a share like 50%" if allow_percent else "")


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
        # Exact and parseable: repr() round-trips the float, 'f' avoids an exponent (1e-05 → 0.00001).
        return format(Decimal(repr(float(self.percent))).normalize(), "f") + "%"


def parse_memory(
    value: str | int,
    field_name: str = "memory",
    *,
    bare_unit: int = MiB,
    allow_percent: bool = True,
    allow_zero: bool = False,
    strict: bool = False,
    max_bytes: int | None = None,
) -> MemoryAmount:
    """Parse a human memory amount. ``int`` means bytes; strings follow the table in the module doc.

    ``bare_unit``: what a number without a unit means (MiB by default, as HAMi's ``gpumem``; 1 = bytes).
    ``allow_percent``: accept ``50%``. ``allow_zero``: accept a size of 0. ``strict``: only the slice
    file's grammar (whole digits directly followed by a unit). ``max_bytes``: the largest size allowed.
    """
    if bare_unit not in _MEMORY_UNITS.values():
        raise ValueError(f"bare_unit must be one of the unit scales, not {bare_unit!r}")
    smallest = 0 if allow_zero else 1
    form = _memory_form(bare_unit, allow_percent, strict)
    if isinstance(value, bool):
        raise SpecError(field_name, value, form)
    if isinstance(value, int):
        if value < smallest or (max_bytes is not None and value > max_bytes):
            raise SpecError(field_name, value, _size_range(smallest, max_bytes))
        return MemoryAmount(bytes=value)
    if not isinstance(value, str):
        raise SpecError(field_name, value, form)
    match = (_STRICT_MEMORY_RE if strict else _MEMORY_RE).fullmatch(value if strict else value.strip())
    if not match:
        raise SpecError(field_name, value, form)
    num, unit = Decimal(match["num"]), match["unit"]
    if unit == "%":
        if not allow_percent:
            raise SpecError(field_name, value, "an absolute size like 4GiB (a percent is not allowed here)")
        if not 0 < num <= 100:
            raise SpecError(field_name, value, "a share above 0% and at most 100%")
        return MemoryAmount(percent=float(num))
    scale = bare_unit if unit == "" else _MEMORY_UNITS.get(unit.lower())
    if scale is None:
        raise SpecError(field_name, value, form + f"; unit {unit!r} is unknown")
    size = int((num * scale).to_integral_value(ROUND_HALF_UP))
    if size < smallest or (max_bytes is not None and size > max_bytes):
        raise SpecError(field_name, value, _size_range(smallest, max_bytes))
    return MemoryAmount(bytes=size)


def _size_range(smallest: int, max_bytes: int | None) -> str:
    low = "a size above zero" if smallest else "a size of zero or more"
    return low if max_bytes is None else f"{low} and at most {max_bytes} bytes"


def parse_bytes(
    value: str | int,
    field_name: str = "memory",
    *,
    bare_unit: int = MiB,
    allow_zero: bool = False,
    strict: bool = False,
    max_bytes: int | None = None,
) -> int:
    """Parse an absolute size (no percent) into bytes; the options are :func:`parse_memory`'s."""
    amount = parse_memory(value, field_name, bare_unit=bare_unit, allow_percent=False, allow_zero=allow_zero,
                          strict=strict, max_bytes=max_bytes)
    assert amount.bytes is not None
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
def whole_number(field_name: str, value: object, low: int | None = None, high: int | None = None, *,
                 allowed: str = "", error: Callable[[str, object, str], Exception] = SpecError) -> int:
    """``value`` if it is an int (never a bool: JSON's true is not 1) within [low, high]; otherwise
    ``error(field_name, value, allowed)``, where ``allowed`` defaults to the bounds in words."""
    if isinstance(value, bool) or not isinstance(value, int) \
            or (low is not None and value < low) or (high is not None and value > high):
        if not allowed:
            allowed = "a whole number" + ("" if low is None else f" at least {low}") \
                + ("" if high is None else f" and at most {high}")
        raise error(field_name, value, allowed)
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
        whole_number("count", self.count, 1, 64)
        whole_number("compute", self.compute, 0, 100)
        whole_number("weight", self.weight, 1, 16)
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
        whole_number("memory_limit", self.memory_limit, 1)
        whole_number("compute", self.compute, 0, 100)
        whole_number("weight", self.weight, 1, 16)


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
    """One MIG GPU instance as NVML reports it: ``profile`` is the short profile name (``3g.40gb``)."""

    uuid: str
    profile: str
    memory_total: int
    sm_count: int

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, str) or not self.uuid.strip():
            raise SpecError("mig_instances.uuid", self.uuid, "a MIG device UUID like MIG-…")
        if not isinstance(self.profile, str) or not self.profile.strip():
            raise SpecError("mig_instances.profile", self.profile, "a MIG profile name like 3g.40gb")
        whole_number("mig_instances.memory_total", self.memory_total, 1)
        whole_number("mig_instances.sm_count", self.sm_count, 0)


# NVML's compute modes by the names the snapshot writes them; Unknown when NVML does not say.
COMPUTE_MODES = ("Default", "ExclusiveThread", "Prohibited", "ExclusiveProcess", "Unknown")


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
        if not isinstance(self.uuid, str) or not self.uuid.strip():
            raise SpecError("uuid", self.uuid, "a device UUID like GPU-…")
        whole_number("index", self.index, 0)
        whole_number("memory_total", self.memory_total, 1)
        whole_number("sm_count", self.sm_count, 0)
        for name in ("name", "model", "pci_bus_id"):  # may be empty (unknown), never another type
            if not isinstance(getattr(self, name), str):
                raise SpecError(name, getattr(self, name), "a string")
        if self.numa_node is not None:
            whole_number("numa_node", self.numa_node, 0)
        peers = self.nvlink_peers
        if not isinstance(peers, tuple) or not all(isinstance(p, str) and p.strip() for p in peers):
            raise SpecError("nvlink_peers", peers, "a list of device UUIDs")
        if not isinstance(self.mig_enabled, bool):
            raise SpecError("mig_enabled", self.mig_enabled, "true or false")
        if self.compute_mode not in COMPUTE_MODES:
            raise SpecError("compute_mode", self.compute_mode, "one of " + ", ".join(COMPUTE_MODES))
        self._check_mig()

    def _check_mig(self) -> None:
        """MIG instances belong to a MIG-enabled card, are distinct, and fit in it."""
        migs = self.mig_instances
        if not migs:
            return
        if not self.mig_enabled:
            raise SpecError("mig_instances", [m.uuid for m in migs], "none on a device whose mig_enabled is false")
        if not all(isinstance(m, MigInstance) for m in migs):
            raise SpecError("mig_instances", migs, "MigInstance objects")
        uuids = [m.uuid for m in migs]
        if len(set(uuids)) != len(uuids) or self.uuid in uuids:
            raise SpecError("mig_instances", uuids, "UUIDs distinct from each other and from the card's")
        memory = sum(m.memory_total for m in migs)
        if memory > self.memory_total:
            raise SpecError("mig_instances", f"{memory} bytes in all",
                            f"instances whose memory fits in the card's memory_total ({self.memory_total} bytes)")
        sms = sum(m.sm_count for m in migs)
        if self.sm_count and sms > self.sm_count:
            raise SpecError("mig_instances", f"{sms} SMs in all", f"at most the card's sm_count ({self.sm_count})")
