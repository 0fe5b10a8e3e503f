"""The scheduler extender: kube-scheduler's ``filter``, ``prioritize`` and ``bind`` over the placement core.

Wire format (``k8s.io/kube-scheduler/extender/v1``; the Go structs carry no JSON tags, so the keys are
the Go field names — decoding here is case-insensitive, like Go's):

* ``POST /filter``      ExtenderArgs ``{"Pod": {...}, "Nodes": {"items": [...]}}`` or ``{"Pod", "NodeNames"}``
                        -> ExtenderFilterResult ``{"Nodes"|"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}``
* ``POST /prioritize``  ExtenderArgs -> HostPriorityList ``[{"Host": "n1", "Score": 0..10}]``
* ``POST /bind``        ExtenderBindingArgs ``{"PodName", "PodNamespace", "PodUID", "Node"}`` -> ``{"Error": ""}``

State lives in the API server, never only here: a node's grants are the ``gpuslice.io/ledger``
annotation on the Node, changed by ``bind`` only through a merge patch that carries the node's
resourceVersion. Two binds racing for the same node (threads, replicas, or a restarted extender) cannot
both commit: the loser gets 409, re-reads, and places again on what is really left. After the ledger
commit, bind writes the pod's ``gpuslice.io/grant`` (UID precondition) and POSTs the binding subresource;
if either fails the ledger entry is taken back. Entries whose pod is gone, finished, bound elsewhere, or
still unbound long after its bind (a crash between commit and binding) are collected by
:meth:`Extender.collect_garbage`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from gpuslice.errors import GpusliceError
from gpuslice.kube import alloclock, codec
from gpuslice.kube.api import Conflict, KubeAPI, KubeError, NotFound, update_node_annotations
from gpuslice.placement import Fleet, NodeState, NoFit, PlacementPolicy, apply, filter_nodes, place, score_nodes
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.extender")

MAX_EXTENDER_PRIORITY = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


class BadRequest(GpusliceError):
    """The payload is not what the endpoint takes: answered with HTTP 400 and this message."""


# ---------------------------------------------------------------------------------------- payloads
def _ci(obj: Mapping[str, Any], name: str) -> Any:
    """Go's encoding/json matches keys case-insensitively; so do we."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def node_shape_problem(node: Any) -> str:
    """What makes ``node`` not a Node object we can read ('' when its shape is fine): the parts the
    extender reads must have the API server's types, else the request is answered 400, not 500."""
    if not isinstance(node, dict):
        return "must be a Node object"
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        return "metadata must be an object"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return "metadata.name must be a non-empty string"
    anns = meta.get("annotations")
    if anns is not None and not isinstance(anns, dict):
        return f"metadata.annotations of node {name} must be an object of strings (got {type(anns).__name__})"
    bad = [k for k, v in (anns or {}).items() if not isinstance(v, str)]
    if bad:
        return f"metadata.annotations[{bad[0]}] of node {name} must be a string"
    rv = meta.get("resourceVersion")
    if rv is not None and not isinstance(rv, str):
        return f"metadata.resourceVersion of node {name} must be a string"
    return ""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    nodes: list[dict[str, Any]] | None  # full Node objects (nodeCacheCapable: false)
    node_names: list[str]               # candidate names, in the scheduler's order

    @classmethod
    def parse(cls, body: Any) -> "ExtenderArgs":
        if not isinstance(body, dict):
            raise BadRequest("ExtenderArgs must be a JSON object with Pod and Nodes or NodeNames")
        pod = _ci(body, "Pod")
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            raise BadRequest("ExtenderArgs.Pod must be a Pod object with metadata")
        problem = codec.pod_shape_problem(pod)
        if problem:
            raise BadRequest(f"ExtenderArgs.Pod.{problem}")
        nodes_doc = _ci(body, "Nodes")
        names_doc = _ci(body, "NodeNames")
        nodes = None
        if nodes_doc is not None:
            items = nodes_doc.get("items") if isinstance(nodes_doc, dict) else None
            if not isinstance(items, list):
                raise BadRequest("ExtenderArgs.Nodes must be a NodeList: {\"items\": [Node with metadata.name]}")
            for k, n in enumerate(items):
                problem = node_shape_problem(n)
                if problem:
                    raise BadRequest(f"ExtenderArgs.Nodes.items[{k}].{problem}")
            nodes = items
            names = [n["metadata"]["name"] for n in items]
        elif names_doc is not None:
            if not isinstance(names_doc, list) or not all(isinstance(n, str) for n in names_doc):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
            names = list(names_doc)
        else:
            raise BadRequest("ExtenderArgs needs Nodes (a NodeList) or NodeNames (a list of names)")
        return cls(pod=pod, nodes=nodes, node_names=names)


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def parse(cls, body: Any) -> "BindingArgs":
        if not isinstance(body, dict):
            raise BadRequest("ExtenderBindingArgs must be a JSON object with PodName, PodNamespace, PodUID, Node")
        values = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = _ci(body, key)
            if not isinstance(v, str) or not v:
                raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string (got {v!r})")
            values[key] = v
        return cls(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


# ---------------------------------------------------------------------------------------- node views
@dataclass(frozen=True)
class NodeView:
    """One node as the extender sees it: parsed annotations and the base placement state."""

    name: str
    resource_version: str
    devices: codec.NodeDevices | None
    ledger: codec.Ledger
    state: NodeState | None
    problem: str = ""  # why the node cannot take GPU pods (no or bad annotations)
    allocating: frozenset[str] = frozenset()  # the allocation lock's holders (gpuslice.io/allocating)


def view_of(node: Mapping[str, Any]) -> NodeView:
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    rv = str(meta.get("resourceVersion", ""))
    anns = meta.get("annotations") or {}
    if codec.NODE_DEVICES not in anns:
        return NodeView(name, rv, None, codec.Ledger({}), None,
                        f"node publishes no gpuslice devices (annotation {codec.NODE_DEVICES} is missing; "
                        "is the gpuslice agent running there?)")
    try:
        devices = codec.decode_node_devices(anns[codec.NODE_DEVICES])
        ledger = codec.decode_ledger(anns.get(codec.NODE_LEDGER), name)
        allocating = codec.decode_allocating(anns.get(codec.NODE_ALLOCATING))
        state = codec.node_state(name, devices, ledger)
    except SpecError as exc:
        return NodeView(name, rv, None, codec.Ledger({}), None, f"node annotations are unreadable: {exc}")
    return NodeView(name, rv, devices, ledger, state, allocating=allocating)


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

    def __init__(self, views: ViewCache):
        self.views = views
        self.lock = threading.Lock()
        self.fleet: Fleet | None = None
        self.used: dict[str, NodeView] = {}
        self.version = -1
        self.rebuilds = 0

    @staticmethod
    def _same_devices(a: NodeView, b: NodeView) -> bool:
        da, db = a.devices, b.devices
        assert da is not None and db is not None
        return (da.devices == db.devices and dict(da.health) == dict(db.health)
                and da.split_count == db.split_count and da.memory_scaling == db.memory_scaling)

    def _rebuild(self) -> None:
        self.version, views = self.views.snapshot()
        self.used = {n: v for n, v in views.items() if v.state is not None}
        self.fleet = Fleet([v.state for v in self.used.values()])  # type: ignore[misc]
        self.rebuilds += 1

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
                for c in g.containers:
                    self.fleet.release(name, c.slices, exclusive=c.exclusive)
            for g in came:
                for c in g.containers:
                    self.fleet.apply(name, c.slices, exclusive=c.exclusive)
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
        watch = getattr(self.api, "watch_nodes", None)
        while not self._stop.is_set():
            try:
                rv = self.refresh()
                if watch is None:
                    self._stop.wait(self.poll_interval)
                    continue
                for kind, node in watch(rv):
                    if self._stop.is_set():
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        self.views.view(node)
                    elif kind == "DELETED":
                        self.views.forget((node.get("metadata") or {}).get("name", ""))
                    elif kind == "ERROR":
                        break
            except Exception as exc:  # the API server restarts, a watch expires: relist
                log.warning("node cache: %s; relisting", exc)
                self._stop.wait(min(self.poll_interval, 1.0))


def extender_scores(scores: Mapping[str, float], names: Iterable[str]) -> list[dict[str, Any]]:
    """Placement's 0..100 node scores as kube-scheduler's 0..10 extender priorities: the placement
    core's own choice (the highest score; all of them if several tie exactly) alone gets 10, the others
    at most 9. Rounding alone would give 10 to every node within 5 points of the best, and kube-scheduler
    breaks ties at random — which undoes ``fgd``'s fixed tie order, the thing that keeps whole nodes
    free for large tasks (gpuslice.placement docs). Nodes placement did not score get 0."""
    top = max(scores.values(), default=None)
    out = []
    for n in names:
        s = scores.get(n)
        if s is None:
            points = 0
        elif s == top:
            points = MAX_EXTENDER_PRIORITY
        else:
            points = min(MAX_EXTENDER_PRIORITY - 1, int(round(s * (MAX_EXTENDER_PRIORITY - 1) / 100)))
        out.append({"Host": n, "Score": points})
    return out


# ---------------------------------------------------------------------------------------- extender
class Extender:
    """filter / prioritize / bind. ``api`` may be ``None`` for a filter-and-prioritize-only extender fed
    full Node objects (benchmarks, dry runs); ``bind`` and ``NodeNames`` need it."""

    def __init__(self, api: KubeAPI | None, cfg: codec.KubeConfig | None = None, *,
                 cache: NodeCache | None = None, bind_retries: int = 16, gc_grace: float = 60.0, use_index: bool = True,
                 stale_after: float = 0.0, allocation_timeout: float = alloclock.DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.time):
        self.api = api
        self.cfg = cfg or codec.KubeConfig()
        self.cache = cache
        self.views = cache.views if cache else ViewCache()
        self.index = FleetIndex(self.views)
        self.use_index = use_index
        self.stale_after = stale_after  # seconds without a devices publication before a node is skipped (0: never)
        if allocation_timeout < 0:
            raise SpecError("allocation_timeout", allocation_timeout, "seconds, 0 (no allocation lock) or more")
        self.allocation_timeout = allocation_timeout  # see gpuslice.kube.alloclock (0: lock off)
        self.bind_retries = bind_retries
        self.gc_grace = gc_grace
        self.clock = clock
        self._node_locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._kinds: tuple[int, frozenset[tuple[str, str]]] = (-1, frozenset())

    # ------------------------------------------------------------------------------------ helpers
    def _views_for(self, args: ExtenderArgs) -> list[NodeView]:
        if args.nodes is not None:
            return [self.views.view(n) for n in args.nodes]
        out = []
        for name, v in zip(args.node_names, self.views.get_many(args.node_names)):
            if v is None and self.api is not None:
                try:
                    v = self.views.view(self.api.get_node(name))
                except KubeError as exc:
                    v = NodeView(name, "", None, codec.Ledger({}), None, f"cannot read node: {exc}")
            if v is None:
                v = NodeView(name, "", None, codec.Ledger({}), None, "node unknown to the extender's cache")
            out.append(v)
        return out

    def _gpu_kinds(self) -> frozenset[tuple[str, str]]:
        """(model, name) of every device kind the extender knows, for HAMi's use-gputype substrings."""
        version, views = self.views.snapshot()
        if self._kinds[0] != version:
            kinds: set[tuple[str, str]] = set()
            for v in views.values():
                if v.devices is not None:
                    kinds |= codec.device_kinds(v.devices.devices)
            self._kinds = (version, frozenset(kinds))
        return self._kinds[1]

    def _policy(self, req: codec.PodRequest) -> PlacementPolicy:
        return req.policy or self.cfg.policy

    @staticmethod
    def _state_for(view: NodeView, req: codec.PodRequest) -> NodeState:
        assert view.state is not None and view.devices is not None
        if not (req.avoid_models or req.avoid_uuids or req.use_uuids):
            return view.state
        blocked = codec.blocked_devices(view.devices, req)
        return codec.node_state(view.name, view.devices, view.ledger, blocked=blocked)

    def _fit(self, req: codec.PodRequest, views: list[NodeView],
             pod_uid: str = "") -> tuple[list[str], dict[str, str], dict[str, NodeState]]:
        """(fitting names in the caller's order, {name: why not}, {name: state} of the fitting ones)."""
        failed: dict[str, str] = {v.name: v.problem for v in views if v.state is None}
        live = [v for v in views if v.state is not None]
        if not live:
            return [], failed, {}
        first = req.containers[0].request
        states: dict[str, NodeState] = {}
        if self._indexed(req):
            with self.index.lock:
                fleet = self.index.current()
                ok, why = filter_nodes(first, fleet)
                wanted = {v.name for v in live}
                failed.update({n: r for n, r in why.items() if n in wanted})
                ok_set = set(ok) & wanted
                if len(req.containers) > 1:
                    states = {n: fleet.node_state(n) for n in ok_set}
        else:
            for v in live:
                try:
                    states[v.name] = self._state_for(v, req)
                except SpecError as exc:
                    failed[v.name] = f"node annotations are unreadable: {exc}"
            ok, why = filter_nodes(first, list(states.values()))
            failed.update(why)
            ok_set = set(ok)
        for v in live:
            # A stale device list outranks any other reason; the lock only matters where the pod fits.
            stale = self._stale_devices(v) or (self._still_locked(v, req, pod_uid) if v.name in ok_set else "")
            if stale:
                ok_set.discard(v.name)
                failed[v.name] = stale
        if len(req.containers) > 1:  # every container must fit, each after the ones before it
            for name in list(ok_set):
                try:
                    self._place_all(req, states[name])
                except NoFit as exc:
                    ok_set.discard(name)
                    failed[name] = exc.reason
        fitting = [v.name for v in views if v.name in ok_set]
        return fitting, failed, {n: states[n] for n in fitting if n in states}

    def _stale_devices(self, view: NodeView) -> str:
        """Why the node's device list is too old to trust ('' when fresh or when ageing is off)."""
        if not self.stale_after or view.devices is None:
            return ""
        age = self.clock() - view.devices.updated
        if age <= self.stale_after:
            return ""
        return (f"the gpuslice agent has not published {codec.NODE_DEVICES} for {age:.0f} s "
                f"(more than {self.stale_after:g} s); is it running?")

    def _locked(self, view: NodeView, req: codec.PodRequest, pod_uid: str) -> str:
        """Why the node's allocation lock keeps this pod away ('' when it does not)."""
        if not view.allocating or not self.allocation_timeout:
            return ""
        now = self.clock()
        held = alloclock.blockers(view.ledger, view.allocating, pod_uid, req.device_counts, now,
                                  self.allocation_timeout)
        return alloclock.reason(held[0], now) if held else ""

    def _still_locked(self, view: NodeView, req: codec.PodRequest, pod_uid: str) -> str:
        """The lock's reason, confirmed by a fresh read of the Node when the watch-fed view says locked.

        The device plugin releases the lock by a Node update; kube-scheduler retries the waiting pod
        on that event, possibly before this extender's own watch has delivered it. Refusing on the
        stale view would leave the pod waiting for some later Node event, so a blocking lock is
        checked against the API server (a quorum read). Locks last from bind to Allocate, so this
        read happens for few nodes and only while a lock is held."""
        why = self._locked(view, req, pod_uid)
        if not why or self.api is None:
            return why
        try:
            fresh = self.views.view(self.api.get_node(view.name))
        except KubeError:
            return why  # keep the cached answer: refusing is the safe side of a lock
        return self._locked(fresh, req, pod_uid) if fresh.state is not None else why

    def _indexed(self, req: codec.PodRequest) -> bool:
        """The shared fleet serves pods without per-pod device exclusions."""
        return self.use_index and not (req.avoid_models or req.avoid_uuids or req.use_uuids)

    def _place_all(self, req: codec.PodRequest, state: NodeState) -> list[tuple[codec.ContainerRequest, Any]]:
        policy = self._policy(req)
        out = []
        for c in req.containers:
            try:
                p = place(c.request, [state], policy)
            except NoFit as exc:
                raise NoFit(f"container {c.name}: {exc.reason}", exc.per_node) from None
            state = apply(state, p.slices, exclusive=p.exclusive)
            out.append((c, p))
        return out

    # ------------------------------------------------------------------------------------ filter
    def filter(self, body: Any) -> dict[str, Any]:
        args = ExtenderArgs.parse(body)
        try:
            req = codec.pod_request(args.pod, self.cfg)
        except SpecError as exc:
            return self._filter_result(args, [], {}, error=f"gpuslice: {exc}")
        if req.empty:  # not a GPU-slice pod: nothing to say
            return self._filter_result(args, list(args.node_names), {})
        views = self._views_for(args)
        req = codec.resolve_gpu_types(req, self._gpu_kinds())
        fitting, failed, _ = self._fit(req, views, str(args.pod["metadata"].get("uid") or ""))
        return self._filter_result(args, fitting, failed)

    @staticmethod
    def _filter_result(args: ExtenderArgs, fitting: list[str], failed: Mapping[str, str],
                       error: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {"FailedNodes": dict(failed), "FailedAndUnresolvableNodes": {}, "Error": error}
        if args.nodes is not None:
            keep = set(fitting)
            out["Nodes"] = {"metadata": {}, "items": [n for n in args.nodes if n["metadata"]["name"] in keep]}
            out["NodeNames"] = None
        else:
            out["NodeNames"] = list(fitting)
            out["Nodes"] = None
        return out

    # ------------------------------------------------------------------------------------ prioritize
    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        args = ExtenderArgs.parse(body)
        try:
            req = codec.pod_request(args.pod, self.cfg)
        except SpecError:
            return [{"Host": n, "Score": 0} for n in args.node_names]
        if req.empty:
            return [{"Host": n, "Score": 0} for n in args.node_names]
        views = self._views_for(args)
        req = codec.resolve_gpu_types(req, self._gpu_kinds())
        scores: dict[str, float] = {}
        first = req.containers[0].request
        if self._indexed(req) and len(req.containers) == 1:
            with self.index.lock:
                scores = score_nodes(first, self.index.current(), self._policy(req))
        else:
            fitting, _, _ = self._fit(req, views, str(args.pod["metadata"].get("uid") or ""))
            states = {v.name: self._state_for(v, req) for v in views if v.name in set(fitting)}
            if fitting:
                scores = score_nodes(first, [states[n] for n in fitting], self._policy(req))
        return extender_scores(scores, args.node_names)

    # ------------------------------------------------------------------------------------ bind
    def _lock(self, node: str) -> threading.Lock:
        with self._locks_lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def bind(self, body: Any) -> dict[str, Any]:
        args = BindingArgs.parse(body)
        if self.api is None:
            return {"Error": "gpuslice: this extender has no API-server connection; it cannot bind"}
        try:
            self.bind_pod(args)
        except (GpusliceError, SpecError) as exc:
            log.info("bind %s/%s -> %s refused: %s", args.pod_namespace, args.pod_name, args.node, exc)
            return {"Error": f"gpuslice: {exc}"}
        return {"Error": ""}

    def bind_pod(self, args: BindingArgs) -> codec.PodGrant | None:
        """Commit a grant for the pod on ``args.node`` and bind it; raise with the reason on refusal."""
        api = self.api
        assert api is not None
        try:
            pod = api.get_pod(args.pod_namespace, args.pod_name)
        except NotFound:
            raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} no longer exists") from None
        meta = pod.get("metadata") or {}
        if meta.get("uid") != args.pod_uid:
            raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} was recreated (uid {meta.get('uid')}, "
                            f"scheduler asked for {args.pod_uid})")
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to and bound_to != args.node:
            raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} is already bound to {bound_to}")
        req = codec.pod_request(pod, self.cfg)
        if req.empty:
            if not bound_to:
                api.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
            return None
        if bound_to:  # a repeated bind of a pod already bound here: only ours, and only once
            view = view_of(api.get_node(args.node))
            entry = view.ledger.entries.get(args.pod_uid)
            if entry is None:
                raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} is already bound to {bound_to} "
                                f"without a gpuslice grant")
            return entry
        with self._lock(args.node):
            grant = self._commit(args, req)
        try:
            self._annotate(args, grant, str(meta.get("resourceVersion") or ""))
            api.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except KubeError as exc:
            # Another bind of the same pod may have won (a retried or concurrent scheduler call), or the
            # binding landed and only its answer was lost: settle the annotation on what is really bound.
            bound = self._settle_annotation(args, grant)
            if bound == args.node:
                self._release_elsewhere(args.pod_uid, args.node)
                return grant  # bound here with this grant after all: keep the ledger entry
            if bound is None:  # cannot tell: keeping the entry is safe, garbage collection decides later
                raise KubeError(f"binding {args.pod_namespace}/{args.pod_name} to {args.node} failed and the pod "
                                f"cannot be read; its grant stays until garbage collection: {exc}", exc.status) from exc
            self._take_back(args.node, args.pod_uid)
            raise KubeError(f"binding {args.pod_namespace}/{args.pod_name} to {args.node} failed; "
                            f"grant taken back: {exc}", exc.status) from exc
        self._release_elsewhere(args.pod_uid, args.node)
        return grant

    def _annotate(self, args: BindingArgs, grant: codec.PodGrant, resource_version: str) -> None:
        """Write the pod's ``gpuslice.io/grant`` only onto a pod state this bind has seen (resourceVersion
        precondition): never after the pod got bound (by a concurrent bind of the same pod elsewhere), so
        a losing bind cannot leave its grant on a pod bound with another."""
        api = self.api
        assert api is not None
        changes = {codec.POD_GRANT: codec.encode_pod_grant(grant), codec.POD_ALLOCATED: None}
        for _ in range(self.bind_retries):
            try:
                api.patch_pod_annotations(args.pod_namespace, args.pod_name, changes, uid=args.pod_uid,
                                          resource_version=resource_version or None)
                return
            except Conflict:
                pod = api.get_pod(args.pod_namespace, args.pod_name)
                meta = pod.get("metadata") or {}
                if meta.get("uid") != args.pod_uid:
                    raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} was recreated", 409) from None
                bound = (pod.get("spec") or {}).get("nodeName")
                if bound:
                    raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} was bound to {bound} meanwhile",
                                    409) from None
                resource_version = str(meta.get("resourceVersion") or "")  # unbound: it changed otherwise
        raise KubeError(f"pod {args.pod_namespace}/{args.pod_name} kept changing while its grant was written")

    def _settle_annotation(self, args: BindingArgs, grant: codec.PodGrant) -> str | None:
        """After a failed binding: make the pod's ``gpuslice.io/grant`` say what its binding says. Bound
        (to any node): the grant of that node's ledger; unbound: this bind's grant removed. Returns the
        node the pod is bound to ('' if none or gone; ``None`` when the pod cannot be read)."""
        api = self.api
        assert api is not None
        bound: str | None = None
        for _ in range(self.bind_retries):
            try:
                pod = api.get_pod(args.pod_namespace, args.pod_name)
            except NotFound:
                return ""
            except KubeError:
                return bound
            meta = pod.get("metadata") or {}
            if meta.get("uid") != args.pod_uid:
                return ""
            bound = str((pod.get("spec") or {}).get("nodeName") or "")
            shown = (meta.get("annotations") or {}).get(codec.POD_GRANT)
            mine = codec.encode_pod_grant(grant)
            if bound == args.node:
                want: str | None = mine
            elif bound:
                try:
                    entry = view_of(api.get_node(bound)).ledger.entries.get(args.pod_uid)
                except KubeError:
                    entry = None
                want = codec.encode_pod_grant(entry) if entry is not None else (None if shown == mine else shown)
            else:
                want = None if shown == mine else shown  # another bind's grant in flight: not ours to remove
            if want == shown:
                return bound
            try:
                api.patch_pod_annotations(args.pod_namespace, args.pod_name, {codec.POD_GRANT: want},
                                          uid=args.pod_uid, resource_version=str(meta.get("resourceVersion") or ""))
                return bound
            except Conflict:
                continue
            except KubeError as exc:
                log.error("pod %s/%s: settling %s failed: %s", args.pod_namespace, args.pod_name, codec.POD_GRANT, exc)
                return bound
        return bound

    def _commit(self, args: BindingArgs, req: codec.PodRequest) -> codec.PodGrant:
        api = self.api
        assert api is not None
        last = ""
        for attempt in range(self.bind_retries):
            node = api.get_node(args.node)
            view = view_of(node)
            if view.state is None or view.devices is None:
                raise KubeError(f"node {args.node}: {view.problem}")
            stale = self._stale_devices(view)
            if stale:
                raise KubeError(f"node {args.node}: {stale}")
            existing = view.ledger.entries.get(args.pod_uid)
            if existing is not None:  # our own earlier attempt committed (retry after a crash / timeout)
                return existing
            state = self._state_for(view, req)
            try:
                placed = self._place_all(codec.resolve_gpu_types(req, codec.device_kinds(view.devices.devices)), state)
            except NoFit as exc:
                raise KubeError(f"node {args.node} cannot take pod {args.pod_namespace}/{args.pod_name}: "
                                f"{exc.reason}") from None
            holders = self._lock_holders(args, req, view)  # after placement: "cannot take" is the lasting reason
            grant = codec.PodGrant(
                node=args.node, pod_uid=args.pod_uid, namespace=args.pod_namespace, pod=args.pod_name,
                containers=tuple(codec.ContainerGrant(c.name, codec.grant_id_for(args.pod_uid, c.name),
                                                      p.slices, p.exclusive) for c, p in placed),
                bound_at=self.clock())
            changes = {codec.NODE_LEDGER: codec.encode_ledger(view.ledger.with_entry(grant))}
            if self.allocation_timeout:
                # The lock is taken in the same conditioned write as the capacity: two binds cannot both
                # see the node free of a same-count holder and both commit.
                changes[codec.NODE_ALLOCATING] = codec.encode_allocating(holders | {args.pod_uid})
            try:
                updated = api.patch_node_annotations(args.node, changes, resource_version=view.resource_version)
            except Conflict as exc:
                last = str(exc)
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
                continue
            self.views.view(updated)
            return grant
        raise KubeError(f"node {args.node} kept changing under {self.bind_retries} bind attempts ({last})")

    def _lock_holders(self, args: BindingArgs, req: codec.PodRequest, view: NodeView) -> frozenset[str]:
        """The node's allocation-lock holders to keep when this pod commits; raises (bind refused) while
        another pod still waits for Allocate with a container of one of this pod's device counts. A holder
        is checked against its pod (one GET): one that is gone, finished, deleted, bound elsewhere or
        already allocated no longer holds the lock (the device plugin's release may have been lost)."""
        api = self.api
        assert api is not None
        now = self.clock()
        keep = alloclock.live_holders(view.ledger, view.allocating, now, self.allocation_timeout)
        for entry in alloclock.blockers(view.ledger, keep, args.pod_uid, req.device_counts, now,
                                        self.allocation_timeout):
            pod = None
            if entry.namespace and entry.pod:
                try:
                    pod = api.get_pod(entry.namespace, entry.pod)
                except NotFound:
                    pod = None
            why = alloclock.released(pod, entry)
            if not why:
                raise KubeError(f"node {args.node} is {alloclock.reason(entry, now)}")
            log.info("node %s: pod %s/%s no longer holds the allocation lock (%s)", args.node, entry.namespace,
                     entry.pod, why)
            keep = keep - {entry.pod_uid}
        return keep

    def _update_ledger(self, node_name: str,
                       change: Callable[[codec.Ledger, frozenset[str]], tuple[codec.Ledger, frozenset[str]]]) -> bool:
        """Apply ``change`` to the node's (ledger, allocation-lock holders) with a resourceVersion
        precondition; True if it changed anything."""
        api = self.api
        assert api is not None

        def annotations(anns: Mapping[str, str]) -> dict[str, str | None]:
            ledger = codec.decode_ledger(anns.get(codec.NODE_LEDGER), node_name)
            allocating = codec.decode_allocating(anns.get(codec.NODE_ALLOCATING))
            new, new_allocating = change(ledger, allocating)
            changes: dict[str, str | None] = {}
            if dict(new.entries) != dict(ledger.entries):
                changes[codec.NODE_LEDGER] = codec.encode_ledger(new)
            if new_allocating != allocating:
                changes[codec.NODE_ALLOCATING] = codec.encode_allocating(new_allocating)
            return changes

        try:
            updated = update_node_annotations(api, node_name, annotations, self.bind_retries)
        except NotFound:
            return False
        except SpecError as exc:
            log.error("node %s: %s", node_name, exc)
            return False
        except Conflict:
            log.error("node %s: ledger kept changing; will retry at the next collection", node_name)
            return False
        if updated is None:
            return False
        self.views.view(updated)
        return True

    def _take_back(self, node: str, pod_uid: str) -> None:
        try:
            with self._lock(node):
                self._update_ledger(node, lambda led, alloc: (led.without([pod_uid]), alloc - {pod_uid}))
        except KubeError as exc:  # garbage collection will take it back later
            log.error("taking back the grant of pod %s on %s failed: %s", pod_uid, node, exc)

    def _release_elsewhere(self, pod_uid: str, node: str) -> None:
        """A pod bound here may hold a stale entry elsewhere (an earlier attempt bound nowhere)."""
        for name in self.views.names():
            v = self.views.get(name)
            if name != node and v is not None and pod_uid in v.ledger.entries:
                self._take_back(name, pod_uid)

    # ------------------------------------------------------------------------------------ garbage
    def collect_garbage(self) -> int:
        """Take back ledger entries whose pod is gone, finished, bound to another node, or unbound for
        longer than ``gc_grace`` after its bind; drop allocation-lock holders that no longer hold it.
        Returns how many ledger entries were removed."""
        api = self.api
        assert api is not None
        started = self.clock()
        # From the API server's watch cache: an entry is only taken back when its pod has been gone
        # for 30 s or unbound for gc_grace, far longer than the cache can lag.
        pods = {(p.get("metadata") or {}).get("uid"): p for p in api.list_pods(resource_version="0")}
        nodes, _ = api.list_nodes()
        removed = 0
        for node in nodes:
            name = (node.get("metadata") or {}).get("name", "")
            anns = (node.get("metadata") or {}).get("annotations") or {}
            try:
                ledger = codec.decode_ledger(anns.get(codec.NODE_LEDGER), name)
                allocating = codec.decode_allocating(anns.get(codec.NODE_ALLOCATING))
            except SpecError as exc:
                log.error("node %s: %s", name, exc)
                continue
            stale = {uid for uid, g in ledger.entries.items() if self._stale(uid, g, name, pods, started)}
            kept = ledger.without(stale)
            loose = {uid for uid in allocating if self._loose(uid, kept, pods, started)}
            if stale or loose:
                def drop(led: codec.Ledger, alloc: frozenset[str], stale: set[str] = stale, loose: set[str] = loose,
                         name: str = name) -> tuple[codec.Ledger, frozenset[str]]:
                    # re-check against the fresh node: only what is still stale / loose there (a bind may
                    # have committed since the list)
                    led = led.without(u for u in stale if u in led.entries
                                      and self._stale(u, led.entries[u], name, pods, started))
                    return led, frozenset(u for u in alloc if not (u in loose and self._loose(u, led, pods, started)))
                with self._lock(name):
                    if self._update_ledger(name, drop):
                        removed += len(stale)
        return removed

    def _loose(self, uid: str, ledger: codec.Ledger, pods: Mapping[str, Any], started: float) -> bool:
        """Whether an allocation-lock holder no longer holds the lock: no ledger entry, timed out (or the
        lock is off), or its pod (from the list) released it — a pod missing from the list only after
        the same 30 s as its ledger entry (the list comes from the watch cache)."""
        entry = ledger.entries.get(uid)
        if entry is None or not self.allocation_timeout or entry.bound_at < started - self.allocation_timeout:
            return True
        pod = pods.get(uid)
        if pod is None:
            return entry.bound_at < started - min(self.gc_grace, 30.0)
        return bool(alloclock.released(pod, entry))

    def _stale(self, uid: str, grant: codec.PodGrant, node: str, pods: Mapping[str, Any], started: float) -> bool:
        old = grant.bound_at < started - self.gc_grace
        pod = pods.get(uid)
        if pod is None:
            return grant.bound_at < started - min(self.gc_grace, 30.0)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return True
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and bound != node:
            return True
        return not bound and old


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
