"""A small in-memory stand-in for the API server, for unit tests of bind concurrency only.

It implements exactly the calls of :class:`gpuslice.kube.api.KubeAPI` with the API server's semantics
that the extender relies on: every write bumps ``metadata.resourceVersion``; a merge patch carrying
``metadata.resourceVersion`` or ``metadata.uid`` that does not match is refused with 409 (Conflict); a
binding of a pod that is already bound, or whose UID differs, is refused with 409. All calls hold one
lock, like etcd's serialised writes. The real API server is exercised by tests/e2e/test_kube*.py.
"""

from __future__ import annotations

import copy
import itertools
import threading
from typing import Any, Mapping

from gpuslice.kube.api import Conflict, NotFound


class FakeAPI:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self._lock = threading.Lock()
        self.calls: list[str] = []
        self.fail_bind: set[str] = set()  # pod names whose binding POST fails (to test rollback)
        self.quotas: list[dict[str, Any]] = []  # ResourceQuota objects (add_quota)

    # ------------------------------------------------------------------ setup helpers
    def add_node(self, name: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        with self._lock:
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(next(self._rv)),
                                 "annotations": dict(annotations or {})}, "spec": {}, "status": {}}
            self.nodes[name] = node
            return copy.deepcopy(node)

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            pod = copy.deepcopy(pod)
            meta = pod.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", f"uid-{meta['namespace']}-{meta['name']}-{next(self._rv)}")
            meta["resourceVersion"] = str(next(self._rv))
            pod.setdefault("status", {"phase": "Pending"})
            self.pods[(meta["namespace"], meta["name"])] = pod
            return copy.deepcopy(pod)

    def add_quota(self, namespace: str, name: str, hard: Mapping[str, str]) -> None:
        with self._lock:
            self.quotas.append({"apiVersion": "v1", "kind": "ResourceQuota",
                                "metadata": {"name": name, "namespace": namespace}, "spec": {"hard": dict(hard)}})

    def list_resource_quotas(self, namespace: str = "") -> list[dict[str, Any]]:
        with self._lock:
            self.calls.append(f"list quotas {namespace}")
            return [copy.deepcopy(q) for q in self.quotas if not namespace or q["metadata"]["namespace"] == namespace]

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            del self.pods[(namespace, name)]

    # ------------------------------------------------------------------ KubeAPI
    @staticmethod
    def _merge(obj: dict[str, Any], changes: Mapping[str, str | None], uid: str | None, rv: str | None,
               next_rv: str) -> None:
        meta = obj["metadata"]
        if uid and meta.get("uid") != uid:
            raise Conflict(f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid')}", 409)
        if rv and meta.get("resourceVersion") != rv:
            raise Conflict("the object has been modified; please apply your changes to the latest version", 409)
        anns = meta.setdefault("annotations", {})
        for k, v in changes.items():
            if v is None:
                anns.pop(k, None)
            else:
                anns[k] = v
        meta["resourceVersion"] = next_rv

    def get_node(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name not in self.nodes:
                raise NotFound(f"node {name} not found", 404)
            return copy.deepcopy(self.nodes[name])

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            return [copy.deepcopy(n) for n in self.nodes.values()], str(next(self._rv))

    def patch_node_annotations(self, name, changes, *, resource_version=None):
        with self._lock:
            self.calls.append(f"patch node {name}")
            if name not in self.nodes:
                raise NotFound(f"node {name} not found", 404)
            self._merge(self.nodes[name], changes, None, resource_version, str(next(self._rv)))
            return copy.deepcopy(self.nodes[name])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            if (namespace, name) not in self.pods:
                raise NotFound(f"pod {namespace}/{name} not found", 404)
            return copy.deepcopy(self.pods[(namespace, name)])

    def list_pods(self, field_selector: str = "", resource_version: str = "", namespace: str = "") -> list[dict[str, Any]]:
        with self._lock:
            pods = [copy.deepcopy(p) for (ns, _), p in self.pods.items() if not namespace or ns == namespace]
        if field_selector.startswith("spec.nodeName="):
            want = field_selector.split("=", 1)[1]
            pods = [p for p in pods if p.get("spec", {}).get("nodeName") == want]
        return pods

    def patch_pod_annotations(self, namespace, name, changes, *, uid=None, resource_version=None):
        with self._lock:
            self.calls.append(f"patch pod {namespace}/{name}")
            if (namespace, name) not in self.pods:
                raise NotFound(f"pod {namespace}/{name} not found", 404)
            pod = self.pods[(namespace, name)]
            self._merge(pod, changes, uid, resource_version, str(next(self._rv)))
            return copy.deepcopy(pod)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self._lock:
            self.calls.append(f"bind {namespace}/{name} {node}")
            if name in self.fail_bind:
                raise Conflict(f"binding {name} refused (test)", 409)
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise NotFound(f"pod {namespace}/{name} not found", 404)
            if pod["metadata"]["uid"] != uid:
                raise Conflict("Precondition failed: UID", 409)
            if pod["spec"].get("nodeName"):
                raise Conflict(f"pod {name} is already assigned to node {pod['spec']['nodeName']}", 409)
            pod["spec"]["nodeName"] = node
            pod["metadata"]["resourceVersion"] = str(next(self._rv))
