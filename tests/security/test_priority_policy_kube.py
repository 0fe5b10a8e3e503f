"""Who may ask for high priority in Kubernetes (issue 15): a high-priority slice makes the low-priority slices on its
device wait while its work is queued, so asking for it is asking to slow other tenants down, and in Kubernetes the
tenant is the namespace. With ``--high-priority-namespace`` (chart ``sharing.highPriorityNamespaces``) only the
listed namespaces may: a pod asking elsewhere (``nvidia.com/priority: 0``) is refused by the webhook with 403 and by
the extender's bind, a live resize to high priority is refused, and a DRA claim with ``priority: high`` is not
prepared, each naming the field and the namespaces that may. The default (``*``) keeps HAMi's behaviour."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))  # the kube fixtures, as tests/kube/conftest.py

from fakeapi import FakeAPI  # noqa: E402
from fakedra import allocated_claim  # noqa: E402
from kubefixtures import node, pod  # noqa: E402

from gpuslice.host.devices import load_snapshot  # noqa: E402
from gpuslice.kube import formats, podrequest, webhook  # noqa: E402
from gpuslice.kube.dra.claims import claim_grant, read_allocation  # noqa: E402
from gpuslice.kube.dra.resourceslice import Sharing, device_name, slice_devices  # noqa: E402
from gpuslice.kube.extender import Extender  # noqa: E402
from gpuslice.kube.extender.resize import LedgerResizer  # noqa: E402
from gpuslice.kube.resize import CHECKED, encode_status  # noqa: E402
from gpuslice.kube.resources import HighPriorityNamespaces, KubeConfig, PriorityRefused  # noqa: E402
from gpuslice.spec import Priority, SpecError  # noqa: E402

ONLINE = KubeConfig(high_priority=HighPriorityNamespaces(("online",)))
HIGH = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/priority": "0"}


def _review(obj, namespace: str | None = None):
    request = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": obj}
    if namespace:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_the_webhook_refuses_high_priority_outside_the_listed_namespaces_with_403():
    answer = webhook.mutate(_review(pod("srv", HIGH, namespace="batch")), ONLINE)["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert "spec.containers[0](main).resources.limits[nvidia.com/priority]" in message
    assert "namespace 'batch' may not ask for high priority" in message and "allowed in: online" in message
    assert webhook.mutate(_review(pod("srv", HIGH, namespace="online")), ONLINE)["response"]["allowed"] is True
    low = {**HIGH, "nvidia.com/priority": "1"}
    assert webhook.mutate(_review(pod("srv", low, namespace="batch")), ONLINE)["response"]["allowed"] is True


def test_the_namespace_is_the_reviews_when_the_pod_names_none():
    """At CREATE the API server may hand the pod without metadata.namespace: the review's namespace decides."""
    p = pod("srv", HIGH)
    del p["metadata"]["namespace"]
    assert webhook.mutate(_review(p, "batch"), ONLINE)["response"]["allowed"] is False
    assert webhook.mutate(_review(p, "online"), ONLINE)["response"]["allowed"] is True


def test_every_way_of_asking_is_held_to_the_policy():
    """gpuslice's own resource name, an init container and a MIG request ask for high priority too."""
    ours = pod("a", {"gpuslice.io/gpu": "1", "gpuslice.io/priority": "0"}, namespace="batch")
    with pytest.raises(PriorityRefused) as err:
        podrequest.pod_request(ours, ONLINE)
    assert err.value.field.endswith("resources.limits[gpuslice.io/priority]")
    init = pod("b", {"cpu": "1"}, namespace="batch")
    init["spec"]["initContainers"] = [{"name": "warm", "image": "x", "resources": {"limits": dict(HIGH)}}]
    with pytest.raises(PriorityRefused) as err:
        podrequest.pod_request(init, ONLINE)
    assert err.value.field.startswith("spec.initContainers[0](warm)")
    mig = pod("c", {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/priority": "0"}, namespace="batch")
    with pytest.raises(PriorityRefused):
        podrequest.pod_request(mig, ONLINE)


def test_the_default_lets_every_namespace_ask_as_hami_does():
    req = podrequest.pod_request(pod("srv", HIGH, namespace="anything"), KubeConfig())
    assert req.containers[0].request.priority is Priority.HIGH
    none = KubeConfig(high_priority=HighPriorityNamespaces(()))
    with pytest.raises(PriorityRefused) as err:
        podrequest.pod_request(pod("srv", HIGH, namespace="kube-system"), none)
    assert "allowed in: no namespace" in str(err.value)


@pytest.mark.parametrize("names, bad", [(("Online",), "Online"), (("a_b",), "a_b"), (("",), ""),
                                        (("*", "online"), ("*", "online")), (["online"], ["online"])])
def test_a_bad_policy_is_refused_naming_the_field(names, bad):
    with pytest.raises(SpecError) as err:
        HighPriorityNamespaces(names)
    assert err.value.field == "high_priority_namespaces" and err.value.value == bad


def test_the_extenders_bind_refuses_a_pod_the_webhook_never_saw():
    """A pod created while the webhook was down (or with failurePolicy Ignore) is still held at bind."""
    api = FakeAPI()
    api.add_node("n0", node("n0", 1)["metadata"]["annotations"])
    ext = Extender(api, ONLINE, allocation_timeout=0)
    m = api.add_pod(pod("srv", HIGH, namespace="batch"))["metadata"]
    error = ext.bind({"PodName": "srv", "PodNamespace": "batch", "PodUID": m["uid"], "Node": "n0"})["Error"]
    assert "namespace 'batch' may not ask for high priority" in error
    assert formats.NODE_LEDGER not in api.get_node("n0")["metadata"]["annotations"] or \
        not formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0").entries
    m = api.add_pod(pod("srv", HIGH, namespace="online"))["metadata"]
    assert ext.bind({"PodName": "srv", "PodNamespace": "online", "PodUID": m["uid"], "Node": "n0"})["Error"] == ""


def test_a_live_resize_to_high_priority_is_held_to_the_policy():
    api = FakeAPI()
    api.add_node("n0", node("n0", 1)["metadata"]["annotations"])
    ext = Extender(api, ONLINE, allocation_timeout=0)
    for ns in ("batch", "online"):
        m = api.add_pod(pod("job", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}, namespace=ns))["metadata"]
        assert ext.bind({"PodName": "job", "PodNamespace": ns, "PodUID": m["uid"], "Node": "n0"})["Error"] == ""
        text = json.dumps({"priority": "high"})
        # the node agent's check is done: the extender's turn (gpuslice.kube.resize, step 2)
        api.patch_pod_annotations(ns, "job", {formats.POD_RESIZE: text,
                                              formats.POD_RESIZE_STATUS: encode_status(text, CHECKED, "checked")})
    side = LedgerResizer(api, high_priority=ONLINE.high_priority)
    assert side.handle(api.get_pod("batch", "job")) == "refused"
    said = json.loads(api.get_pod("batch", "job")["metadata"]["annotations"][formats.POD_RESIZE_STATUS])["message"]
    assert "gpuslice.io/resize.priority" in said and "namespace 'batch' may not" in said
    grant = formats.decode_pod_grant(api.get_pod("batch", "job")["metadata"]["annotations"][formats.POD_GRANT])
    assert grant.containers[0].slices[0].priority is Priority.LOW  # nothing applied
    assert side.handle(api.get_pod("online", "job")) == "granted"


def test_a_dra_claim_asking_for_high_priority_outside_the_listed_namespaces_is_not_prepared():
    devices = load_snapshot("h100-80gb")
    by_name = {d.name: d for d in slice_devices(devices)}
    config = [{"opaque": {"driver": "gpuslice.io", "parameters": {"priority": "high"}}}]
    claim = allocated_claim("u1", "srv", "n1", [{"device": device_name(devices[0].uuid)}], namespace="batch",
                            config=config)
    with pytest.raises(PriorityRefused) as err:
        claim_grant(read_allocation(claim, "n1"), by_name, Sharing(), high_priority=ONLINE.high_priority)
    assert err.value.field == "ResourceClaim batch/srv: SliceParameters.priority"
    ok = allocated_claim("u2", "srv", "n1", [{"device": device_name(devices[0].uuid)}], namespace="online",
                         config=config)
    grant = claim_grant(read_allocation(ok, "n1"), by_name, Sharing(), high_priority=ONLINE.high_priority)
    assert grant.slices[0].priority is Priority.HIGH
