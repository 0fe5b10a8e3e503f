"""Namespace GPU quotas (gpuslice.kube.quota): HAMi's extended ResourceQuota counted per device, checked at
admission (webhook), in filter and at bind (extender), and exported as metrics."""

from __future__ import annotations

import pytest
from fakeapi import FakeAPI
from kubefixtures import node, pod

from gpuslice.kube import formats, podrequest, quota, resources
from gpuslice.kube.extender import Extender
from gpuslice.spec import GiB, Grant, MiB, Slice

CFG = resources.KubeConfig()


def _rq(name, hard, ns="ml"):
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}


def test_limits_take_the_tightest_quota_and_hamis_units():
    limits = quota.limits_of([_rq("a", {"limits.nvidia.com/gpumem": "20k", "limits.nvidia.com/gpu": "4",
                                        "requests.nvidia.com/gpu": "9", "limits.cpu": "4"}),
                              _rq("b", {"limits.gpuslice.io/gpu-memory": "10Gi", "limits.nvidia.com/gpucores": "150"}),
                              _rq("c", {"limits.nvidia.com/gpumem": "lots"})], CFG)
    assert limits["memory"].value == 10 * GiB and limits["memory"].source == "b: limits.gpuslice.io/gpu-memory"
    assert limits["devices"].value == 4 and limits["compute"].value == 150 and set(limits) == {"memory", "devices", "compute"}
    # HAMi's gpumem counts MiB (20k = 20000 MiB), and is shown so
    only = quota.limits_of([_rq("a", {"limits.nvidia.com/gpumem": "20k"})], CFG)
    assert only["memory"].value == 20000 * MiB
    why = quota.exceeded("ml", only, quota.Usage(memory=16000 * MiB), quota.Usage(memory=8000 * MiB))
    assert why.endswith("20000 MiB allowed, 16000 MiB granted, this pod adds 8000 MiB") and "namespace ml" in why
    assert quota.exceeded("ml", only, quota.Usage(memory=12000 * MiB), quota.Usage(memory=8000 * MiB)) == ""


def test_a_pod_counts_memory_and_cores_per_device_and_init_containers_as_hami():
    p = pod("p", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
    p["spec"]["initContainers"] = [
        {"name": "big-init", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "7000"}}},
        {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpumem": "500"}}}]
    u = quota.request_usage(podrequest.pod_request(p, CFG))
    # running: app 2 x 3000 + sidecar 500 = 6500 MiB; init 7000 + sidecar 500 = 7500 MiB is larger
    assert u.memory == 7500 * MiB and u.compute == 60 and u.devices == 3 and not u.partial
    assert quota.request_usage(podrequest.pod_request(pod("p", {"nvidia.com/gpumem-percentage": "50"}), CFG)).partial


def test_admission_counts_granted_pods_of_the_namespace_and_admits_when_the_api_fails():
    api = FakeAPI()
    api.add_quota("ml", "q", {"limits.nvidia.com/gpumem": "10000"})
    granted = pod("old", {"nvidia.com/gpu": "1"}, namespace="ml")
    g = formats.PodGrant("n1", "uid-ml-old", "ml", "old", (formats.ContainerGrant(
        "main", Grant("k-old", (Slice("GPU-1", 6000 * MiB, 0),))),))
    granted["metadata"]["annotations"] = {formats.POD_GRANT: formats.encode_pod_grant(g)}
    api.add_pod(granted)
    done = pod("done", {"nvidia.com/gpu": "1"}, namespace="ml")
    done["metadata"]["annotations"] = {formats.POD_GRANT: formats.encode_pod_grant(g)}
    done["status"] = {"phase": "Succeeded"}  # finished pods hold nothing
    api.add_pod(done)
    check = quota.AdmissionQuota(api, CFG)
    new = pod("new", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}, namespace="ml")
    assert "6000 MiB granted, this pod adds 5000 MiB" in check("ml", new, podrequest.pod_request(new, CFG))
    ok = pod("ok", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}, namespace="ml")
    assert check("ml", ok, podrequest.pod_request(ok, CFG)) == ""
    assert check("other", new, podrequest.pod_request(new, CFG)) == ""  # no quota there

    class Down(FakeAPI):
        def list_resource_quotas(self, namespace=""):
            raise RuntimeError("connection refused")
    assert quota.AdmissionQuota(Down(), CFG)("ml", new, podrequest.pod_request(new, CFG)) == ""


def _extender_with(api):
    nodes = [node("n1"), node("n2")]
    for n in nodes:
        api.add_node(n["metadata"]["name"], n["metadata"]["annotations"])
    return Extender(api, CFG), [api.get_node("n1"), api.get_node("n2")]


def test_filter_and_bind_hold_the_namespace_to_its_quota():
    api = FakeAPI()
    api.add_quota("ml", "q", {"limits.nvidia.com/gpumem": "30000"})
    ext, nodes = _extender_with(api)
    first = api.add_pod(pod("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}, namespace="ml"))
    out = ext.filter({"Pod": first, "Nodes": {"items": nodes}})
    assert len(out["Nodes"]["items"]) == 2  # a percent is not known before placement
    meta = first["metadata"]
    assert ext.bind({"PodName": "a", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "n1"})["Error"] == ""
    # 25 % of an 81559 MiB H100 = 20389 MiB granted; another 25 % is over 30000 MiB: bind refuses
    second = api.add_pod(pod("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}, namespace="ml"))
    err = ext.bind({"PodName": "b", "PodNamespace": "ml", "PodUID": second["metadata"]["uid"], "Node": "n2"})["Error"]
    assert "over its GPU memory" in err and "20389 MiB granted, this pod adds 20389 MiB" in err
    assert "uid-ml-b" not in api.get_node("n2")["metadata"]["annotations"].get(formats.NODE_LEDGER, "")
    # a known size over the quota fails every node in filter, with the reason
    third = api.add_pod(pod("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}, namespace="ml"))
    out = ext.filter({"Pod": third, "Nodes": {"items": [api.get_node("n1"), api.get_node("n2")]}})
    assert out["Nodes"]["items"] == [] and all("over its GPU memory" in r for r in out["FailedNodes"].values())
    # other namespaces are not held
    free = api.add_pod(pod("d", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}, namespace="web"))
    assert len(ext.filter({"Pod": free, "Nodes": {"items": nodes}})["Nodes"]["items"]) == 2


def test_bind_refuses_when_the_quota_cannot_be_read():
    class Flaky(FakeAPI):
        broken = False

        def list_resource_quotas(self, namespace=""):
            if self.broken:
                raise RuntimeError("timeout")
            return super().list_resource_quotas(namespace)
    api = Flaky()
    api.add_quota("ml", "q", {"limits.nvidia.com/gpu": "4"})
    ext, _ = _extender_with(api)
    p = api.add_pod(pod("a", {"nvidia.com/gpu": "1"}, namespace="ml"))
    api.broken = True
    err = ext.bind({"PodName": "a", "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": "n1"})["Error"]
    assert "quotas cannot be read" in err


def test_quota_metrics_show_limits_and_use():
    from prometheus_client import CollectorRegistry, generate_latest

    api = FakeAPI()
    api.add_quota("ml", "q", {"limits.nvidia.com/gpumem": "30000", "limits.nvidia.com/gpu": "3"})
    ext, nodes = _extender_with(api)
    p = api.add_pod(pod("a", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}, namespace="ml"))
    ext.filter({"Pod": p, "Nodes": {"items": nodes}})
    assert ext.bind({"PodName": "a", "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": "n1"})["Error"] == ""
    registry = CollectorRegistry()
    registry.register(quota.QuotaCollector(ext.quota, ext.granted))
    text = generate_latest(registry).decode()
    assert 'gpuslice_quota_limit{namespace="ml",quota="q: limits.nvidia.com/gpumem",resource="bytes"} 3.145728e+10' in text
    assert 'gpuslice_quota_used{namespace="ml",resource="bytes"} 8.388608e+09' in text
    assert 'gpuslice_quota_used{namespace="ml",resource="devices"} 2.0' in text


def test_a_mig_name_the_webhook_never_rewrote_is_an_error_in_filter():
    """nvidia.com/mig-<profile> is served under the advertised name only after the webhook's rewrite; a pod
    that skipped the webhook would be placed and then never allocated, so filter says why instead."""
    ext = Extender(None, CFG)
    out = ext.filter({"Pod": pod("raw", {"nvidia.com/mig-1g.10gb": "1"}), "Nodes": {"items": [node("n1")]}})
    assert "nvidia.com/mig-1g.10gb reached the scheduler unchanged" in out["Error"] and out["Nodes"]["items"] == []
