"""ClientAPI's HTTP requests, recorded by a small stand-in server: method, path, content type, body,
and how error statuses map to typed errors. (The real API server runs in tests/e2e/test_kube*.py.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")  # pinned in pyproject; absent only on bare GPU images

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpuslice.kube.api import ClientAPI, Conflict, KubeError, NotFound
from gpuslice.kube.server import start_in_thread

SEEN: list[dict] = []


async def handler(request: Request) -> JSONResponse:
    body = await request.body()
    SEEN.append({"method": request.method, "path": request.url.path, "query": dict(request.query_params),
                 "type": request.headers.get("content-type"), "auth": request.headers.get("authorization"),
                 "body": json.loads(body) if body else None})
    path = request.url.path
    if path.endswith("/missing"):
        return JSONResponse({"kind": "Status", "message": 'nodes "missing" not found', "reason": "NotFound"}, 404)
    if path.endswith("/busy"):
        return JSONResponse({"kind": "Status", "message": "the object has been modified", "reason": "Conflict"}, 409)
    if path.endswith("/broken"):
        return JSONResponse({"kind": "Status", "message": "etcd is sad"}, 500)
    if path == "/api/v1/nodes":
        return JSONResponse({"kind": "NodeList", "metadata": {"resourceVersion": "42"},
                             "items": [{"metadata": {"name": "a"}}]})
    if path == "/api/v1/pods":
        return JSONResponse({"kind": "PodList", "items": [{"metadata": {"name": "p"}}]})
    return JSONResponse({"kind": "Node", "metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": "7"}})


@pytest.fixture(scope="module")
def api():
    from kubernetes import client

    running = start_in_thread(Starlette(routes=[Route("/{rest:path}", handler,
                                                      methods=["GET", "POST", "PATCH"])]))
    cfg = client.Configuration(host=running.url)
    cfg.api_key = {"BearerToken": "t0ken"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    yield ClientAPI(client.ApiClient(cfg), timeout=5)
    running.stop()


def last() -> dict:
    return SEEN[-1]


def test_reads_and_lists(api):
    assert api.get_node("n1")["metadata"]["resourceVersion"] == "7"
    assert last()["method"] == "GET" and last()["path"] == "/api/v1/nodes/n1" and last()["auth"] == "Bearer t0ken"
    items, rv = api.list_nodes()
    assert rv == "42" and items == [{"metadata": {"name": "a"}}]
    api.list_pods("spec.nodeName=n1", resource_version="0")
    assert last()["query"] == {"fieldSelector": "spec.nodeName=n1", "resourceVersion": "0"}


def test_conditional_merge_patches(api):
    api.patch_node_annotations("n1", {"gpuslice.io/ledger": "{}", "old": None}, resource_version="7")
    assert last()["method"] == "PATCH" and last()["type"] == "application/merge-patch+json"
    assert last()["body"] == {"metadata": {"annotations": {"gpuslice.io/ledger": "{}", "old": None},
                                           "resourceVersion": "7"}}
    api.patch_pod_annotations("ns", "p", {"a": "b"}, uid="u-1")
    assert last()["path"] == "/api/v1/namespaces/ns/pods/p"
    assert last()["body"] == {"metadata": {"annotations": {"a": "b"}, "uid": "u-1"}}


def test_binding_carries_the_pod_uid(api):
    api.bind_pod("ns", "p", "u-1", "n1")
    assert last()["method"] == "POST" and last()["path"] == "/api/v1/namespaces/ns/pods/p/binding"
    assert last()["body"]["metadata"] == {"name": "p", "namespace": "ns", "uid": "u-1"}
    assert last()["body"]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


def test_errors_are_typed_with_the_server_message(api):
    with pytest.raises(NotFound) as exc:
        api.get_node("missing")
    assert exc.value.status == 404 and 'nodes "missing" not found' in str(exc.value)
    with pytest.raises(Conflict) as exc:
        api.patch_node_annotations("busy", {"x": "1"}, resource_version="1")
    assert exc.value.status == 409 and exc.value.reason == "Conflict"
    with pytest.raises(KubeError) as exc:
        api.get_node("broken")
    assert exc.value.status == 500 and not isinstance(exc.value, (Conflict, NotFound))


def test_unreachable_server_is_a_kube_error():
    from kubernetes import client

    api = ClientAPI(client.ApiClient(client.Configuration(host="http://127.0.0.1:1")), timeout=2)
    with pytest.raises(KubeError) as exc:
        api.get_node("n1")
    assert exc.value.status == 0


# ---------------------------------------------------------------------------------------- update_node_annotations
def _racing_api(losses: int):
    """A FakeAPI whose node is changed by someone else right after each of the first ``losses`` reads."""
    from fakeapi import FakeAPI

    api = FakeAPI()
    api.add_node("n1", {"a": "1"})
    reads = {"n": 0}
    get = api.get_node

    def get_node(name: str) -> dict:
        node = get(name)
        reads["n"] += 1
        if reads["n"] <= losses:
            api.patch_node_annotations(name, {"other": str(reads["n"])})  # the rival's write
        return node

    api.get_node = get_node
    return api, reads


def test_update_node_annotations_reads_again_after_a_conflict():
    """A conflicting write is retried on a fresh read, and the rival's write survives."""
    from gpuslice.kube.api import update_node_annotations

    api, reads = _racing_api(losses=2)
    updated = update_node_annotations(api, "n1", lambda anns: {"a": str(int(anns["a"]) + 1)}, attempts=5)
    assert reads["n"] == 3
    assert updated["metadata"]["annotations"] == {"a": "2", "other": "2"}


def test_update_node_annotations_gives_up_with_conflict_and_skips_empty_changes():
    from gpuslice.kube.api import update_node_annotations

    api, reads = _racing_api(losses=10)
    with pytest.raises(Conflict):
        update_node_annotations(api, "n1", lambda anns: {"a": "x"}, attempts=3)
    assert reads["n"] == 3
    assert update_node_annotations(api, "n1", lambda anns: {}) is None  # nothing asked: no write
    with pytest.raises(NotFound):
        update_node_annotations(api, "nope", lambda anns: {"a": "x"})
