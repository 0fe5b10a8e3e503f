"""The resource.k8s.io/v1 calls of the DRA driver, as plain JSON dicts (the API server's camelCase), on
:meth:`gpuslice.kube.api.ClientAPI.request`. :class:`DraAPI` is the interface; ``tests/kube/fakeapi.py`` has an
in-memory double."""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

from gpuslice.kube.api import ClientAPI

GROUP = "/apis/resource.k8s.io/v1"


class DraAPI(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...
    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...
    def list_pods(self, field_selector: str = "") -> list[dict[str, Any]]: ...
    def get_resource_slice(self, name: str) -> dict[str, Any]: ...
    def list_resource_slices(self, field_selector: str = "") -> list[dict[str, Any]]: ...
    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def delete_resource_slice(self, name: str) -> None: ...


class ClientDraAPI:
    """:class:`DraAPI` on a :class:`ClientAPI` (``connect(kubeconfig)``). ``replace`` is a PUT: the body's
    ``metadata.resourceVersion`` makes the API server refuse it (409) if the slice changed since it was read."""

    def __init__(self, api: ClientAPI):
        self.api = api

    def get_node(self, name: str) -> dict[str, Any]:
        return self.api.get_node(name)

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"{GROUP}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}")

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.get_pod(namespace, name)

    def list_pods(self, field_selector: str = "") -> list[dict[str, Any]]:
        return self.api.list_pods(field_selector=field_selector)

    def get_resource_slice(self, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"{GROUP}/resourceslices/{quote(name)}")

    def list_resource_slices(self, field_selector: str = "") -> list[dict[str, Any]]:
        query = [("fieldSelector", field_selector)] if field_selector else []
        return list(self.api.request("GET", f"{GROUP}/resourceslices", query=query).get("items") or [])

    def create_resource_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("POST", f"{GROUP}/resourceslices", body)

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("PUT", f"{GROUP}/resourceslices/{quote(name)}", body)

    def delete_resource_slice(self, name: str) -> None:
        self.api.request("DELETE", f"{GROUP}/resourceslices/{quote(name)}")
