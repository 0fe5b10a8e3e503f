"""The bind transaction: commit a pod's grant into its node's ledger (a resourceVersion-conditioned
write, with the allocation lock), write the pod's ``gpuslice.io/grant``, POST the binding, and undo or
settle on failure. A mixin of :class:`~gpuslice.kube.extender.core.Extender`, whose placement helpers
(``_state_for``, ``_place_all``, ``_stale_devices``) it uses."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from typing import Any, Callable, Mapping

from gpuslice.kube import alloclock, formats, podrequest, quota
from gpuslice.kube.api import Conflict, KubeError, NotFound, update_node_annotations
from gpuslice.kube.extender.cache import NodeView, view_of
from gpuslice.kube.extender.usage import pod_requests
from gpuslice.kube.extender.wire import BindingArgs
from gpuslice.placement import NoFit
from gpuslice.spec import GpusliceError, Grant, SpecError

log = logging.getLogger("gpuslice.extender")


class BindTransaction:
    """``bind`` and what it needs to commit, undo and settle a grant (mixed into the Extender)."""

    def _lock(self, node: str) -> threading.Lock:
        with self._locks_lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def _namespace_lock(self, namespace: str) -> Any:
        """Binds of a namespace with a GPU quota commit one at a time here, so two cannot both pass the
        quota on the same remaining room (other namespaces are not held up)."""
        book = self.quota
        try:
            limited = book is not None and namespace in book.all_limits()
        except Exception:  # unreadable now: the commit's own fresh read refuses
            limited = book is not None
        return book.namespace_lock(namespace) if limited and book is not None else contextlib.nullcontext()

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

    def bind_pod(self, args: BindingArgs) -> formats.PodGrant | None:
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
        req = podrequest.pod_request(pod, self.cfg)
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
        with self._namespace_lock(args.pod_namespace), self._lock(args.node):
            grant = self._commit(args, req, pod_requests(pod))
        try:
            self._annotate(args, grant, str(meta.get("resourceVersion") or ""))
            api.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except KubeError as exc:
            # Another bind of the same pod may have won (a retried or concurrent scheduler call), or the
            # binding landed and only its answer was lost: settle the annotation on what is really bound.
            bound = self._settle_annotation(args, grant)
            if bound == args.node:
                self._release_elsewhere(args.pod_uid, args.node)
                self._bound(pod, args.node)
                return grant  # bound here with this grant after all: keep the ledger entry
            if bound is None:  # cannot tell: keeping the entry is safe, garbage collection decides later
                raise KubeError(f"binding {args.pod_namespace}/{args.pod_name} to {args.node} failed and the pod "
                                f"cannot be read; its grant stays until garbage collection: {exc}", exc.status) from exc
            self._take_back(args.node, args.pod_uid)
            raise KubeError(f"binding {args.pod_namespace}/{args.pod_name} to {args.node} failed; "
                            f"grant taken back: {exc}", exc.status) from exc
        self._release_elsewhere(args.pod_uid, args.node)
        self._bound(pod, args.node)
        return grant

    def _bound(self, pod: Mapping[str, Any], node: str) -> None:
        """Count the pod's CPU / memory on its node now (the pod watch confirms it later)."""
        if self.usage is not None:
            self.usage.assume(pod, node)

    def _annotate(self, args: BindingArgs, grant: formats.PodGrant, resource_version: str) -> None:
        """Write the pod's ``gpuslice.io/grant`` only onto a pod state this bind has seen (resourceVersion
        precondition): never after the pod got bound (by a concurrent bind of the same pod elsewhere), so
        a losing bind cannot leave its grant on a pod bound with another."""
        api = self.api
        assert api is not None
        changes = {formats.POD_GRANT: formats.encode_pod_grant(grant), formats.POD_ALLOCATED: None}
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

    def _settle_annotation(self, args: BindingArgs, grant: formats.PodGrant) -> str | None:
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
            shown = (meta.get("annotations") or {}).get(formats.POD_GRANT)
            mine = formats.encode_pod_grant(grant)
            if bound == args.node:
                want: str | None = mine
            elif bound:
                try:
                    entry = view_of(api.get_node(bound)).ledger.entries.get(args.pod_uid)
                except KubeError:
                    entry = None
                want = formats.encode_pod_grant(entry) if entry is not None else (None if shown == mine else shown)
            else:
                want = None if shown == mine else shown  # another bind's grant in flight: not ours to remove
            if want == shown:
                return bound
            try:
                api.patch_pod_annotations(args.pod_namespace, args.pod_name, {formats.POD_GRANT: want},
                                          uid=args.pod_uid, resource_version=str(meta.get("resourceVersion") or ""))
                return bound
            except Conflict:
                continue
            except KubeError as exc:
                log.error("pod %s/%s: settling %s failed: %s", args.pod_namespace, args.pod_name, formats.POD_GRANT, exc)
                return bound
        return bound

    def _commit(self, args: BindingArgs, req: podrequest.PodRequest,
                demand: tuple[int, int] = (0, 0)) -> formats.PodGrant:
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
                placed = self._place_all(podrequest.resolve_gpu_types(req, podrequest.device_kinds(view.devices.devices)),
                                         state, demand)
            except NoFit as exc:
                raise KubeError(f"node {args.node} cannot take pod {args.pod_namespace}/{args.pod_name}: "
                                f"{exc.reason}") from None
            grant = formats.PodGrant(
                node=args.node, pod_uid=args.pod_uid, namespace=args.pod_namespace, pod=args.pod_name,
                containers=tuple(formats.ContainerGrant(c.name, Grant(formats.grant_id_for(args.pod_uid, c.name),
                                                                      p.slices, p.exclusive), c.kind)
                                 for c, p in placed),
                bound_at=self.clock())
            if self.quota is not None:  # the grant as placed: memory percents and whole devices known now
                over = self.quota.check(args.pod_namespace, self.granted, quota.grant_usage(grant),
                                        skip=args.pod_uid, fresh=True)
                if over:
                    raise KubeError(over)
            holders = self._lock_holders(args, req, view)  # after placement: "cannot take" is the lasting reason
            changes = {formats.NODE_LEDGER: formats.encode_ledger(view.ledger.with_entry(grant))}
            if self.allocation_timeout:
                # The lock is taken in the same conditioned write as the capacity: two binds cannot both
                # see the node free of a same-count holder and both commit.
                changes[formats.NODE_ALLOCATING] = formats.encode_allocating(holders | {args.pod_uid})
            try:
                updated = api.patch_node_annotations(args.node, changes, resource_version=view.resource_version)
            except Conflict as exc:
                last = str(exc)
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
                continue
            self.views.view(updated)
            return grant
        raise KubeError(f"node {args.node} kept changing under {self.bind_retries} bind attempts ({last})")

    def _lock_holders(self, args: BindingArgs, req: podrequest.PodRequest, view: NodeView) -> frozenset[str]:
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
                       change: Callable[[formats.Ledger, frozenset[str]], tuple[formats.Ledger, frozenset[str]]]) -> bool:
        """Apply ``change`` to the node's (ledger, allocation-lock holders) with a resourceVersion
        precondition; True if it changed anything."""
        api = self.api
        assert api is not None

        def annotations(anns: Mapping[str, str]) -> dict[str, str | None]:
            ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), node_name)
            allocating = formats.decode_allocating(anns.get(formats.NODE_ALLOCATING))
            new, new_allocating = change(ledger, allocating)
            changes: dict[str, str | None] = {}
            if dict(new.entries) != dict(ledger.entries):
                changes[formats.NODE_LEDGER] = formats.encode_ledger(new)
            if new_allocating != allocating:
                changes[formats.NODE_ALLOCATING] = formats.encode_allocating(new_allocating)
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
