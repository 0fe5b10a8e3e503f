"""The extender's view of the CPU and memory the pods on each node request (gpuslice.kube.extender.usage): counted
as kube-scheduler counts a pod, followed from a list + watch and from the extender's own binds, applied to the
shared fleet's rows, and weighed by FGD — a node whose CPU is nearly gone is not where FGD sends a GPU pod."""

from __future__ import annotations

from kubefixtures import node, pod

from gpuslice.kube import podrequest, resources
from gpuslice.kube.extender import Extender
from gpuslice.kube.extender.cache import FleetIndex, ViewCache, view_of
from gpuslice.kube.extender.usage import PodUsage, pod_requests
from gpuslice.placement import PlacementPolicy, TaskShape, WorkloadMix, place
from gpuslice.spec import GiB

MiB = 1024**2


def bound(name: str, node_name: str, cpu: str, memory: str = "1Gi", phase: str = "Running") -> dict:
    p = pod(name, {"cpu": cpu, "memory": memory})
    p["spec"]["nodeName"] = node_name
    p["status"]["phase"] = phase
    return p


def test_pod_requests_follow_kube_schedulers_formula() -> None:
    p = pod("p", containers=[
        {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"name": "b", "resources": {"limits": {"cpu": "2", "memory": "512Mi"}}},  # a limit is the request
        {"name": "c"}])
    assert pod_requests(p) == (2500, GiB + 512 * MiB)
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "4", "memory": "256Mi"}}}]
    p["spec"]["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    assert pod_requests(p) == (4100, GiB + 512 * MiB + 64 * MiB)


def test_usage_counts_bound_unfinished_pods_and_reports_changes() -> None:
    u = PodUsage()
    v0, _ = u.changes_since(-1)
    u.put(bound("a", "n1", "2"))
    u.put(bound("b", "n1", "1500m"))
    u.put(bound("done", "n1", "8", phase="Succeeded"))
    u.put(pod("pending", {"cpu": "3"}))  # not bound: counts nowhere
    assert u.usage("n1") == (3500, 2 * GiB)
    u.put(bound("a", "n2", "2"))  # the same pod seen on another node (rebound after a delete/recreate)
    assert u.usage("n1") == (1500, GiB) and u.usage("n2") == (2000, GiB)
    u.remove(bound("b", "n1", "1500m"))
    _, changed = u.changes_since(v0)
    assert changed == {"n1": (0, 0), "n2": (2000, GiB)}
    u.assume(pod("new", {"cpu": "1"}), "n2")
    assert u.usage("n2") == (3000, GiB)


def test_fleet_rows_follow_usage_within_the_node(monkeypatch=None) -> None:
    views = ViewCache()
    for n in (node("n1"), node("n2")):
        views.view(n)
    u = PodUsage()
    index = FleetIndex(views, u)
    fleet = index.current()
    i = fleet.index["n1"]
    assert fleet.cpu_total[i] == 64000 and fleet.cpu_used[i] == 0
    u.put(bound("a", "n1", "10"))
    assert index.current().cpu_used[i] == 10000
    u.put(bound("b", "n1", "100"))  # a lagging view can say more than the node has: clamped, never refused
    assert index.current().cpu_used[i] == 64000 and index.current().hm_used[i] == 2 * GiB
    u.remove(bound("b", "n1", "100"))
    assert index.current().cpu_used[i] == 10000


def test_fgd_in_the_extender_weighs_the_cpu_left_on_each_node() -> None:
    """Two equal nodes; on one the pods already take 62 of 64 CPUs. The simulator's FGD (placement with the
    same CPU state and workload) sends a GPU pod needing 4 CPUs to the other — and so does the extender."""
    views = ViewCache()
    nodes = [node("busy", count=4), node("free", count=4)]
    for n in nodes:
        views.view(n)
    u = PodUsage()
    u.put(bound("cpu-hog", "busy", "62"))
    cfg = resources.KubeConfig(policy=PlacementPolicy.parse("fgd"))
    ext = Extender(None, cfg, usage=u)
    ext.views = views
    ext.index = FleetIndex(views, u)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "20", "cpu": "4",
              "memory": "8Gi"}
    p = pod("gpu-pod", limits)
    args = {"Pod": p, "NodeNames": ["busy", "free"]}
    ext.filter(args)
    scores = {s["Host"]: s["Score"] for s in ext.prioritize(args)}
    request = podrequest.pod_request(p, cfg).containers[0].request
    mix = WorkloadMix()
    mix.observe(TaskShape.of(request, cpu_milli=4000))
    states = [ext._state_for(view_of(n), podrequest.pod_request(p, cfg)) for n in nodes]
    want = place(request, states, PlacementPolicy.parse("fgd"), workload=mix.workload(), cpu_milli=4000,
                 host_memory=8 * GiB).node
    assert want == "free" and scores["free"] == 10 and scores["busy"] < 10, scores


def test_refresh_lists_bound_pods_and_drops_the_ones_gone() -> None:
    class Api:
        def __init__(self):
            self.items = [bound("a", "n1", "1"), bound("b", "n1", "2")]

        def list_pods_at(self, field_selector="", resource_version=""):
            return list(self.items), "7"

    api = Api()
    u = PodUsage(api)  # type: ignore[arg-type]
    assert u.refresh() == "7" and u.usage("n1") == (3000, 2 * GiB)
    api.items = api.items[:1]
    u.refresh()
    assert u.usage("n1") == (1000, GiB)


def test_every_new_gpu_pod_for_our_scheduler_counts_once_in_the_learnt_workload() -> None:
    """Also the pods kube-scheduler turns away itself (no node has the CPU) and never sends to the extender: the
    simulator's workload counts every arrival."""
    u = PodUsage()
    ext = Extender(None, resources.KubeConfig(policy=PlacementPolicy.parse("fgd")), usage=u)
    big = pod("big", {"nvidia.com/gpu": "8", "cpu": "500"})
    big["spec"]["schedulerName"] = "gpuslice-scheduler"
    other = pod("other", {"nvidia.com/gpu": "1"})  # another scheduler's (default-scheduler)
    done = pod("done", {"nvidia.com/gpu": "1"})
    done["spec"]["schedulerName"] = "gpuslice-scheduler"
    done["status"]["phase"] = "Succeeded"
    for p in (big, other, done, big):
        u.on_pod(p)  # type: ignore[misc]
    ext.filter({"Pod": big, "NodeNames": []})  # and then filtered: still one arrival
    assert ext.mix.seen == 1
    ((shape, count),) = ext.mix.counts.items()
    assert (shape.count, shape.cpu_milli, count) == (8, 500000, 1.0)
