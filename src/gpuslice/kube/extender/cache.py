"""The extender's view of the nodes: each Node's published devices and ledger as placement state
(:class:`NodeView`), a cache of them fed by a watch (:class:`NodeCache`, ``nodeCacheCapable``), and the
shared fleet the filter and prioritize paths score against (:class:`FleetIndex`)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dataclasses import replace

from gpuslice.kube import formats, nodestate
from gpuslice.kube.api import KubeAPI
from gpuslice.kube.extender.follow import follow
from gpuslice.kube.extender.usage import PodUsage
from gpuslice.kube.resources import parse_quantity
from gpuslice.placement import Fleet, NodeState
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.extender")


@dataclass(frozen=True)
class NodeView:
    """One node as the extender sees it: parsed annotations and the base placement state."""

    name: str
    resource_version: str
    devices: formats.NodeDevices | None
    ledger: formats.Ledger
    state: NodeState | None
    problem: str = ""  # why the node cannot take GPU pods (no or bad annotations)
    allocating: frozenset[str] = frozenset()  # the allocation lock's holders (gpuslice.io/allocating)
    cordoned: frozenset[str] = frozenset()  # devices taken out of new placement (hami.io/device-cordon)


def allocatable(node: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(CPU milli, memory bytes) the Node offers pods (``status.allocatable``); None where not given."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    out: list[int | None] = []
    for key, scale in (("cpu", 1000), ("memory", 1)):
        try:
            out.append(int(parse_quantity(key, alloc[key]) * scale) if key in alloc else None)
        except SpecError:
            out.append(None)
    return out[0], out[1]


def view_of(node: Mapping[str, Any]) -> NodeView:
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    rv = str(meta.get("resourceVersion", ""))
    anns = meta.get("annotations") or {}
    if formats.NODE_DEVICES not in anns:
        return NodeView(name, rv, None, formats.Ledger({}), None,
                        f"node publishes no gpuslice devices (annotation {formats.NODE_DEVICES} is missing; "
                        "is the gpuslice agent running there?)")
    try:
        devices = formats.decode_node_devices(anns[formats.NODE_DEVICES])
        ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), name)
        allocating = formats.decode_allocating(anns.get(formats.NODE_ALLOCATING))
        cordoned = formats.cordoned(node)
        cpu, memory = allocatable(node)
        # CPU and host memory tracked for FGD and best-fit (what the pods there use: PodUsage, applied by
        # FleetIndex and Extender._with_usage); kube-scheduler filters them itself.
        state = replace(nodestate.node_state(name, devices, ledger, blocked=cordoned), cpu_milli=cpu,
                        host_memory=memory)
    except SpecError as exc:
        return NodeView(name, rv, None, formats.Ledger({}), None, f"node annotations are unreadable: {exc}")
    return NodeView(name, rv, devices, ledger, state, allocating=allocating, cordoned=cordoned)


class ViewCache:
    """Parsed node views keyed by (name, resourceVersion): parsing is paid once per node change.
    Every change bumps ``version`` and is remembered per node, so a :class:`FleetIndex` can follow."""

    def __init__(self, limit: int = 100_000):
        self._views: dict[str, NodeView] = {}
        self._changed: dict[str, int] = {}
        self.version = 0
        self._lock = threading.Lock()
        self.limit = limit

    def view(self, node: Mapping[str, Any]) -> NodeView:
        meta = node.get("metadata") or {}
        name, rv = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
        with self._lock:
            cached = self._views.get(name)
        if cached is not None and rv and cached.resource_version == rv:
            return cached
        fresh = view_of(node)
        with self._lock:
            self.version += 1
            if len(self._views) >= self.limit and name not in self._views:
                for gone in self._views:
                    self._changed[gone] = self.version
                self._views.clear()
            self._views[name] = fresh
            self._changed[name] = self.version
        return fresh

    def get(self, name: str) -> NodeView | None:
        with self._lock:
            return self._views.get(name)

    def get_many(self, names: Iterable[str]) -> list[NodeView | None]:
        with self._lock:
            views = self._views
            return [views.get(n) for n in names]

    def forget(self, name: str) -> None:
        with self._lock:
            if self._views.pop(name, None) is not None:
                self.version += 1
                self._changed[name] = self.version

    def names(self) -> list[str]:
        with self._lock:
            return list(self._views)

    def changes_since(self, version: int) -> tuple[int, dict[str, NodeView | None]]:
        """(current version, {name: view or None if forgotten}) of the nodes changed after ``version``."""
        with self._lock:
            changed = {n: self._views.get(n) for n, v in self._changed.items() if v > version}
            return self.version, changed

    def snapshot(self) -> tuple[int, dict[str, NodeView]]:
        with self._lock:
            return self.version, dict(self._views)


class FleetIndex:
    """One placement :class:`~gpuslice.placement.Fleet` over every known node, kept current row by row:
    a node whose ledger changed is updated with ``Fleet.release``/``Fleet.apply`` of the grants that went
    and came (public placement API); a change of devices, health or the node set rebuilds it. Filter and
    prioritize then cost a few numpy passes instead of a per-request conversion of every node."""

    def __init__(self, views: ViewCache, usage: PodUsage | None = None):
        self.views = views
        self.usage = usage
        self.lock = threading.Lock()
        self.fleet: Fleet | None = None
        self.used: dict[str, NodeView] = {}
        self.version = -1
        self.usage_version = -1
        self.applied: dict[str, tuple[int, int]] = {}  # (cpu, memory) of PodUsage applied to each row
        self.rebuilds = 0

    @staticmethod
    def _same_devices(a: NodeView, b: NodeView) -> bool:
        da, db = a.devices, b.devices
        assert da is not None and db is not None
        sa, sb = a.state, b.state
        assert sa is not None and sb is not None
        return (da.devices == db.devices and dict(da.health) == dict(db.health) and a.cordoned == b.cordoned
                and da.split_count == db.split_count and da.memory_scaling == db.memory_scaling
                and (sa.cpu_milli, sa.host_memory) == (sb.cpu_milli, sb.host_memory))

    def _rebuild(self) -> None:
        self.version, views = self.views.snapshot()
        self.used = {n: v for n, v in views.items() if v.state is not None}
        self.fleet = Fleet([v.state for v in self.used.values()])  # type: ignore[misc]
        self.rebuilds += 1
        self.applied = {}
        if self.usage is not None:
            self.usage_version, _ = self.usage.changes_since(self.usage_version)
            for name in self.used:
                self._set_usage(name, self.usage.usage(name))

    def _set_usage(self, name: str, want: tuple[int, int]) -> None:
        """Move row ``name``'s CPU / memory use to ``want`` (clamped to what the node offers: pods kube-scheduler
        placed are within it, a lagging view may not be)."""
        fleet = self.fleet
        assert fleet is not None
        i = fleet.index[name]
        totals = (int(fleet.cpu_total[i]), int(fleet.hm_total[i]))  # untracked: placement's huge sentinel
        want = tuple(max(0, min(int(w), t)) for w, t in zip(want, totals))  # type: ignore[assignment]
        old = self.applied.get(name, (0, 0))
        up = [max(0, w - o) for w, o in zip(want, old)]
        down = [max(0, o - w) for w, o in zip(want, old)]
        if any(down):
            fleet.release(name, [], cpu_milli=down[0], host_memory=down[1])
        if any(up):
            fleet.apply(name, [], cpu_milli=up[0], host_memory=up[1])
        self.applied[name] = want  # type: ignore[assignment]

    def _update(self, name: str, new: NodeView | None) -> bool:
        """Move one row to ``new``; False when only a rebuild can (node set / devices changed)."""
        old = self.used.get(name)
        if old is None or new is None or new.state is None or not self._same_devices(old, new):
            return old is None and (new is None or new.state is None)  # a node we never placed on: no row
        assert self.fleet is not None
        went = [g for u, g in old.ledger.entries.items() if new.ledger.entries.get(u) != g]
        came = [g for u, g in new.ledger.entries.items() if old.ledger.entries.get(u) != g]
        try:
            for g in went:
                for slices, whole in g.charges():
                    self.fleet.release(name, slices, exclusive=whole)
            for g in came:
                for slices, whole in g.charges():
                    self.fleet.apply(name, slices, exclusive=whole)
        except SpecError:
            return False
        self.used[name] = new
        return True

    def current(self) -> Fleet:
        """The fleet as of the latest views (call with :attr:`lock` held)."""
        if self.fleet is None:
            self._rebuild()
        else:
            version, changed = self.views.changes_since(self.version)
            if changed:
                if not all(self._update(n, v) for n, v in changed.items()):
                    self._rebuild()
                else:
                    self.version = version
            if self.usage is not None:
                self.usage_version, moved = self.usage.changes_since(self.usage_version)
                for name, want in moved.items():
                    if name in self.used:
                        self._set_usage(name, want)
        assert self.fleet is not None
        return self.fleet


class NodeCache:
    """The cluster's nodes for ``nodeCacheCapable: true`` (the scheduler sends names only): list once,
    then watch (or poll every ``poll_interval`` when the API has no watch). Keeps parsed views."""

    def __init__(self, api: KubeAPI, views: ViewCache | None = None, poll_interval: float = 2.0):
        self.api = api
        self.views = views or ViewCache()
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def refresh(self) -> str:
        items, rv = self.api.list_nodes()
        seen = set()
        for n in items:
            self.views.view(n)
            seen.add((n.get("metadata") or {}).get("name"))
        for name in self.views.names():
            if name not in seen:
                self.views.forget(name)
        self.synced.set()
        return rv

    def put(self, node: Mapping[str, Any]) -> None:
        self.views.view(node)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuslice-node-cache", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        follow("node cache", self.refresh, getattr(self.api, "watch_nodes", None), self._event, self._stop,
               self.poll_interval)

    def _event(self, kind: str, node: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self.views.view(node)
        elif kind == "DELETED":
            self.views.forget((node.get("metadata") or {}).get("name", ""))


def sum_grants(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per device UUID: granted memory, compute and slices over all nodes' ledgers (for checks/tests)."""
    out: dict[str, dict[str, int]] = {}
    for node in nodes:
        view = view_of(node)
        for g in view.ledger.entries.values():
            for s in g.slices():
                d = out.setdefault(s.device_uuid, {"memory": 0, "compute": 0, "slices": 0})
                d["memory"] += s.memory_limit
                d["compute"] += s.compute
                d["slices"] += 1
    return out
