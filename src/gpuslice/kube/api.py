"""The few API-server calls the adapters make, on the official ``kubernetes`` client, as plain dicts.

Every object comes back as the API server's JSON (camelCase), the same shape the scheduler and the
admission webhook receive, so one codec reads all of them. Conditional writes use resourceVersion
preconditions (a merge patch that carries ``metadata.resourceVersion`` is refused with 409 when the
object changed) and UID preconditions (a patch carrying ``metadata.uid`` cannot touch a recreated pod).

:class:`KubeAPI` is the interface; :class:`ClientAPI` implements it on ``kubernetes.client.ApiClient``.
Tests without an API server use the small in-memory double in ``tests/kube/fakeapi.py``.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Callable, Iterator, Mapping, Protocol
from urllib.parse import quote

from gpuslice.spec.errors import GpusliceError


class KubeError(GpusliceError):
    """An API-server call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0, reason: str = ""):
        self.status = status
        self.reason = reason
        super().__init__(message)


class Conflict(KubeError):
    """409: the object changed since it was read (resourceVersion precondition) or already exists."""


class NotFound(KubeError):
    """404: the object does not exist."""


class KubeAPI(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...
    def list_nodes(self) -> tuple[list[dict[str, Any]], str]: ...
    def patch_node_annotations(self, name: str, changes: Mapping[str, str | None], *,
                               resource_version: str | None = None) -> dict[str, Any]: ...
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...
    def list_pods(self, field_selector: str = "", resource_version: str = "", namespace: str = "") -> list[dict[str, Any]]: ...
    def patch_pod_annotations(self, namespace: str, name: str, changes: Mapping[str, str | None], *,
                              uid: str | None = None, resource_version: str | None = None) -> dict[str, Any]: ...
    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None: ...
    def list_resource_quotas(self, namespace: str = "") -> list[dict[str, Any]]: ...


def update_node_annotations(api: KubeAPI, name: str,
                            change: Callable[[Mapping[str, str]], Mapping[str, str | None]],
                            attempts: int = 8) -> dict[str, Any] | None:
    """Read Node ``name``, let ``change(annotations)`` say which annotations to set (``None`` deletes), and
    write them under a resourceVersion precondition; on a conflict read again and retry (a short random
    back-off), ``attempts`` times in all. Returns the updated Node, or None when ``change`` asked for
    nothing. Raises NotFound, :class:`Conflict` once the node kept changing, other :class:`KubeError`s,
    and whatever ``change`` raises."""
    for attempt in range(attempts):
        node = api.get_node(name)
        meta = node.get("metadata") or {}
        changes = change(meta.get("annotations") or {})
        if not changes:
            return None
        try:
            return api.patch_node_annotations(name, changes, resource_version=meta.get("resourceVersion"))
        except Conflict:
            if attempt + 1 >= attempts:
                raise
            time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
    raise Conflict(f"node {name}: no attempt made (attempts={attempts})", 409)


def annotation_patch(changes: Mapping[str, str | None], *, uid: str | None = None,
                     resource_version: str | None = None) -> dict[str, Any]:
    """A JSON merge patch of annotations (``None`` deletes a key) with optional preconditions."""
    meta: dict[str, Any] = {"annotations": dict(changes)}
    if uid:
        meta["uid"] = uid
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


class ClientAPI:
    """:class:`KubeAPI` on the official client. ``api_client`` is a configured
    ``kubernetes.client.ApiClient`` (see :func:`connect`)."""

    MERGE = "application/merge-patch+json"

    def __init__(self, api_client: Any, timeout: float = 10.0):
        self.client = api_client
        self.timeout = timeout

    # ------------------------------------------------------------------------------------ transport
    def _call(self, method: str, path: str, body: Any = None, content_type: str | None = None,
              query: list[tuple[str, str]] | None = None, timeout: float | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        try:
            m, url, hdrs, data, _ = self.client.param_serialize(
                method=method, resource_path=path, query_params=query or [], header_params=headers,
                body=body, auth_settings=["BearerToken"])
            resp = self.client.call_api(m, url, header_params=hdrs, body=data,
                                        _request_timeout=timeout or self.timeout)
            raw = resp.read()
        except Exception as exc:  # urllib3 / TLS / connection errors, and the client's own
            status = getattr(exc, "status", 0) or 0
            raise KubeError(f"{method} {path}: {exc}", status) from exc
        status = resp.status
        text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw or "")
        if status >= 400:
            message, reason = text, ""
            try:
                doc = json.loads(text)
                message, reason = doc.get("message", text), doc.get("reason", "")
            except (ValueError, AttributeError):
                pass
            kind = Conflict if status == 409 else NotFound if status == 404 else KubeError
            raise kind(f"{method} {path}: {status} {message}", status, reason)
        return json.loads(text) if text else {}

    def request(self, method: str, path: str, body: Any = None, content_type: str | None = None,
                query: list[tuple[str, str]] | None = None, timeout: float | None = None) -> Any:
        """Any API call (``GET /apis/resource.k8s.io/v1/...``) as JSON; errors as :class:`KubeError` (409
        :class:`Conflict`, 404 :class:`NotFound`). For adapters with calls of their own (``kube.dra.api``)."""
        return self._call(method, path, body, content_type, query, timeout)

    # ------------------------------------------------------------------------------------ nodes
    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{quote(name)}")

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        doc = self._call("GET", "/api/v1/nodes", timeout=60)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch_nodes(self, resource_version: str, timeout_seconds: int = 60) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(type, node)`` events after ``resource_version`` until the server ends the watch."""
        return self._watch("/api/v1/nodes", resource_version, timeout_seconds)

    def watch_pods(self, resource_version: str, timeout_seconds: int = 60,
                   field_selector: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(type, pod)`` events of all namespaces after ``resource_version`` (``field_selector``
        narrows them, e.g. ``spec.nodeName!=``) until the server ends the watch."""
        return self._watch("/api/v1/pods", resource_version, timeout_seconds, field_selector)

    def _watch(self, path: str, resource_version: str, timeout_seconds: int,
               field_selector: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("timeoutSeconds", str(timeout_seconds)), ("allowWatchBookmarks", "true")]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        headers = {"Accept": "application/json"}
        m, url, hdrs, _, _ = self.client.param_serialize(method="GET", resource_path=path,
                                                         query_params=query, header_params=headers,
                                                         auth_settings=["BearerToken"])
        resp = self.client.rest_client.pool_manager.request(
            m, url, headers=hdrs, preload_content=False, timeout=timeout_seconds + 10)
        try:
            if resp.status >= 400:
                kind = Conflict if resp.status == 409 else KubeError
                raise kind(f"watch {path}: {resp.status}", resp.status,
                           "Expired" if resp.status == 410 else "")
            buffer = b""
            for chunk in resp.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield event.get("type", ""), event.get("object") or {}
        finally:
            resp.release_conn()

    def patch_node_annotations(self, name: str, changes: Mapping[str, str | None], *,
                               resource_version: str | None = None) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/nodes/{quote(name)}",
                          annotation_patch(changes, resource_version=resource_version), self.MERGE)

    # ------------------------------------------------------------------------------------ pods
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")

    def list_pods(self, field_selector: str = "", resource_version: str = "", namespace: str = "") -> list[dict[str, Any]]:
        """``resource_version="0"`` lets the API server answer from its watch cache (cheap, may lag a
        little); the default reads through to etcd (fresh). ``namespace``: that namespace's pods only."""
        return self.list_pods_at(field_selector, resource_version, namespace)[0]

    def list_pods_at(self, field_selector: str = "", resource_version: str = "",
                     namespace: str = "") -> tuple[list[dict[str, Any]], str]:
        """:meth:`list_pods` and the list's resourceVersion (to watch from)."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        if resource_version:
            query.append(("resourceVersion", resource_version))
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        doc = self._call("GET", path, query=query, timeout=60)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def list_resource_quotas(self, namespace: str = "") -> list[dict[str, Any]]:
        """The ResourceQuotas of ``namespace`` ('' = every namespace)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/resourcequotas" if namespace else "/api/v1/resourcequotas"
        return list(self._call("GET", path, timeout=30).get("items") or [])

    def patch_pod_annotations(self, namespace: str, name: str, changes: Mapping[str, str | None], *,
                              uid: str | None = None, resource_version: str | None = None) -> dict[str, Any]:
        return self._call("PATCH", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
                          annotation_patch(changes, uid=uid, resource_version=resource_version), self.MERGE)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST the binding subresource; ``metadata.uid`` makes the API server refuse a recreated pod."""
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._call("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding", body)


def connect(kubeconfig: str | None = None, context: str | None = None, timeout: float = 10.0) -> ClientAPI:
    """A :class:`ClientAPI` from a kubeconfig file (``--kubeconfig``), else ``$KUBECONFIG``/``~/.kube/config``,
    else the in-cluster service account."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(context=context, client_configuration=cfg)
    except Exception as exc:
        raise KubeError(f"cannot load Kubernetes credentials ({kubeconfig or 'in-cluster / ~/.kube/config'}): {exc}") from exc
    return ClientAPI(client.ApiClient(cfg), timeout=timeout)
