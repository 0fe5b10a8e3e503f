"""The mutating admission webhook over real HTTPS (uvicorn on loopback with a self-signed CA)."""

from __future__ import annotations

import base64
import json
import ssl

import pytest

httpx = pytest.importorskip("httpx")  # pinned in pyproject; absent only on bare GPU images
pytest.importorskip("cryptography")
from kubefixtures import pod

from gpuslice.kube import formats, podrequest, resources, webhook
from gpuslice.kube.certs import write_self_signed
from gpuslice.kube.server import make_app, start_in_thread

CFG = resources.KubeConfig(default_gpu_num=1, default_cores=10)


@pytest.fixture(scope="module")
def https(tmp_path_factory):
    tls = write_self_signed(tmp_path_factory.mktemp("tls"), ["localhost", "127.0.0.1"])
    running = start_in_thread(make_app(None, CFG), certfile=str(tls.cert), keyfile=str(tls.key))
    with httpx.Client(base_url=running.url, verify=ssl.create_default_context(cafile=str(tls.ca)), timeout=10) as client:
        yield client
    running.stop()


def review(obj, operation="CREATE", kind="Pod"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                        "kind": {"group": "", "version": "v1", "kind": kind},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "requestKind": {"group": "", "version": "v1", "kind": kind},
                        "name": obj.get("metadata", {}).get("name"), "namespace": "default",
                        "operation": operation, "userInfo": {"username": "admin", "groups": ["system:masters"]},
                        "object": obj, "oldObject": None, "dryRun": False,
                        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def answer(client, body):
    r = client.post("/mutate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return out["response"]


def patched(obj, response):
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    return webhook.apply_json_patch(obj, json.loads(base64.b64decode(response["patch"])))


def test_hami_pod_gets_scheduler_defaults_and_request(https):
    p = pod("train", {"nvidia.com/gpumem-percentage": "50"}, annotations={formats.POD_GRANT: "forged"})
    out = patched(p, answer(https, review(p)))
    assert out["spec"]["schedulerName"] == "gpuslice-scheduler"
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "1" and res["requests"]["nvidia.com/gpu"] == "1"  # defaultGPUNum
    assert formats.POD_GRANT not in out["metadata"]["annotations"]  # a pod cannot bring its own grant
    assert "gpuslice.io/request" not in out["metadata"]["annotations"]  # no second copy of the request
    (c,) = podrequest.pod_request(out, CFG).containers  # what the extender reads from the admitted pod
    name, req = c.name, c.request
    assert name == "main" and str(req.memory) == "50%" and req.compute == 10  # defaultCores


def test_pod_without_annotations_or_resources_block(https):
    p = pod("a", {"nvidia.com/gpu": "2"})
    del p["metadata"]["uid"]
    out = patched(p, answer(https, review(p)))
    assert podrequest.pod_request(out, CFG).containers[0].request.count == 2
    c = {"name": "x", "image": "busybox"}
    p = pod("b", containers=[c, {"name": "y", "image": "busybox", "resources": {"limits": {"nvidia.com/gpucores": "20"}}}])
    out = patched(p, answer(https, review(p)))
    assert out["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "resources" not in out["spec"]["containers"][0]


def test_non_gpu_pods_and_other_kinds_pass_untouched(https):
    assert answer(https, review(pod("cpu", {"cpu": "1"}))) == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                                                              "allowed": True}
    assert answer(https, review({"metadata": {"name": "d"}}, kind="Deployment"))["allowed"]
    assert "patch" not in answer(https, review(pod("p", {"nvidia.com/gpu": "1"}), operation="UPDATE"))


@pytest.mark.parametrize("limits, needle", [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpumem-percentage": "50"},
     "one memory request"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, "nvidia.com/gpucores"),
    ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}, "at least 1"),
])
def test_contradictory_requests_are_denied_with_a_message(https, limits, needle):
    resp = answer(https, review(pod("bad", limits)))
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["code"] == 422 and needle in resp["status"]["message"]
    assert resp["status"]["message"].startswith("gpuslice: spec.containers[0]")


def test_node_name_is_denied(https):
    p = pod("pinned", {"nvidia.com/gpu": "1"})
    p["spec"]["nodeName"] = "n1"
    resp = answer(https, review(p))
    assert not resp["allowed"] and "spec.nodeName" in resp["status"]["message"]


@pytest.mark.parametrize("body, needle", [
    (b"{not json", "not JSON"),
    (b"", "empty body"),
    (b"[1, 2]", "JSON AdmissionReview object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}).encode(),
     "apiVersion must be admission.k8s.io/v1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "request must be"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}).encode(),
     "uid"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "x", "kind": {"kind": "Pod", "group": ""}, "object": "pod"}}).encode(),
     "must be a Pod"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "x", "kind": {"kind": "Pod", "group": ""},
                             "object": {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": 7}]}}}}
                ).encode(), "limits/requests objects"),
])
def test_malformed_payloads_get_400_with_a_message(https, body, needle):
    r = https.post("/mutate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and needle in r.json()["error"]
    assert https.get("/healthz").text == "ok"  # still serving


def test_plain_http_is_refused_by_the_tls_server(https):
    url = str(https.base_url).replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        r = httpx.post(url + "/mutate", json={}, timeout=5)
        assert r.status_code >= 400
        raise httpx.HTTPError("plain HTTP answered with an error status")


def test_listening_sockets_are_tcp_nodelay():
    """Without TCP_NODELAY uvicorn's header and body writes wait for the caller's delayed ACK (~40 ms)."""
    import socket as s

    from gpuslice.kube.server import bind_socket

    sock = bind_socket()
    try:
        assert sock.proto == s.IPPROTO_TCP and sock.getsockopt(s.IPPROTO_TCP, s.TCP_NODELAY)
    finally:
        sock.close()


def test_count_given_as_gpuslice_gpu_gets_the_advertised_name_too():
    """The kubelet asks the device plugin only for the advertised resource: a container that counts its
    devices as gpuslice.io/gpu gets nvidia.com/gpu with the same value (limits and requests)."""
    p = pod("ours", {"gpuslice.io/gpu": "2", "gpuslice.io/gpu-memory": "4Gi"})
    out = patched(p, webhook.mutate(review(p), CFG)["response"])
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "2"
    assert res["limits"]["gpuslice.io/gpu"] == "2"


def test_configured_resource_names_reach_the_webhook():
    names = resources.ResourceNames.configured(count="example.com/vgpu", memory="example.com/vmem")
    cfg = resources.KubeConfig(names=names, default_gpu_num=1)
    p = pod("renamed", {"example.com/vmem": "2048"})
    out = patched(p, webhook.mutate(review(p), cfg)["response"])
    assert out["spec"]["schedulerName"] == "gpuslice-scheduler"
    assert out["spec"]["containers"][0]["resources"]["limits"]["example.com/vgpu"] == "1"
    plain = pod("hami-names", {"nvidia.com/gpumem": "2048"})  # not GPU resources any more here
    assert "patch" not in webhook.mutate(review(plain), cfg)["response"]


def test_what_hami_ignores_is_allowed_with_a_warning():
    cfg = resources.KubeConfig(default_gpu_num=0)
    p = pod("no-count", {"nvidia.com/gpumem": "2000"})
    response = webhook.mutate(review(p), cfg)["response"]
    assert response["allowed"] and "patch" not in response
    (warning,) = response["warnings"]
    assert "nvidia.com/gpumem" in warning and "defaultGPUNum is 0" in warning
    p = pod("prio-only", {"nvidia.com/priority": "0", "cpu": "1"})
    response = webhook.mutate(review(p), CFG)["response"]
    assert response["allowed"] and "nvidia.com/priority is ignored" in response["warnings"][0]
    p = pod("fine", {"nvidia.com/gpu": "1"})
    assert "warnings" not in webhook.mutate(review(p), CFG)["response"]


def _served(port: int, ca: str | None = None) -> str:
    """The certificate the server presents (PEM); with ``ca``, the handshake must also verify against it."""
    import socket as s

    ctx = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()
    with s.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True))


def _swap(live, fresh, *, cert: bool = True, key: bool = True) -> None:
    """Replace the live files as the kubelet updates a Secret volume: new inodes, atomically."""
    import os

    for name, wanted in (("tls.crt", cert), ("tls.key", key)):
        if wanted:
            tmp = live / f".{name}.new"
            tmp.write_bytes((fresh / name).read_bytes())
            os.replace(tmp, live / name)


def test_webhook_serves_a_renewed_certificate_without_a_restart(tmp_path):
    """cert-manager renews the Secret, the kubelet swaps the mounted files: the running webhook must serve
    the new certificate (uvicorn alone loads it once); a half-rotated pair (new cert, old key) must not
    break serving — the old pair stays until the key arrives too."""
    live = tmp_path / "live"
    first = write_self_signed(live)
    old_pem = first.cert.read_text().strip()
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes(first.ca.read_bytes())
    renewed = write_self_signed(tmp_path / "renewed")
    running = start_in_thread(make_app(None), certfile=str(first.cert), keyfile=str(first.key), tls_check_interval=0)
    try:
        assert _served(running.port, str(old_ca)).strip() == old_pem
        _swap(live, tmp_path / "renewed", key=False)  # mid-rotation: the new certificate with the old key
        assert _served(running.port, str(old_ca)).strip() == old_pem  # still served, still the old pair
        _swap(live, tmp_path / "renewed", cert=False)  # the key follows
        assert _served(running.port, str(renewed.ca)).strip() == renewed.cert.read_text().strip()
        # and the app still answers over the new certificate
        ctx = ssl.create_default_context(cafile=str(renewed.ca))
        assert httpx.get(f"{running.url}/healthz", verify=ctx, timeout=5).text == "ok"
    finally:
        running.stop()


def test_certificate_checks_are_rate_limited(tmp_path):
    """At most one look at the files per interval (a handshake costs no stat() in between)."""
    from gpuslice.kube.tlsreload import ReloadingTLS

    files = write_self_signed(tmp_path / "a")
    now = [0.0]
    builds = []

    def build():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(files.cert, files.key)
        builds.append(ctx)
        return ctx

    tls = ReloadingTLS(str(files.cert), str(files.key), build, interval=5, clock=lambda: now[0])
    first = tls.current()
    other = write_self_signed(tmp_path / "b")
    _swap(tmp_path / "a", tmp_path / "b")
    now[0] = 4.9
    assert tls.current() is first and tls.reloads == 0  # not looked at yet
    now[0] = 5.0
    assert tls.current() is not first and tls.reloads == 1
    assert len(builds) == 2 and other.cert.exists()


def test_a_pod_of_another_scheduler_is_left_to_it_unless_adopted(https):
    """HAMi overrides default-scheduler only: volcano keeps its pod (a warning says gpuslice's device plugin
    serves only what its scheduler placed; forged grant marks still go). A name listed in
    adopt_schedulers (hami-scheduler once HAMi is gone) is taken over like default-scheduler."""
    p = pod("train", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, annotations={formats.POD_GRANT: "forged"})
    p["spec"]["schedulerName"] = "volcano"
    resp = answer(https, review(p))
    out = patched(p, resp)
    assert out["spec"]["schedulerName"] == "volcano" and formats.POD_GRANT not in out["metadata"]["annotations"]
    assert "'volcano' is kept" in resp["warnings"][0]
    p["spec"]["schedulerName"] = "hami-scheduler"
    cfg = resources.KubeConfig(adopt_schedulers=("default-scheduler", "hami-scheduler"))
    resp = webhook.mutate(review(p), cfg)["response"]
    assert patched(p, resp)["spec"]["schedulerName"] == "gpuslice-scheduler"


def test_mig_names_and_init_containers_are_rewritten_over_https(https):
    """nvidia.com/mig-<profile> becomes the advertised count plus gpuslice.io/mig-profile (in limits and
    requests); a GPU init container gets its count filled like an app container."""
    p = pod("mig", {"nvidia.com/mig-1g.10gb": "2"})
    p["spec"]["initContainers"] = [{"name": "prep", "image": "busybox",
                                    "resources": {"limits": {"nvidia.com/gpumem": "2000"}}}]
    resp = answer(https, review(p))
    out = patched(p, resp)
    main = out["spec"]["containers"][0]["resources"]
    assert main["limits"] == {"nvidia.com/gpu": "2"} and main["requests"] == {"nvidia.com/gpu": "2"}
    assert out["metadata"]["annotations"]["gpuslice.io/mig-profile"] == "main=1g.10gb"
    assert out["spec"]["initContainers"][0]["resources"] == {
        "limits": {"nvidia.com/gpumem": "2000", "nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    assert any("served as nvidia.com/gpu: 2" in w for w in resp["warnings"])
    req = podrequest.pod_request(out, CFG)  # what the extender reads from the admitted pod
    assert [(c.name, c.kind) for c in req.containers] == [("prep", "init"), ("main", "app")]
    assert req.containers[1].mig.profile == "1g.10gb" and req.containers[1].mig.count == 2


def test_quota_refusal_is_forbidden_with_the_reason():
    def over(namespace, pod_, req):
        return f"namespace {namespace} is over its GPU memory quota"
    p = pod("big", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
    resp = webhook.mutate(review(p), CFG, over)["response"]
    assert not resp["allowed"] and resp["status"]["code"] == 403 and resp["status"]["reason"] == "Forbidden"
    assert resp["status"]["message"] == "gpuslice: namespace default is over its GPU memory quota"
    assert webhook.mutate(review(pod("cpu", {"cpu": "1"})), CFG, over)["response"]["allowed"]  # no GPU: not asked
