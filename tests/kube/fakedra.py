"""An in-memory stand-in for the resource.k8s.io/v1 calls of the DRA driver (:class:`gpuslice.kube.dra.api.DraAPI`),
for unit tests: ResourceSlices with resourceVersion preconditions on replace (409 when stale) and 409 on a
create of an existing name, ResourceClaims as tests put them. The real API server (its validation of slices and
claims, the scheduler's allocator) is exercised by tests/e2e/test_kube_dra*.py."""

from __future__ import annotations

import copy
import itertools
import threading
from typing import Any

from gpuslice.kube.api import Conflict, NotFound


class FakeDraAPI:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self._rv = itertools.count(1)
        self._lock = threading.Lock()

    def add_node(self, name: str) -> None:
        self.nodes[name] = {"metadata": {"name": name, "uid": f"uid-{name}"}}

    def add_claim(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = copy.deepcopy(claim)

    def add_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = copy.deepcopy(pod)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(f"get pod {namespace}/{name}")
        if (namespace, name) not in self.pods:
            raise NotFound(f"pod {namespace}/{name}", 404)
        return copy.deepcopy(self.pods[(namespace, name)])

    def list_pods(self, field_selector: str = "") -> list[dict[str, Any]]:
        self.calls.append(f"list pods {field_selector}")
        node = dict(part.split("=", 1) for part in field_selector.split(",") if part).get("spec.nodeName")
        return [copy.deepcopy(p) for p in self.pods.values() if node is None or (p.get("spec") or {}).get("nodeName") == node]

    def get_node(self, name: str) -> dict[str, Any]:
        self.calls.append(f"get node {name}")
        if name not in self.nodes:
            raise NotFound(f"node {name}", 404)
        return copy.deepcopy(self.nodes[name])

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(f"get claim {namespace}/{name}")
        if (namespace, name) not in self.claims:
            raise NotFound(f"resourceclaim {namespace}/{name}", 404)
        return copy.deepcopy(self.claims[(namespace, name)])

    def get_resource_slice(self, name: str) -> dict[str, Any]:
        self.calls.append(f"get slice {name}")
        with self._lock:
            if name not in self.slices:
                raise NotFound(f"resourceslice {name}", 404)
            return copy.deepcopy(self.slices[name])

    def list_resource_slices(self, field_selector: str = "") -> list[dict[str, Any]]:
        self.calls.append(f"list slices {field_selector}")
        want = dict(part.split("=", 1) for part in field_selector.split(",") if part)
        with self._lock:
            return [copy.deepcopy(s) for s in self.slices.values()
                    if all({"spec.nodeName": s["spec"].get("nodeName"), "spec.driver": s["spec"].get("driver")}.get(k) == v
                           for k, v in want.items())]

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"create slice {body['metadata']['name']}")
        with self._lock:
            name = body["metadata"]["name"]
            if name in self.slices:
                raise Conflict(f"resourceslice {name} already exists", 409)
            obj = copy.deepcopy(body)
            obj["metadata"]["resourceVersion"] = str(next(self._rv))
            self.slices[name] = obj
            return copy.deepcopy(obj)

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"replace slice {name}")
        with self._lock:
            current = self.slices.get(name)
            if current is None:
                raise NotFound(f"resourceslice {name}", 404)
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(f"resourceslice {name}: the object has been modified", 409)
            obj = copy.deepcopy(body)
            obj["metadata"]["resourceVersion"] = str(next(self._rv))
            self.slices[name] = obj
            return copy.deepcopy(obj)

    def delete_resource_slice(self, name: str) -> None:
        self.calls.append(f"delete slice {name}")
        with self._lock:
            if self.slices.pop(name, None) is None:
                raise NotFound(f"resourceslice {name}", 404)


def allocated_claim(uid: str, name: str, node: str, results: list[dict[str, Any]], *, namespace: str = "ml",
                    config: list[dict[str, Any]] | None = None, pods: tuple[str, ...] = ("p0",)) -> dict[str, Any]:
    """A ResourceClaim as kube-scheduler leaves it: ``results`` entries need ``device`` and may give
    ``request`` (gpu), ``memory``, ``compute``, ``driver``, ``pool`` and ``shareID``."""
    out = []
    for i, r in enumerate(results):
        consumed = {k: str(r[k]) for k in ("memory", "compute") if k in r}
        consumed["slices"] = "1"
        out.append({"request": r.get("request", "gpu"), "driver": r.get("driver", "gpuslice.io"),
                    "pool": r.get("pool", node), "device": r["device"], "shareID": r.get("shareID", f"share-{i}"),
                    "consumedCapacity": consumed})
    devices: dict[str, Any] = {"results": out}
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io"}}]}},
            "status": {"allocation": {"devices": devices},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]}}
