"""Plain data of placement: device and node state, the policy, the decision, the workload mix.

All objects here are frozen dataclasses: callers (ledger, Kubernetes extender, simulator) build them from
what they know, hand them to :func:`gpuslice.placement.place`, and get a decision back. Nothing here does
I/O or reads a clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from gpuslice.spec.errors import GpusliceError
from gpuslice.spec import Device, Engine, MemoryAmount, Request, Slice, SpecError, human_bytes, whole_number

POLICIES = ("binpack", "spread", "bestfit", "fgd", "random", "topology-aware")
DEFAULT_SPLIT_COUNT = 10  # HAMi's deviceSplitCount default: at most 10 slices share one device


@dataclass(frozen=True)
class DeviceState:
    """One device (a physical GPU or one MIG instance) and what is already granted on it.

    ``memory_total`` is the physical memory; ``memory_scaling`` (HAMi's ``deviceMemoryScaling``) lets the
    sum of memory limits reach ``memory_total * memory_scaling`` (oversubscription, > 1) or keeps a
    reserve (< 1). Percent requests always resolve against the physical ``memory_total``.
    ``exclusive_taken`` marks a device given whole to one grant: nobody else may share it. ``engine`` is
    the engine of the slices on the device (``None`` while it has none): a device runs one engine at a time,
    so a slice of the other engine does not fit until the last of them ends (slices without a stated
    engine are time-sliced).
    """

    uuid: str
    memory_total: int
    model: str = ""
    sm_count: int = 0
    numa_node: int | None = None
    nvlink_peers: tuple[str, ...] = ()
    split_count: int = DEFAULT_SPLIT_COUNT
    memory_scaling: float = 1.0
    used_memory: int = 0
    used_compute: int = 0
    slice_count: int = 0
    exclusive_taken: bool = False
    profile: str = ""  # MIG profile (e.g. "3g.40gb") when this device is a MIG instance
    parent_uuid: str = ""  # the physical GPU of a MIG instance
    engine: Engine | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uuid, str) or not self.uuid:
            raise SpecError("uuid", self.uuid, "a device UUID like GPU-…")
        if self.engine is not None and (not isinstance(self.engine, Engine) or self.slice_count == 0):
            raise SpecError("engine", self.engine, "None on a device without slices, else an Engine")
        if self.engine is None and self.slice_count:  # states written before engines: time-sliced
            object.__setattr__(self, "engine", Engine.TIMESLICE)
        for name, low in (("memory_total", 1), ("split_count", 1), ("used_memory", 0),
                          ("used_compute", 0), ("slice_count", 0), ("sm_count", 0)):
            whole_number(name, getattr(self, name), low)
        if not isinstance(self.memory_scaling, (int, float)) or not 0 < self.memory_scaling <= 100:
            raise SpecError("memory_scaling", self.memory_scaling, "a number above 0 and at most 100")
        # A state that is already over-committed cannot be placed onto; refuse it at the edge.
        if self.used_memory > self.memory_limit_sum:
            raise SpecError("used_memory", self.used_memory,
                            f"at most the memory capacity {self.memory_limit_sum} "
                            f"({'held whole: the physical memory' if self.exclusive_taken else 'total × scaling'})")
        if self.used_compute > 100:
            raise SpecError("used_compute", self.used_compute, "at most 100 (percent of one device)")
        if self.slice_count > self.split_count:
            raise SpecError("slice_count", self.slice_count, f"at most split_count {self.split_count}")

    @property
    def memory_capacity(self) -> int:
        """The most memory that slices on this device may add up to."""
        return int(self.memory_total * self.memory_scaling)

    @property
    def whole_capacity(self) -> int:
        """The memory a grant holding this device whole may have: a reserve (scaling < 1) is for
        packing slices, and a device held whole has nothing to pack, so its physical memory counts."""
        return max(self.memory_capacity, self.memory_total)

    @property
    def memory_limit_sum(self) -> int:
        """What the memory limits on this device may add up to in its present state."""
        return self.whole_capacity if self.exclusive_taken else self.memory_capacity

    @property
    def free_memory(self) -> int:
        return 0 if self.exclusive_taken else self.memory_capacity - self.used_memory

    @property
    def free_compute(self) -> int:
        return 0 if self.exclusive_taken else 100 - self.used_compute

    @property
    def free_slots(self) -> int:
        return 0 if self.exclusive_taken else self.split_count - self.slice_count

    @property
    def is_idle(self) -> bool:
        """Nothing granted: the device can be given whole."""
        return self.slice_count == 0 and not self.exclusive_taken

    def takes(self, engine: Engine) -> bool:
        """Whether a slice of ``engine`` may join this device now (one engine per device)."""
        return self.engine is None or self.engine is engine

    def matches(self, models: Sequence[str]) -> bool:
        """True if ``models`` is empty or names this device's model, its MIG profile or ``model/profile``."""
        if not models:
            return True
        names = {self.model}
        if self.profile:
            names |= {self.profile, f"{self.model}/{self.profile}"}
        return any(m in names for m in models)


@dataclass(frozen=True)
class NodeState:
    """One node: its devices and, optionally, its CPU and host memory (``None`` = not tracked).

    CPU and host memory matter to the simulator (the trace's tasks need CPU too); in Kubernetes the
    scheduler itself filters them, so the extender leaves them ``None``.
    """

    name: str
    devices: tuple[DeviceState, ...]
    cpu_milli: int | None = None
    cpu_used: int = 0
    host_memory: int | None = None
    host_memory_used: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("node", self.name, "a node name")
        if not isinstance(self.devices, tuple):
            object.__setattr__(self, "devices", tuple(self.devices))
        uuids = [d.uuid for d in self.devices]
        if len(set(uuids)) != len(uuids):
            raise SpecError("devices", uuids, "devices with distinct UUIDs")
        if self.cpu_milli is not None and not 0 <= self.cpu_used <= self.cpu_milli:
            raise SpecError("cpu_used", self.cpu_used, f"0 to cpu_milli {self.cpu_milli}")
        if self.host_memory is not None and not 0 <= self.host_memory_used <= self.host_memory:
            raise SpecError("host_memory_used", self.host_memory_used, f"0 to host_memory {self.host_memory}")

    def device(self, uuid: str) -> DeviceState:
        for d in self.devices:
            if d.uuid == uuid:
                return d
        raise SpecError("device_uuid", uuid, f"a UUID of a device on node {self.name}")

    @classmethod
    def from_devices(
        cls,
        name: str,
        devices: Iterable[Device],
        slices: Iterable[Slice] = (),
        *,
        exclusive: Iterable[str] = (),
        split_count: int = DEFAULT_SPLIT_COUNT,
        memory_scaling: float = 1.0,
        cpu_milli: int | None = None,
        host_memory: int | None = None,
    ) -> "NodeState":
        """Build a node's state from NVML devices and the slices already granted (ledger / annotations).

        A MIG-enabled card becomes one device per MIG instance; the card itself is never placeable,
        not even with no instance created: a MIG-mode GPU runs CUDA work only inside an instance, so
        such a card contributes no device at all. ``exclusive`` lists device UUIDs held whole by a grant
        (``Slice`` does not say so).
        """
        states: list[DeviceState] = []
        for dev in devices:
            model = dev.model or dev.name
            if dev.mig_enabled:
                for inst in dev.mig_instances:
                    states.append(DeviceState(
                        uuid=inst.uuid, memory_total=inst.memory_total, model=model, sm_count=inst.sm_count,
                        numa_node=dev.numa_node, split_count=split_count, memory_scaling=memory_scaling,
                        profile=inst.profile, parent_uuid=dev.uuid))
            else:
                states.append(DeviceState(
                    uuid=dev.uuid, memory_total=dev.memory_total, model=model, sm_count=dev.sm_count,
                    numa_node=dev.numa_node, nvlink_peers=tuple(dev.nvlink_peers), split_count=split_count,
                    memory_scaling=memory_scaling))
        node = cls(name=name, devices=tuple(states), cpu_milli=cpu_milli, host_memory=host_memory)
        slices = tuple(slices)
        if slices:
            held = set(exclusive)
            node = apply(node, [s for s in slices if s.device_uuid not in held])
            node = apply(node, [s for s in slices if s.device_uuid in held], exclusive=True)
        return node


def _change(node: NodeState, slices: Sequence[Slice], exclusive: bool, sign: int,
            cpu_milli: int, host_memory: int) -> NodeState:
    by_uuid = {d.uuid: d for d in node.devices}
    changed: dict[str, DeviceState] = {}
    for s in slices:
        d = changed.get(s.device_uuid) or by_uuid.get(s.device_uuid)
        if d is None:
            raise SpecError("device_uuid", s.device_uuid, f"a UUID of a device on node {node.name}")
        if sign > 0:
            if d.exclusive_taken or (exclusive and d.slice_count):
                raise SpecError("device_uuid", s.device_uuid, "a device not held whole by another grant")
            if not d.takes(s.engine):
                raise SpecError("engine", s.engine.value, engine_conflict(d.engine, d.slice_count, s.device_uuid))
            d = replace(d, used_memory=d.used_memory + s.memory_limit, used_compute=d.used_compute + s.compute,
                        slice_count=d.slice_count + 1, exclusive_taken=exclusive, engine=s.engine)
        else:
            if d.slice_count < 1 or d.used_memory < s.memory_limit or d.used_compute < s.compute:
                raise SpecError("slices", s, f"a slice that is granted on {s.device_uuid}")
            d = replace(d, used_memory=d.used_memory - s.memory_limit, used_compute=d.used_compute - s.compute,
                        slice_count=d.slice_count - 1, exclusive_taken=False if exclusive else d.exclusive_taken,
                        engine=d.engine if d.slice_count > 1 else None)
        changed[s.device_uuid] = d  # DeviceState's own checks refuse any over-commit here
    cpu_used = node.cpu_used + sign * cpu_milli
    mem_used = node.host_memory_used + sign * host_memory
    return replace(node, devices=tuple(changed.get(d.uuid, d) for d in node.devices),
                   cpu_used=cpu_used if node.cpu_milli is not None else node.cpu_used,
                   host_memory_used=mem_used if node.host_memory is not None else node.host_memory_used)


def engine_conflict(engine: Engine | None, slices: int, uuid: str) -> str:
    """What a slice must be to join device ``uuid``, which holds ``slices`` slices of ``engine``."""
    name = engine.value if engine is not None else "none"
    return f"{name}, the engine of the {slices} slice(s) on {uuid} (a device runs one engine at a time)"


def apply(node: NodeState, slices: Sequence[Slice], *, exclusive: bool = False,
          cpu_milli: int = 0, host_memory: int = 0) -> NodeState:
    """The node after granting ``slices`` (and the task's CPU / host memory). Refuses any over-commit
    with :class:`SpecError` — callers should only apply what :func:`place` returned."""
    return _change(node, slices, exclusive, +1, cpu_milli, host_memory)


def release(node: NodeState, slices: Sequence[Slice], *, exclusive: bool = False,
            cpu_milli: int = 0, host_memory: int = 0) -> NodeState:
    """The node after the grant of ``slices`` ended (the inverse of :func:`apply`)."""
    return _change(node, slices, exclusive, -1, cpu_milli, host_memory)


@dataclass(frozen=True)
class PlacementPolicy:
    """How to choose: ``node`` ranks nodes, ``gpu`` picks devices inside a node (HAMi's two knobs).

    ``topology`` adds a score for multi-device requests (NVLink clique > same NUMA > scattered), blended
    into the node score with ``topology_weight``. ``seed`` makes ``random`` reproducible. ``weights``
    (``(slot, core, memory)``, HAMi's ``hami.io/device-scoring-weights``) makes ``binpack`` and ``spread``
    rank devices by ``slot·slots share + core·compute share + memory·memory share`` after placing; ``None``
    is gpuslice's own ranking (memory share + compute share).
    """

    node: str = "binpack"
    gpu: str = "binpack"
    topology: bool = True
    topology_weight: float = 0.3
    seed: int = 0
    weights: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("node", "gpu"):
            value = getattr(self, name)
            if value not in POLICIES:
                raise SpecError(f"policy.{name}", value, "one of " + ", ".join(POLICIES))
        if not 0 <= self.topology_weight <= 1:
            raise SpecError("policy.topology_weight", self.topology_weight, "a number from 0 to 1")
        w = self.weights
        if w is not None and (not isinstance(w, tuple) or len(w) != 3 or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1000 for x in w) or not any(w)):
            raise SpecError("policy.weights", w, "(slot, core, memory): whole numbers 0..1000, at least one above 0")

    @classmethod
    def parse(cls, text: str, **kwargs: object) -> "PlacementPolicy":
        """``"fgd"`` (both levels) or ``"node=spread,gpu=binpack"``."""
        text = str(text).strip().lower()
        if "=" not in text:
            return cls(node=text, gpu=text, **kwargs)  # type: ignore[arg-type]
        parts: dict[str, str] = {}
        for item in text.split(","):
            key, _, value = item.partition("=")
            if key.strip() not in ("node", "gpu"):
                raise SpecError("policy", text, "a policy name or node=<policy>,gpu=<policy>")
            parts[key.strip()] = value.strip()
        return cls(**parts, **kwargs)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        return self.node if self.node == self.gpu else f"node={self.node},gpu={self.gpu}"


@dataclass(frozen=True)
class Placement:
    """The decision: which node, the slices to grant there, its score (0..100) and whether whole devices."""

    node: str
    slices: tuple[Slice, ...]
    score: float
    exclusive: bool = False


class NoFit(GpusliceError):
    """No node can take the request; ``reason`` summarises what is free, ``per_node`` says why per node."""

    def __init__(self, reason: str, per_node: Mapping[str, str] | None = None):
        self.reason = reason
        self.per_node = dict(per_node or {})
        super().__init__(reason)


# ------------------------------------------------------------------------------------------ workload
@dataclass(frozen=True)
class TaskShape:
    """The part of a request that decides where it fits: what FGD's workload distribution counts.

    ``count=0`` is a task that needs no device (CPU only), which matters to FGD only through CPU.
    """

    count: int = 1
    memory: MemoryAmount | None = None
    compute: int = 0
    exclusive: bool = False
    models: tuple[str, ...] = ()
    cpu_milli: int = 0
    host_memory: int = 0
    engine: Engine = Engine.TIMESLICE

    def __hash__(self) -> int:
        # Shapes key the fragmentation caches on every call; hashing their fields each time showed up
        # in profiles, so the hash is computed once (the object is frozen).
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.count, self.memory, self.compute, self.exclusive, self.models, self.cpu_milli,
                           self.host_memory, self.engine))
            object.__setattr__(self, "_hash", cached)
        return cached

    @classmethod
    def of(cls, request: Request, cpu_milli: int = 0, host_memory: int = 0) -> "TaskShape":
        # A request for whole devices takes idle devices whatever compute share it names (HAMi's
        # ``gpucores: 100`` or none): one shape, so the workload counts them together and ranks them alike
        # (the extender's pods say 100, the simulator's tasks 0; the typical set's order once told them apart).
        whole = request.exclusive or (request.count > 1 and request.memory is None)
        return cls(count=request.count, memory=request.memory, compute=0 if whole else request.compute,
                   exclusive=request.exclusive, models=tuple(request.models),
                   cpu_milli=cpu_milli, host_memory=host_memory, engine=request.engine)

    @property
    def whole(self) -> bool:
        """Needs whole idle devices: an exclusive request, or several devices' whole memory each.

        Several devices with a stated memory size are shared slices on distinct devices, as HAMi grants
        ``nvidia.com/gpu: 2`` with ``gpumem: 3000`` (two 3000 MiB vGPUs others may share the cards with).
        """
        return self.exclusive or (self.count > 1 and self.memory is None)

    @property
    def demand_weight(self) -> float:
        """How much one task of this shape counts in a :class:`Workload`: 1, every task alike (the FGD
        authors' ``gpuResWeight=0``). Rare 8-GPU shapes then fall out of the typical set; what keeps
        whole nodes free for them is FGD's tie-break (equal scores go to the same nodes, see
        ``scorers.fgd.node_order``), not their weight. Counting whole-device shapes once per device
        over-protected idle nodes: −0.5 points of allocation on openb's multigpu30 trace."""
        return 1.0

    def describe(self) -> str:
        mem = "whole memory" if self.memory is None else str(self.memory)
        if self.whole:
            kind = f"{self.count} whole device(s)"
        else:
            kind = "1 shared device" if self.count == 1 else f"{self.count} shared devices (distinct)"
        engine = ", spatial engine" if self.engine is Engine.SPATIAL else ""
        return f"{kind}, {mem}, compute {self.compute}%{engine}"


@dataclass(frozen=True)
class Workload:
    """The distribution of task shapes seen so far (FGD's "target workload"): shapes and their counts.

    Immutable: :meth:`observe` returns a new one. Empty means "only the request being placed", so
    ``fgd`` still works before anything was seen.
    """

    counts: tuple[tuple[TaskShape, float], ...] = ()

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape]) -> "Workload":
        return cls(tuple(Counter(shapes).items()))

    def observe(self, shape: TaskShape, weight: float | None = None) -> "Workload":
        """Count one more task of ``shape``; ``weight`` defaults to :attr:`TaskShape.demand_weight`."""
        table = dict(self.counts)
        table[shape] = table.get(shape, 0.0) + (shape.demand_weight if weight is None else weight)
        return Workload(tuple(table.items()))

    def typical(self, coverage: float = 0.95, limit: int = 32) -> "Workload":
        """The most frequent shapes that together cover ``coverage`` of all tasks (at most ``limit``):
        the FGD simulator's "typical pods" (popularity threshold 95 %)."""
        ranked = sorted(self.counts, key=lambda kv: (-kv[1], repr(kv[0])))
        total, kept, acc = self.total, [], 0.0
        for shape, count in ranked[:limit]:
            kept.append((shape, count))
            acc += count
            if acc >= coverage * total:
                break
        return Workload(tuple(kept))

    def top(self, limit: int) -> "Workload":
        """The ``limit`` most frequent shapes (FGD's cost grows with the number of shapes)."""
        ranked = sorted(self.counts, key=lambda kv: -kv[1])[:limit]
        return Workload(tuple(ranked))

    @property
    def total(self) -> float:
        return sum(c for _, c in self.counts)


def describe_free(node: NodeState, names: Mapping[str, str] | None = None) -> str:
    """One line of what is free on a node, for refusal messages. ``names`` maps device UUIDs to what a
    person calls them (``GPU 0``; the caller knows, placement does not); neighbours with the same room
    are told once (``GPU 1–7: 79.6 GiB, 100% compute, 10 slots free each``); a device whose slices are
    spatial says so (``(spatial engine)``): it takes no time-sliced slice."""
    if not node.devices:
        return "no devices"
    names = names or {}
    groups: list[list[DeviceState]] = []
    for d in node.devices:
        room = (d.free_memory, d.free_compute, d.free_slots, d.engine)
        if groups and (groups[-1][0].free_memory, groups[-1][0].free_compute, groups[-1][0].free_slots,
                       groups[-1][0].engine) == room:
            groups[-1].append(d)
        else:
            groups.append([d])
    parts = []
    for group in groups:
        first, last = (names.get(d.uuid, d.uuid) for d in (group[0], group[-1]))
        label = first if len(group) == 1 else _span(first, last, len(group))
        d = group[0]
        each = " each" if len(group) > 1 else ""
        engine = " (spatial engine)" if d.engine is Engine.SPATIAL else ""  # time-sliced is the default
        parts.append(f"{label}: {human_bytes(d.free_memory)}, {d.free_compute}% compute, "
                     f"{d.free_slots} slots free{each}{engine}")
    return "; ".join(parts)


def _span(first: str, last: str, count: int) -> str:
    """``GPU 1`` … ``GPU 7`` → ``GPU 1–7``; names without a shared stem → ``first … last (n devices)``."""
    stem = first.rstrip("0123456789")
    if stem and stem != first and last.startswith(stem) and last[len(stem):].isdigit():
        return f"{first}–{last[len(stem):]}"
    return f"{first} … {last} ({count} devices)"


__all__ = [
    "DEFAULT_SPLIT_COUNT", "POLICIES", "DeviceState", "NodeState", "PlacementPolicy", "Placement", "NoFit",
    "TaskShape", "Workload", "apply", "release", "describe_free", "engine_conflict",
]
