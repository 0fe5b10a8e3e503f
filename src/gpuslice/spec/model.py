"""The objects of gpuslice's vocabulary: priorities, compute modes, requests, slices, grants, devices.

Each checks its fields when built and raises :class:`SpecError` naming the field; their one JSON
spelling is :mod:`gpuslice.spec.codec`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from gpuslice.spec.colocation import Colocation, check_colocation, parse_tidal_schedule
from gpuslice.spec.errors import SpecError
from gpuslice.spec.units import MAX_MEMORY_BYTES, MemoryAmount, parse_compute, parse_memory


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


class Engine(str, enum.Enum):
    """How a device's compute is shared between its slices.

    ``timeslice`` (the default on every wire; locally ``gpuslice run``'s ``--engine auto`` may choose either,
    gpuslice.local.records.auto_request): the enforcer paces launches so slices take turns on the whole device
    (exact shares, strong isolation). ``spatial``: the slices' kernels run at once on fractions of the
    SMs through an NVIDIA MPS control daemon the node side runs per device; the compute share becomes
    the client's active-thread percentage (throughput for many small jobs, weaker fault isolation). A
    device runs one engine at a time.
    """

    TIMESLICE = "timeslice"
    SPATIAL = "spatial"

    @classmethod
    def parse(cls, value: object, field_name: str = "engine") -> "Engine":
        if isinstance(value, Engine):
            return value
        aliases = {"time-slice": "timeslice", "time": "timeslice", "mps": "spatial"}
        text = str(value).strip().lower()
        try:
            return cls(aliases.get(text, text))
        except ValueError:
            raise SpecError(field_name, value, "timeslice or spatial (MPS-backed)") from None


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
    models (e.g. ``("V100M16", "V100M32")``); empty means any. ``engine`` is how the device's compute is
    shared (:class:`Engine`); a spatial request covers one device (its processes are clients of that
    device's MPS daemon). ``colocation`` is how it shares a device with the other priority
    (:mod:`gpuslice.spec.colocation`); ``tidal_schedule`` the canonical schedule of a tidal one ("" = follow
    the high-priority slices' idle time).
    """

    count: int = 1
    memory: MemoryAmount | None = None
    compute: int = 0
    priority: Priority = Priority.LOW
    mode: ComputeMode = ComputeMode.HARD
    weight: int = 1
    exclusive: bool = False
    models: tuple[str, ...] = ()
    engine: Engine = Engine.TIMESLICE
    colocation: Colocation = Colocation.PREEMPTIVE
    tidal_schedule: str = ""

    def __post_init__(self) -> None:
        whole_number("count", self.count, 1, 64)
        whole_number("compute", self.compute, 0, 100)
        whole_number("weight", self.weight, 1, 16)
        if self.memory is not None and not isinstance(self.memory, MemoryAmount):
            raise SpecError("memory", self.memory, "a MemoryAmount (use parse_memory)")
        if self.memory is not None and self.memory.bytes is not None:
            whole_number("memory", self.memory.bytes, 1, MAX_MEMORY_BYTES)
        if not isinstance(self.priority, Priority):
            raise SpecError("priority", self.priority, "a Priority")
        if not isinstance(self.mode, ComputeMode):
            raise SpecError("mode", self.mode, "a ComputeMode")
        if not isinstance(self.engine, Engine):
            raise SpecError("engine", self.engine, "an Engine")
        if self.engine is Engine.SPATIAL and self.count > 1:
            # A process is the client of one MPS control daemon, and gpuslice runs one per device.
            raise SpecError("engine", self.engine.value,
                            "timeslice for a request of more than one device (a spatial slice is served by "
                            "the MPS daemon of one device)")
        _check_coloc(self)

    @property
    def compute_only(self) -> bool:
        """A share of the device's time and no memory size: the request means to share its devices."""
        return self.memory is None and not self.exclusive and 0 < self.compute < 100

    def with_default_memory(self) -> "Request":
        """The request a node grants: a compute-only request gets the same fraction of each device's memory
        as of its time (``--compute 30`` → 30 % of the memory), instead of the whole memory, which would
        leave nothing for a second slice on the device. Anything else is returned as it is: a memory size
        is kept, and no compute share (or 100 %, or ``exclusive``) still means whole devices."""
        return replace(self, memory=MemoryAmount(percent=float(self.compute))) if self.compute_only else self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Request":
        """Build from loosely typed input (CLI, JSON, annotations): every field parsed and checked."""
        known = {"count", "memory", "compute", "priority", "mode", "weight", "exclusive", "models", "engine",
                 "colocation", "tidal_schedule"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], "one of the fields " + ", ".join(sorted(known)))
        kwargs: dict[str, Any] = {}
        if "count" in data:
            kwargs["count"] = _parse_count(data["count"])
        if data.get("memory") is not None:
            # A bare number means MiB wherever a human or a wire writes it (``3000``, as HAMi's gpumem): a JSON
            # number too, read as its text. Only program code passes bytes, as a MemoryAmount.
            value = data["memory"]
            kwargs["memory"] = parse_memory(str(value) if isinstance(value, int) and not isinstance(value, bool)
                                            else value, max_bytes=MAX_MEMORY_BYTES)
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
        if "engine" in data:
            kwargs["engine"] = Engine.parse(data["engine"])
        if "colocation" in data:
            kwargs["colocation"] = Colocation.parse(data["colocation"])
        if "tidal_schedule" in data:
            kwargs["tidal_schedule"] = parse_tidal_schedule(data["tidal_schedule"])
        return cls(**kwargs)


def _check_coloc(item: "Request | Slice") -> None:
    """A request's or slice's co-location fields, against its priority, mode and engine."""
    if not isinstance(item.tidal_schedule, str) or parse_tidal_schedule(item.tidal_schedule) != item.tidal_schedule:
        raise SpecError("tidal_schedule", item.tidal_schedule, "a canonical schedule (use parse_tidal_schedule)")
    check_colocation(item.colocation, item.tidal_schedule, priority=int(item.priority),
                     mode=getattr(item.mode, "value", item.mode), spatial=item.engine is Engine.SPATIAL)


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
    """A granted share of one device; ``engine`` says how the device's compute is shared (:class:`Engine`),
    ``colocation`` and ``tidal_schedule`` how it shares it with the other priority (as in :class:`Request`)."""

    device_uuid: str
    memory_limit: int
    compute: int = 0
    priority: Priority = Priority.LOW
    mode: ComputeMode = ComputeMode.HARD
    weight: int = 1
    engine: Engine = Engine.TIMESLICE
    colocation: Colocation = Colocation.PREEMPTIVE
    tidal_schedule: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.device_uuid, str) or not self.device_uuid.strip():
            raise SpecError("device_uuid", self.device_uuid, "a device UUID like GPU-…")
        whole_number("memory_limit", self.memory_limit, 1, MAX_MEMORY_BYTES)
        whole_number("compute", self.compute, 0, 100)
        whole_number("weight", self.weight, 1, 16)
        if not isinstance(self.engine, Engine):
            raise SpecError("engine", self.engine, "an Engine")
        _check_coloc(self)


GRANT_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class Grant:
    """The slices given to one container or process group, under one id (at most one slice per device).

    ``exclusive``: the devices are held whole; nobody else may share them while the grant lives. Local
    mode's ledger records and Kubernetes' container grants *contain* a Grant; who holds it, and where its
    files are, is theirs to say.
    """

    grant_id: str
    slices: tuple[Slice, ...]
    exclusive: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.grant_id, str) or not GRANT_ID.fullmatch(self.grant_id):
            raise SpecError("grant_id", self.grant_id, "1-128 letters, digits, '.', '_' or '-'")
        if not isinstance(self.slices, tuple) or not self.slices \
                or not all(isinstance(s, Slice) for s in self.slices):
            raise SpecError("slices", self.slices, "a non-empty tuple of slices")
        uuids = self.uuids
        if len(set(uuids)) != len(uuids):
            raise SpecError("slices", list(uuids), "at most one slice per device")
        if not isinstance(self.exclusive, bool):
            raise SpecError("exclusive", self.exclusive, "true or false")

    @property
    def uuids(self) -> tuple[str, ...]:
        """The granted devices, in the grant's order."""
        return tuple(s.device_uuid for s in self.slices)


class HoldsGrant:
    """For a record that contains a :class:`Grant` as its ``grant`` field (a ledger row, a pod's container):
    the grant's id, slices, exclusivity and devices, read through."""

    grant: Grant

    @property
    def grant_id(self) -> str:
        return self.grant.grant_id

    @property
    def slices(self) -> tuple[Slice, ...]:
        return self.grant.slices

    @property
    def exclusive(self) -> bool:
        return self.grant.exclusive

    @property
    def uuids(self) -> tuple[str, ...]:
        return self.grant.uuids


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
    compute_capability: str = ""  # CUDA compute capability "major.minor" (9.0 on an H100); "" = unknown
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
        if not isinstance(self.compute_capability, str) or not re.fullmatch(r"([0-9]{1,3}\.[0-9]{1,3})?",
                                                                            self.compute_capability):
            raise SpecError("compute_capability", self.compute_capability, "major.minor like 9.0, or empty (unknown)")
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

