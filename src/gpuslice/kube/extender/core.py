"""The extender's filter and prioritize over the placement core; bind and garbage collection are mixed in
from :mod:`~gpuslice.kube.extender.bind` and :mod:`~gpuslice.kube.extender.gc`."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Mapping

from gpuslice.kube import alloclock, formats, nodestate, podrequest, quota, resources
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.kube.extender.bind import BindTransaction
from gpuslice.kube.extender.cache import FleetIndex, NodeCache, NodeView, ViewCache
from gpuslice.kube.extender import podplace
from gpuslice.kube.extender.gc import GarbageCollection
from gpuslice.kube.extender.usage import PodUsage, pod_requests
from gpuslice.kube.extender.wire import ExtenderArgs, extender_scores
from gpuslice.placement import NodeState, NoFit, PlacementPolicy, TaskShape, Workload, WorkloadMix, filter_nodes, score_nodes
from gpuslice.spec import SpecError


class Extender(BindTransaction, GarbageCollection):
    """filter / prioritize / bind. ``api`` may be ``None`` for a filter-and-prioritize-only extender fed
    full Node objects (benchmarks, dry runs); ``bind`` and ``NodeNames`` need it."""

    def __init__(self, api: KubeAPI | None, cfg: resources.KubeConfig | None = None, *,
                 cache: NodeCache | None = None, bind_retries: int = 16, gc_grace: float = 60.0, use_index: bool = True,
                 stale_after: float = 0.0, allocation_timeout: float = alloclock.DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.time, quotas: bool = True, usage: PodUsage | None = None):
        self.api = api
        self.cfg = cfg or resources.KubeConfig()
        self.cache = cache
        self.views = cache.views if cache else ViewCache()
        self.usage = usage  # CPU / memory the pods on each node request (FGD and best-fit weigh it)
        self.index = FleetIndex(self.views, usage)
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
        # Namespace GPU quotas (gpuslice.kube.quota), read through the API: none without one.
        self.quota = quota.QuotaBook(api, self.cfg) if api is not None and quotas else None
        # FGD's target workload, learnt from the pods as they arrive (first filter of a pod UID), as the
        # simulator learns it from arrivals (gpuslice.placement.mix). In memory only: a restarted extender
        # learns again (the first few hundred pods).
        self.mix = WorkloadMix()
        self._arrived: OrderedDict[str, None] = OrderedDict()
        self._mix_lock = threading.Lock()
        if usage is not None:
            usage.on_pod = self._observe_pod  # every new pod arrives, whether or not kube-scheduler asks us

    def granted(self) -> list[formats.PodGrant]:
        """Every grant the known node ledgers hold (what namespace quotas count)."""
        _, views = self.views.snapshot()
        return [g for v in views.values() for g in v.ledger.entries.values()]

    def _quota_problem(self, pod: Mapping[str, Any], req: podrequest.PodRequest) -> str:
        """Why the pod's namespace quota keeps it from every node ('' when it does not)."""
        if self.quota is None:
            return ""
        meta = pod.get("metadata") or {}
        return self.quota.check(str(meta.get("namespace") or "default"), self.granted, quota.request_usage(req),
                                skip=str(meta.get("uid") or ""))

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
                    v = NodeView(name, "", None, formats.Ledger({}), None, f"cannot read node: {exc}")
            if v is None:
                v = NodeView(name, "", None, formats.Ledger({}), None, "node unknown to the extender's cache")
            out.append(v)
        return out

    def _gpu_kinds(self) -> frozenset[tuple[str, str]]:
        """(model, name) of every device kind the extender knows, for HAMi's use-gputype substrings."""
        version, views = self.views.snapshot()
        if self._kinds[0] != version:
            kinds: set[tuple[str, str]] = set()
            for v in views.values():
                if v.devices is not None:
                    kinds |= podrequest.device_kinds(v.devices.devices)
            self._kinds = (version, frozenset(kinds))
        return self._kinds[1]

    def _policy(self, req: podrequest.PodRequest) -> PlacementPolicy:
        return req.policy or self.cfg.policy

    @staticmethod
    def _exclusions(view: NodeView, req: podrequest.PodRequest) -> dict[str, str]:
        """Devices of the node this pod may not take, each with the rule that keeps it away: the node's
        device cordon and the pod's own rules (use/nouse annotations, vgpu-mode, mutex). Keys are device
        or MIG instance UUIDs, or a card's UUID standing for its instances."""
        assert view.state is not None and view.devices is not None
        out = {u: "cordoned (hami.io/device-cordon)" for u in view.cordoned}
        if req.simple:
            return out
        bare = replace(req, use_uuids=(), avoid_uuids=(), avoid_models=(), mode="", use_indexes=(), avoid_indexes=())
        rules = (("not named by nvidia.com/use-gpuuuid", {"use_uuids": req.use_uuids}),
                 ("named by nvidia.com/nouse-gpuuuid", {"avoid_uuids": req.avoid_uuids}),
                 ("not named by nvidia.com/use-gpuindexes", {"use_indexes": req.use_indexes}),
                 ("named by nvidia.com/nouse-gpuindexes", {"avoid_indexes": req.avoid_indexes}),
                 ("of a type named by nvidia.com/nouse-gputype", {"avoid_models": req.avoid_models}),
                 ("MIG instance(s) (nvidia.com/vgpu-mode: hami-core)", {"mode": req.mode if req.mode == "hami-core" else ""}))
        for cause, only in rules:
            if any(only.values()):
                for u in podrequest.blocked_devices(view.devices, replace(bare, **only)):
                    out.setdefault(u, cause)
        if req.mutex:
            for u in podplace.in_use(view.state):
                out.setdefault(u, "in use (hami.io/gpu-scheduler-policy: mutex)")
        return out

    ARRIVALS_KEPT = 65536  # pod UIDs remembered so a pod filtered again (a retry) is counted once

    def _arrive(self, pod_uid: str, req: podrequest.PodRequest, demand: tuple[int, int]) -> None:
        """Count a pod's shapes in the learnt workload the first time it is seen (the pod's CPU with its first
        container's shape; host memory is not part of a shape, as in the simulator: it rarely binds, and every
        distinct amount would split a shape's count)."""
        if not pod_uid:
            return
        with self._mix_lock:
            if pod_uid in self._arrived:
                return
            self._arrived[pod_uid] = None
            if len(self._arrived) > self.ARRIVALS_KEPT:
                self._arrived.popitem(last=False)
            for k, c in enumerate(req.containers):
                self.mix.observe(TaskShape.of(c.request, cpu_milli=demand[0] if k == 0 else 0))

    def _observe_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod the watch shows being created: counted as an arrival, once, if it is a GPU pod for our scheduler
        that has not finished."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("schedulerName") != self.cfg.scheduler_name or status.get("phase") in ("Succeeded", "Failed"):
            return
        try:
            req = podrequest.pod_request(pod, self.cfg)
        except SpecError:
            return  # filter reports it on the pod
        if not req.empty:
            req = podrequest.resolve_gpu_types(req, self._gpu_kinds())
            self._arrive(str((pod.get("metadata") or {}).get("uid") or ""), req, pod_requests(pod))

    def _workload(self, policy: PlacementPolicy) -> Workload | None:
        if "fgd" not in (policy.node, policy.gpu):
            return None
        with self._mix_lock:
            return self.mix.workload()

    def _state_for(self, view: NodeView, req: podrequest.PodRequest) -> NodeState:
        """The node's placement state for this pod: its devices (minus the pod's excluded ones and cordoned
        ones), grants, and the CPU / memory its pods use."""
        state = view.state
        assert state is not None and view.devices is not None
        if not req.simple:
            blocked = set(self._exclusions(view, req))
            state = replace(nodestate.node_state(view.name, view.devices, view.ledger, blocked=blocked),
                            cpu_milli=state.cpu_milli, host_memory=state.host_memory)
        if self.usage is None:
            return state
        cpu, mem = self.usage.usage(view.name)
        return replace(state, cpu_used=min(cpu, state.cpu_milli) if state.cpu_milli is not None else 0,
                       host_memory_used=min(mem, state.host_memory) if state.host_memory is not None else 0)

    def _explain(self, view: NodeView, req: podrequest.PodRequest, reason: str) -> str:
        """A refusal with what the pod's rules and the cordon took away (placement only sees devices that
        take nothing new; without this it would blame their slice count)."""
        if view.state is None:
            return reason
        gone = self._exclusions(view, req)
        if not gone:
            return reason
        why = {d.uuid: gone.get(d.uuid) or gone.get(d.parent_uuid, "") for d in view.state.devices}
        causes = sorted({c for c in why.values() if c})
        if not causes:
            return reason
        shown = "; ".join(f"{sum(1 for c in why.values() if c == cause)} {cause}" for cause in causes)
        if all(why.values()):
            return f"no device of this node may take the pod: of its {len(why)} devices {shown}"
        return f"{reason} (of its {len(why)} devices {shown})"

    def _fit(self, req: podrequest.PodRequest, views: list[NodeView],
             pod_uid: str = "") -> tuple[list[str], dict[str, str], dict[str, NodeState]]:
        """(fitting names in the caller's order, {name: why not}, {name: state} of the fitting ones)."""
        failed: dict[str, str] = {v.name: v.problem for v in views if v.state is None}
        live = [v for v in views if v.state is not None]
        if not live:
            return [], failed, {}
        states: dict[str, NodeState] = {}
        if self._indexed(req):
            first = req.containers[0].request
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
            if req.simple:
                ok, why = filter_nodes(req.containers[0].request, list(states.values()))
                failed.update(why)
                ok_set = set(ok)
            else:  # node by node below: the pod's own rules, MIG instances, init containers, numa-bind
                ok_set = set(states)
        for v in live:
            # A stale device list outranks any other reason; the lock only matters where the pod fits.
            stale = self._stale_devices(v) or (self._still_locked(v, req, pod_uid) if v.name in ok_set else "")
            if stale:
                ok_set.discard(v.name)
                failed[v.name] = stale
        if len(req.containers) > 1 or not req.simple:  # every container must fit, each after the ones before it
            for name in list(ok_set):
                try:
                    self._place_all(req, states[name])
                except NoFit as exc:
                    ok_set.discard(name)
                    failed[name] = exc.reason
        by_name = {v.name: v for v in live}
        for name in list(failed):
            if name in by_name and by_name[name].state is not None and not self._stale_devices(by_name[name]):
                failed[name] = self._explain(by_name[name], req, failed[name])
        fitting = [v.name for v in views if v.name in ok_set]
        return fitting, failed, {n: states[n] for n in fitting if n in states}

    def _stale_devices(self, view: NodeView) -> str:
        """Why the node's device list is too old to trust ('' when fresh or when ageing is off)."""
        if not self.stale_after or view.devices is None:
            return ""
        age = self.clock() - view.devices.updated
        if age <= self.stale_after:
            return ""
        return (f"the gpuslice agent has not published {formats.NODE_DEVICES} for {age:.0f} s "
                f"(more than {self.stale_after:g} s); is it running?")

    def _locked(self, view: NodeView, req: podrequest.PodRequest, pod_uid: str) -> str:
        """Why the node's allocation lock keeps this pod away ('' when it does not)."""
        if not view.allocating or not self.allocation_timeout:
            return ""
        now = self.clock()
        held = alloclock.blockers(view.ledger, view.allocating, pod_uid, req.device_counts, now,
                                  self.allocation_timeout)
        return alloclock.reason(held[0], now) if held else ""

    def _still_locked(self, view: NodeView, req: podrequest.PodRequest, pod_uid: str) -> str:
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

    def _indexed(self, req: podrequest.PodRequest) -> bool:
        """The shared fleet serves pods without per-pod device rules, MIG instances or init containers."""
        return self.use_index and req.simple

    def _place_all(self, req: podrequest.PodRequest, state: NodeState,
                   demand: tuple[int, int] = (0, 0)) -> list[tuple[podrequest.ContainerRequest, Any]]:
        """Every GPU container of the pod on ``state`` (podplace: init containers, sidecars, MIG, NUMA); the
        pod's CPU / memory (``demand``) go with its first app container, as far as the extender's view of the
        node has them free (kube-scheduler, which filters them, has the last word)."""
        policy = self._policy(req)
        return podplace.place_pod(req, state, policy, workload=self._workload(policy),
                                  demand=_fitting(demand, state))

    # ------------------------------------------------------------------------------------ filter
    def filter(self, body: Any) -> dict[str, Any]:
        args = ExtenderArgs.parse(body)
        try:
            req = podrequest.pod_request(args.pod, self.cfg)
        except SpecError as exc:
            return self._filter_result(args, [], {}, error=f"gpuslice: {exc}")
        if req.empty:  # not a GPU-slice pod: nothing to say
            return self._filter_result(args, list(args.node_names), {})
        raw = [c.mig.resource for c in req.containers if c.mig is not None and c.mig.resource]
        if raw:  # the webhook turns these into the advertised count; without it no device plugin serves them
            return self._filter_result(args, [], {}, error=(
                f"gpuslice: {raw[0]} reached the scheduler unchanged; the gpuslice webhook rewrites it to "
                f"{self.cfg.names.advertised} at creation (was it down, or does it skip this namespace?): recreate the pod"))
        over = self._quota_problem(args.pod, req)
        if over:
            return self._filter_result(args, [], {n: over for n in args.node_names})
        views = self._views_for(args)
        req = podrequest.resolve_gpu_types(req, self._gpu_kinds())
        self._arrive(str(args.pod["metadata"].get("uid") or ""), req, pod_requests(args.pod))
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
            req = podrequest.pod_request(args.pod, self.cfg)
        except SpecError:
            return [{"Host": n, "Score": 0} for n in args.node_names]
        if req.empty:
            return [{"Host": n, "Score": 0} for n in args.node_names]
        views = self._views_for(args)
        req = podrequest.resolve_gpu_types(req, self._gpu_kinds())
        scores: dict[str, float] = {}
        first = req.containers[0].request
        cpu, mem = pod_requests(args.pod)
        policy = self._policy(req)
        if self._indexed(req) and len(req.containers) == 1:
            with self.index.lock:
                scores = score_nodes(first, self.index.current(), policy, workload=self._workload(policy),
                                     cpu_milli=cpu, host_memory=mem)
        elif req.simple:
            fitting, _, _ = self._fit(req, views, str(args.pod["metadata"].get("uid") or ""))
            states = {v.name: self._state_for(v, req) for v in views if v.name in set(fitting)}
            if fitting:
                scores = score_nodes(first, [states[n] for n in fitting], policy, workload=self._workload(policy),
                                     cpu_milli=cpu, host_memory=mem)
        else:  # the pod's own rules: each fitting node's score is its placement's
            fitting, _, states = self._fit(req, views, str(args.pod["metadata"].get("uid") or ""))
            for name in fitting:
                try:
                    scores[name] = podplace.pod_score(self._place_all(req, states[name], (cpu, mem)))
                except NoFit:
                    continue
        return extender_scores(scores, args.node_names)


def _fitting(demand: tuple[int, int], state: NodeState) -> tuple[int, int]:
    """The pod's CPU / memory, capped at what the extender's (possibly lagging) view of the node has free."""
    cpu, mem = demand
    if state.cpu_milli is not None:
        cpu = max(0, min(cpu, state.cpu_milli - state.cpu_used))
    if state.host_memory is not None:
        mem = max(0, min(mem, state.host_memory - state.host_memory_used))
    return cpu, mem
