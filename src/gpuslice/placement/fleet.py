"""A column-store of many nodes' device state (numpy), so one request is scored over thousands of nodes
in a few vectorised passes instead of a Python loop per device.

:func:`gpuslice.placement.place` builds one from a list of :class:`NodeState` on each call (fine for a
scheduler extender seeing tens or hundreds of nodes); long-lived callers (the simulator, a benchmark, an
agent that keeps its state) build a :class:`Fleet` once and keep it current with :meth:`Fleet.apply` /
:meth:`Fleet.release`, which change only the touched node's row.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from gpuslice.placement.model import DeviceState, NodeState, Placement, engine_conflict
from gpuslice.spec import Engine, Slice, SpecError

UNTRACKED = np.int64(2**62)  # CPU / host memory of a node that does not track them: never the limit
# The engine column: 0 while a device has no slices, else the code of its slices' engine.
ENGINE_CODE = {None: 0, Engine.TIMESLICE: 1, Engine.SPATIAL: 2}
ENGINE_OF = {code: engine for engine, code in ENGINE_CODE.items()}


class Fleet:
    """Nodes × devices arrays (padded to the widest node). Rows are nodes in the order given."""

    def __init__(self, nodes: Sequence[NodeState]):
        nodes = list(nodes)
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise SpecError("nodes", names, "nodes with distinct names")
        n = len(nodes)
        g = max((len(x.devices) for x in nodes), default=0) or 1
        self.names = names
        self.index = {name: i for i, name in enumerate(names)}
        self.static: list[tuple[DeviceState, ...]] = [x.devices for x in nodes]
        self.width = g
        shape = (n, g)
        self.valid = np.zeros(shape, bool)
        self.mem_total = np.ones(shape, np.int64)
        self.mem_cap = np.ones(shape, np.int64)
        self.mem_used = np.zeros(shape, np.int64)
        self.comp_used = np.zeros(shape, np.int64)
        self.slots_used = np.zeros(shape, np.int64)
        self.split = np.zeros(shape, np.int64)
        self.excl = np.zeros(shape, bool)
        self.engine = np.zeros(shape, np.int8)
        self.kind = np.zeros(shape, np.int32)
        self.numa = np.full(shape, -1, np.int32)
        self.cpu_total = np.full(n, UNTRACKED, np.int64)
        self.cpu_used = np.zeros(n, np.int64)
        self.hm_total = np.full(n, UNTRACKED, np.int64)
        self.hm_used = np.zeros(n, np.int64)
        self.kinds: list[DeviceState] = []  # one representative per (model, profile): for model matching
        self.pos: dict[str, tuple[int, int]] = {}
        self.has_topology = np.zeros(n, bool)
        # MIG instances of one card share its memory system: a multi-device request takes at most one
        # instance per card. parent[i, j] numbers the card of a MIG instance (-1: a whole GPU).
        self.parent = np.full((n, g), -1, np.int32)
        self.has_mig = np.zeros(n, bool)
        self._fill(nodes, shape)
        self.name_array = np.array(names, dtype=object)  # fancy-indexable names for result dicts
        self.n_devices = self.valid.sum(axis=1)
        self._used_sum: np.ndarray | None = None  # per node Σ used share, kept current by _change
        # Nodes whose devices are not all of one kind (model, MIG profile): only there does the choice
        # among idle devices matter for whole-device requests.
        masked_kind = np.where(self.valid, self.kind, -1)
        first = masked_kind.max(axis=1, initial=-1)[:, None] if n else np.zeros((0, 1), np.int32)
        self.mixed = ((masked_kind != first) & self.valid).any(axis=1) if n else np.zeros(0, bool)
        self.version = 0  # bumped on every change: mixes into the seed of the random policy
        # Per-row change counters: cached fragmentation terms are recomputed only for rows that changed.
        self.row_version = np.zeros(n, np.int64)
        self._type_cache: dict = {}
        self._static_cache: dict = {}  # per memory amount / model list: arrays that never change
        self._frag_cache: dict = {}
        # Topology choice of multi-device requests, memoised per node layout (topology.best_set).
        self._topology_rows: dict[int, int] = {}
        self._topology_ids: dict[tuple, int] = {}
        self._topology_memo: dict = {}
        self._scratch: dict = {}  # reusable work arrays (Fleet.scratch)

    def _fill(self, nodes: Sequence[NodeState], shape: tuple[int, int]) -> None:
        """Load every node's devices into the columns (and the per-node lookups: kinds, pos, parents)."""
        kind_ids: dict[tuple[str, str], int] = {}
        parent_ids: dict[str, int] = {}
        # Built as flat Python lists, then converted once: per-element numpy stores cost ~10x more.
        cells: list[tuple] = []
        pad = (False, 1, 1, 0, 0, 0, 0, False, 0, -1, 0)
        for i, node in enumerate(nodes):
            if node.cpu_milli is not None:
                self.cpu_total[i], self.cpu_used[i] = node.cpu_milli, node.cpu_used
            if node.host_memory is not None:
                self.hm_total[i], self.hm_used[i] = node.host_memory, node.host_memory_used
            for j, d in enumerate(node.devices):
                if d.uuid in self.pos:
                    raise SpecError("devices", d.uuid, "device UUIDs unique across the nodes")
                self.pos[d.uuid] = (i, j)
                key = (d.model, d.profile)
                kind = kind_ids.get(key)
                if kind is None:
                    kind = kind_ids[key] = len(self.kinds)
                    self.kinds.append(d)
                cells.append((True, d.memory_total, int(d.memory_total * d.memory_scaling), d.used_memory,
                              d.used_compute, d.slice_count, d.split_count, d.exclusive_taken, kind,
                              -1 if d.numa_node is None else d.numa_node, ENGINE_CODE[d.engine]))
                if d.nvlink_peers or d.numa_node is not None:
                    self.has_topology[i] = True
                if d.parent_uuid:
                    self.parent[i, j] = parent_ids.setdefault(d.parent_uuid, len(parent_ids))
                    self.has_mig[i] = True
            cells.extend([pad] * (shape[1] - len(node.devices)))
        if cells:
            columns = list(zip(*cells))
            for name, column, dtype in zip(
                    ("valid", "mem_total", "mem_cap", "mem_used", "comp_used", "slots_used", "split", "excl",
                     "kind", "numa", "engine"), columns,
                    (bool, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, bool, np.int32, np.int32,
                     np.int8)):
                setattr(self, name, np.array(column, dtype).reshape(shape))

    def __len__(self) -> int:
        return len(self.names)

    def scratch(self, key: str, shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
        """A work array reused from call to call (contents undefined): each placement call allocated a dozen
        [nodes, devices] temporaries, and at 5,000 × 8 every one of them (320 kB, above glibc's mmap
        threshold) cost ~0.12 ms of page faults — more than the arithmetic. Only for values a call uses
        and drops; never return one to a caller."""
        buf = self._scratch.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._scratch[key] = np.empty(shape, dtype)
        return buf

    # ------------------------------------------------------------------------------------ state changes
    def _rows(self, node: str | int) -> int:
        if isinstance(node, str):
            if node not in self.index:
                raise SpecError("node", node, "a node of this fleet")
            return self.index[node]
        return int(node)

    def apply(self, node: str | int, slices: Sequence[Slice], *, exclusive: bool = False,
              cpu_milli: int = 0, host_memory: int = 0) -> None:
        """Grant ``slices`` on ``node`` in place. Refuses (SpecError, nothing changed) any over-commit."""
        self._change(self._rows(node), slices, exclusive, +1, cpu_milli, host_memory)

    def release(self, node: str | int, slices: Sequence[Slice], *, exclusive: bool = False,
                cpu_milli: int = 0, host_memory: int = 0) -> None:
        """Take back the grant of ``slices`` on ``node`` in place."""
        self._change(self._rows(node), slices, exclusive, -1, cpu_milli, host_memory)

    def apply_placement(self, placement: Placement, *, cpu_milli: int = 0, host_memory: int = 0) -> None:
        self.apply(placement.node, placement.slices, exclusive=placement.exclusive,
                   cpu_milli=cpu_milli, host_memory=host_memory)

    def release_placement(self, placement: Placement, *, cpu_milli: int = 0, host_memory: int = 0) -> None:
        self.release(placement.node, placement.slices, exclusive=placement.exclusive,
                     cpu_milli=cpu_milli, host_memory=host_memory)

    def _change(self, i: int, slices: Sequence[Slice], exclusive: bool, sign: int,
                cpu_milli: int, host_memory: int) -> None:
        # Running totals per device: several slices of one call may land on one device (a ledger
        # rebuilt in one go), and each must be checked against what the ones before it took.
        updates: dict[int, tuple[int, int, int, bool, int]] = {}
        for s in slices:
            where = self.pos.get(s.device_uuid)
            if where is None or where[0] != i:
                raise SpecError("device_uuid", s.device_uuid, f"a UUID of a device on node {self.names[i]}")
            j = where[1]
            mem0, comp0, slots0, excl0, eng0 = updates.get(j) or (
                int(self.mem_used[i, j]), int(self.comp_used[i, j]), int(self.slots_used[i, j]), bool(self.excl[i, j]),
                int(self.engine[i, j]))
            mem = mem0 + sign * s.memory_limit
            comp = comp0 + sign * s.compute
            slots = slots0 + sign
            if sign > 0 and (excl0 or (exclusive and slots0)):
                raise SpecError("device_uuid", s.device_uuid, "a device not held whole by another grant")
            if sign > 0 and slots0 and eng0 != ENGINE_CODE[s.engine]:
                raise SpecError("engine", s.engine.value, engine_conflict(ENGINE_OF[eng0], slots0, s.device_uuid))
            eng = ENGINE_CODE[s.engine] if sign > 0 else (eng0 if slots > 0 else 0)
            excl = exclusive if sign > 0 else (False if exclusive else excl0)
            # A device held whole may carry its physical memory even where a reserve (scaling < 1)
            # keeps shared slices below it.
            cap = max(int(self.mem_cap[i, j]), int(self.mem_total[i, j])) if excl else int(self.mem_cap[i, j])
            if not (0 <= mem <= cap and 0 <= comp <= 100 and 0 <= slots <= self.split[i, j]):
                raise SpecError("slices", s, f"a slice that fits on {s.device_uuid} without over-commit")
            updates[j] = (mem, comp, slots, excl, eng)
        cpu = int(self.cpu_used[i]) + sign * cpu_milli
        hm = int(self.hm_used[i]) + sign * host_memory
        if self.cpu_total[i] != UNTRACKED and not 0 <= cpu <= self.cpu_total[i]:
            raise SpecError("cpu_milli", cpu_milli, f"CPU that fits on node {self.names[i]}")
        if self.hm_total[i] != UNTRACKED and not 0 <= hm <= self.hm_total[i]:
            raise SpecError("host_memory", host_memory, f"host memory that fits on node {self.names[i]}")
        for j, (mem, comp, slots, excl, eng) in updates.items():  # all checks passed: nothing is half-applied
            self.mem_used[i, j], self.comp_used[i, j], self.slots_used[i, j], self.excl[i, j] = mem, comp, slots, excl
            self.engine[i, j] = eng
        if self.cpu_total[i] != UNTRACKED:
            self.cpu_used[i] = cpu
        if self.hm_total[i] != UNTRACKED:
            self.hm_used[i] = hm
        self.version += 1
        self.row_version[i] += 1
        if self._used_sum is not None:
            self._used_sum[i] = self._row_used(i)

    # ------------------------------------------------------------------------------------------ views
    def node_state(self, node: str | int) -> NodeState:
        """The node's current state as plain data."""
        i = self._rows(node)
        devices = tuple(
            replace(d, used_memory=int(self.mem_used[i, j]), used_compute=int(self.comp_used[i, j]),
                    slice_count=int(self.slots_used[i, j]), exclusive_taken=bool(self.excl[i, j]),
                    engine=ENGINE_OF[int(self.engine[i, j])])
            for j, d in enumerate(self.static[i]))
        tracked_cpu = self.cpu_total[i] != UNTRACKED
        tracked_hm = self.hm_total[i] != UNTRACKED
        return NodeState(name=self.names[i], devices=devices,
                         cpu_milli=int(self.cpu_total[i]) if tracked_cpu else None,
                         cpu_used=int(self.cpu_used[i]) if tracked_cpu else 0,
                         host_memory=int(self.hm_total[i]) if tracked_hm else None,
                         host_memory_used=int(self.hm_used[i]) if tracked_hm else 0)

    def nodes(self) -> list[NodeState]:
        return [self.node_state(i) for i in range(len(self))]

    def _row_used(self, i: int) -> float:
        valid = self.valid[i]
        share = np.where(self.excl[i], 1.0, self.mem_used[i] / self.mem_cap[i])
        # Rounded like the full computation below, so a kept fleet and a fresh one agree bit for bit
        # (scores compare exactly for ties) whatever order the sums ran in.
        return round(float((share * valid).sum()), 9)

    def used_sum(self) -> np.ndarray:
        """Per node: Σ of its devices' used share (devices' worth allocated). Maintained row by row."""
        if self._used_sum is None:
            self._used_sum = np.round(self.used_share().sum(axis=1), 9)
        return self._used_sum

    def used_share(self) -> np.ndarray:
        """Per device: the allocated share of its memory capacity (1 when held whole, 0 when padding)."""
        share = self.mem_used / self.mem_cap
        share = np.where(self.excl, 1.0, share)
        return np.where(self.valid, share, 0.0)

    def free_share(self) -> np.ndarray:
        """Per device: the unallocated share of its memory capacity (0 when held whole or padding)."""
        return np.where(self.valid & ~self.excl, (self.mem_cap - self.mem_used) / self.mem_cap, 0.0)
