"""A pod's GPU request from its resource limits and annotations, HAMi's rules and defaults."""

from __future__ import annotations

import pytest
from kubefixtures import devices, node, pod

from gpuslice.kube import formats, nodestate, podrequest, resources
from gpuslice.placement import PlacementPolicy
from gpuslice.spec import ComputeMode, Device, GiB, MemoryAmount, MiB, Priority, SpecError, request_from_json, request_to_json

CFG = resources.KubeConfig()


# ------------------------------------------------------------------------------ pod requests
def _one(limits, cfg=CFG, **kw):
    req = podrequest.pod_request(pod("p", limits, **kw), cfg)
    assert len(req.containers) == 1
    return req.containers[0].request


def test_hami_names_parse():
    r = _one({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30",
              "nvidia.com/priority": "0"})
    assert r.count == 1 and r.memory == MemoryAmount(bytes=3000 * MiB) and r.compute == 30
    assert r.priority is Priority.HIGH and not r.exclusive
    # the API server stores quantities canonically: 3000 arrives as "3k"
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}).memory == MemoryAmount(bytes=3000 * MiB)


def test_percentage_and_our_names():
    r = _one({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})
    assert r.memory == MemoryAmount(percent=50.0)
    r = _one({"gpuslice.io/gpu": "1", "gpuslice.io/gpu-memory": "4Gi", "gpuslice.io/gpu-compute": "25"})
    assert r.memory == MemoryAmount(bytes=4 * GiB) and r.compute == 25


def test_defaults_follow_hami():
    # memory without a count: defaultGPUNum devices; no memory: the whole device; no cores: defaultCores
    r = _one({"nvidia.com/gpumem": "2000"})
    assert r.count == 1
    assert _one({"nvidia.com/gpu": "1"}).memory is None
    cfg = resources.KubeConfig(default_memory_mib=1024, default_cores=20, default_gpu_num=2)
    r = _one({"nvidia.com/gpucores": "10"}, cfg)
    assert r.count == 2 and r.memory == MemoryAmount(bytes=1024 * MiB) and r.compute == 10
    assert _one({"nvidia.com/gpu": "1"}, cfg).compute == 20
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}).exclusive


def test_compute_only_containers_share_the_device():
    """gpuslice's one departure from HAMi (issue 12): cores without memory and without defaultMem get the same
    percent of each device's memory, not the whole card, so a second compute-only container still fits; the
    note (an admission warning) says so. An explicit 100 % memory, defaultMem, cores 100 and no cores keep
    HAMi's meaning."""
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}), CFG)
    r = req.containers[0].request
    assert r.memory == MemoryAmount(percent=30.0) and r.compute == 30 and not r.exclusive
    (note,) = req.notes
    assert "30% of each device's memory" in note and "nvidia.com/gpumem" in note and "defaultMem" in note
    assert _one({"nvidia.com/gpu": "2", "gpuslice.io/gpu-compute": "25"}).memory == MemoryAmount(percent=25.0)
    # the cluster's default cores make a plain GPU container compute-only as well
    assert _one({"nvidia.com/gpu": "1"}, resources.KubeConfig(default_cores=20)).memory == MemoryAmount(percent=20.0)
    # what was asked for, or the cluster's defaultMem, stands
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem-percentage": "100"}).memory is None
    cfg = resources.KubeConfig(default_memory_mib=2048)
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, cfg).memory == MemoryAmount(bytes=2048 * MiB)
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}).memory is None  # exclusive: the whole card
    assert _one({"nvidia.com/gpu": "1"}).memory is None  # no compute share: the whole device, as HAMi
    assert not podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000",
                                                "nvidia.com/gpucores": "30"}), CFG).notes


def test_default_gpu_num_zero_leaves_a_container_without_count_as_non_gpu():
    """HAMi (mutateContainerResource): memory/cores but no count and defaultGPUNum 0 -> not a GPU
    container; we say so in a note (the webhook's admission warning) instead of refusing the pod."""
    cfg = resources.KubeConfig(default_gpu_num=0)
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"}), cfg)
    assert req.empty
    (note,) = req.notes
    assert "nvidia.com/gpumem" in note and "nvidia.com/gpucores" in note and "defaultGPUNum is 0" in note
    assert note.startswith("spec.containers[0](main)")
    # with a count the container is a GPU container as usual
    assert not podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}), cfg).empty


def test_priority_follows_hami():
    """HAMi passes any whole number on (its test uses 5); HAMi-core knows 0 (high) and the rest (low)."""
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}).priority is Priority.HIGH
    for value in ("1", "5", "100"):
        assert _one({"nvidia.com/gpu": "1", "nvidia.com/priority": value}).priority is Priority.LOW
    assert _one({"nvidia.com/gpu": "1"}).priority is Priority.LOW  # HAMi's default: 1
    # a priority without any GPU request: HAMi sets its env var on a container with no GPU; nothing to do
    req = podrequest.pod_request(pod("p", {"nvidia.com/priority": "0", "cpu": "1"}), CFG)
    assert req.empty and "nvidia.com/priority is ignored" in req.notes[0]


def test_gpucores_100_takes_the_card_whole_even_with_a_memory_size():
    """HAMi: "Coresreq=100 indicates it want this card exclusively" (the card must be unused, and nothing
    fits after it) — also with gpumem given; the slice keeps the memory limit that was asked."""
    r = _one({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "100"})
    assert r.exclusive and r.memory == MemoryAmount(bytes=3000 * MiB) and r.compute == 100
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "99"}).exclusive is False
    assert _one({"nvidia.com/gpu": "1"}, resources.KubeConfig(default_cores=100)).exclusive  # HAMi defaultCores: 100


def test_no_gpu_is_empty():
    assert podrequest.pod_request(pod("p", {"cpu": "1"}), CFG).empty
    assert podrequest.pod_request(pod("p", {"nvidia.com/gpu": "0"}), CFG).empty


@pytest.mark.parametrize("limits, needle", [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpumem-percentage": "50"}, "not both"),
    ({"nvidia.com/gpu": "1", "gpuslice.io/gpu": "2"}, "contradict"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}, "from 0 to 100"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}, "0 to 100"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}, "MiB"),
    ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"}, "at least 1"),
    ({"nvidia.com/gpu": "1", "nvidia.com/priority": "-1"}, "0 = high priority, 1 or more = low"),
    ({"nvidia.com/gpu": "lots"}, "Kubernetes quantity"),
])
def test_contradictions_name_the_field(limits, needle):
    with pytest.raises(SpecError) as exc:
        podrequest.pod_request(pod("p", limits), CFG)
    assert needle in str(exc.value)
    assert exc.value.field.startswith("spec.containers[0]")


def test_pod_policy_annotations():
    r = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"hami.io/node-scheduler-policy": "spread",
                                                                       "gpuslice.io/gpu-policy": "fgd"}), CFG)
    assert r.policy == PlacementPolicy(node="spread", gpu="fgd")
    r = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/policy": "bestfit"}), CFG)
    assert r.policy.node == "bestfit" and r.policy.gpu == "bestfit"
    with pytest.raises(SpecError) as exc:
        podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/node-policy": "closest"}), CFG)
    assert exc.value.field == "metadata.annotations[gpuslice.io/node-policy]" and "binpack" in exc.value.allowed
    r = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/compute-mode": "soft",
                                                                       "nvidia.com/use-gputype": "A100|H100"}), CFG)
    assert r.containers[0].request.mode is ComputeMode.SOFT and r.containers[0].request.models == ("A100", "H100")


def test_init_containers_and_sidecars_ask_for_gpus_like_app_containers():
    """HAMi mutates and counts GPU init containers; a native sidecar (restartPolicy Always) is one too.
    They come first, in spec order: the order the kubelet allocates devices in."""
    p = pod("p", {"nvidia.com/gpu": "1"})
    p["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"limits": {"nvidia.com/gpumem": "2000"}}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "plain", "image": "busybox"}]
    req = podrequest.pod_request(p, CFG)
    assert [(c.name, c.kind, c.index, c.part) for c in req.containers] == [
        ("fetch", "init", 0, "initContainers"), ("proxy", "sidecar", 1, "initContainers"), ("main", "app", 0, "containers")]
    assert req.containers[0].request.memory == MemoryAmount(bytes=2000 * MiB) and req.containers[0].request.count == 1
    assert not req.simple


def test_request_json_round_trip():
    """The request of a container survives the one JSON spelling (spec.codec) unchanged."""
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}), CFG)
    back = request_from_json(request_to_json(req.containers[0].request))
    assert [("main", back)] == [("main", req.containers[0].request)]


def test_blocked_devices_from_hami_annotations():
    nd = formats.decode_node_devices(node("n1", 2)["metadata"]["annotations"][formats.NODE_DEVICES])
    uuids = [d.uuid for d in nd.devices]
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gpuuuid": uuids[1]}), CFG)
    assert podrequest.blocked_devices(nd, req) == {uuids[0]}
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gpuuuid": uuids[1]}), CFG)
    assert podrequest.blocked_devices(nd, req) == {uuids[1]}
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "H100-80GB-HBM3"}), CFG)
    assert podrequest.blocked_devices(nd, req) == set(uuids)


@pytest.mark.parametrize("pattern, hit", [
    ("H100", True), ("h100", True), ("80GB HBM3", True), ("H100-80GB", True), ("NVIDIA", True),
    ("NVIDIA-NVIDIA H100", True), ("A100", False), ("H100 PCIe", False), ("A100,H100", True), ("V100|h100", True),
])
def test_gpu_type_annotations_match_a_substring_of_the_card_type_like_hami(pattern, hit):
    """HAMi's checkGPUtype: upper-cased card type contains the upper-cased entry. Discovery names an H100
    model H100-80GB-HBM3 (NVML name "NVIDIA H100 80GB HBM3"), so use-gputype: H100 must match it."""
    devs = devices("n1", 2)  # model H100-80GB-HBM3, name NVIDIA H100 80GB HBM3
    nd = formats.decode_node_devices(formats.encode_node_devices(devs))
    use = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": pattern}), CFG)
    resolved = podrequest.resolve_gpu_types(use, podrequest.device_kinds(nd.devices))
    models = resolved.containers[0].request.models
    assert (models == ("H100-80GB-HBM3",)) is hit
    if not hit:  # nothing matches: the patterns stay, so placement finds nothing and names them
        assert models == use.containers[0].request.models
    avoid = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": pattern}), CFG)
    assert podrequest.blocked_devices(nd, avoid) == ({d.uuid for d in devs} if hit else set())


def test_use_gputype_picks_among_models_and_keeps_placement_exact():
    """Two models on one node: "A100" allows only the A100 (placement keeps its exact models rule)."""
    from gpuslice.placement import NoFit, place

    a100 = Device(uuid="GPU-a", index=0, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108,
                  model="A100-SXM4-80GB")
    h100 = devices("n1", 1)[0]
    nd = formats.decode_node_devices(formats.encode_node_devices([h100, a100]))
    st = nodestate.node_state("n1", nd, formats.Ledger({}))
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
                                annotations={"nvidia.com/use-gputype": "a100"}), CFG)
    req = podrequest.resolve_gpu_types(req, podrequest.device_kinds(nd.devices))
    assert req.containers[0].request.models == ("A100-SXM4-80GB",)
    assert place(req.containers[0].request, [st]).slices[0].device_uuid == "GPU-a"
    none = podrequest.resolve_gpu_types(podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={
        "nvidia.com/use-gputype": "V100"}), CFG), podrequest.device_kinds(nd.devices))
    with pytest.raises(NoFit) as exc:
        place(none.containers[0].request, [st])
    assert "V100" in exc.value.reason


# ------------------------------------------------------------------------------------------ engines
def _gpu_pod(annotations: dict[str, str], count: str = "1") -> dict:
    return {"metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                "nvidia.com/gpu": count, "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "25"}}}]}}


def test_the_engine_comes_from_the_annotation_hamis_mps_mode_or_the_cluster_default():
    from gpuslice.kube.podrequest import pod_request
    from gpuslice.kube.resources import KubeConfig
    from gpuslice.spec import Engine

    cfg = KubeConfig()
    engine = lambda anns, c=cfg: pod_request(_gpu_pod(anns), c).containers[0].request.engine
    assert engine({}) is Engine.TIMESLICE
    assert engine({"gpuslice.io/engine": "spatial"}) is Engine.SPATIAL
    assert engine({"nvidia.com/vgpu-mode": "mps"}) is Engine.SPATIAL
    assert engine({"nvidia.com/vgpu-mode": "mps", "gpuslice.io/engine": "spatial"}) is Engine.SPATIAL
    assert engine({}, KubeConfig(default_engine=Engine.SPATIAL)) is Engine.SPATIAL
    assert engine({"gpuslice.io/engine": "timeslice"}, KubeConfig(default_engine=Engine.SPATIAL)) is Engine.TIMESLICE
    assert pod_request(_gpu_pod({"nvidia.com/vgpu-mode": "mps"}), cfg).mode == "hami-core"  # whole GPUs only


@pytest.mark.parametrize("anns, count, field, words", [
    ({"gpuslice.io/engine": "fast"}, "1", "metadata.annotations[gpuslice.io/engine]", "timeslice or spatial"),
    ({"gpuslice.io/engine": "timeslice", "nvidia.com/vgpu-mode": "mps"}, "1",
     "metadata.annotations[gpuslice.io/engine]", "vgpu-mode: mps asks for MPS-backed"),
    ({"gpuslice.io/engine": "spatial"}, "2", "spec.containers[0](main).resources.limits", "one device's MPS daemon"),
])
def test_engine_contradictions_are_refused_naming_the_annotation(anns, count, field, words):
    from gpuslice.kube.podrequest import pod_request
    from gpuslice.kube.resources import KubeConfig

    with pytest.raises(SpecError) as exc:
        pod_request(_gpu_pod(anns, count), KubeConfig())
    assert exc.value.field == field and words in exc.value.allowed


# ------------------------------------------------------------------------------------- co-location
def _prio_pod(annotations: dict[str, str], priority: str) -> dict:
    pod_ = _gpu_pod(annotations)
    pod_["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = priority  # HAMi's resource
    return pod_


def test_colocation_comes_from_the_annotation_or_the_cluster_default():
    """gpuslice.io/colocation on any pod (HAMi's resource names included); without it the cluster's default,
    a tidal default only for low-priority hard containers."""
    from gpuslice.kube.podrequest import pod_request
    from gpuslice.spec import Colocation

    def got(anns, priority="1", cfg=CFG):
        r = pod_request(_prio_pod(anns, priority), cfg).containers[0].request
        return r.colocation, r.tidal_schedule

    assert got({}) == (Colocation.PREEMPTIVE, "")
    assert got({"gpuslice.io/colocation": "shared"}, "0") == (Colocation.SHARED, "")
    assert got({"gpuslice.io/colocation": "tidal", "gpuslice.io/tidal-schedule": "20-8:100"}) == \
        (Colocation.TIDAL, "20-8:100")
    tidal = resources.KubeConfig(default_colocation=Colocation.TIDAL)
    assert got({}, "1", tidal) == (Colocation.TIDAL, "")
    assert got({}, "0", tidal) == (Colocation.PREEMPTIVE, "")  # a high-priority server stays preemptive
    assert got({"gpuslice.io/colocation": "shared"}, "1", tidal) == (Colocation.SHARED, "")
    # the grant the extender writes carries it to the node (codec): the slice file is written from that
    req = pod_request(_prio_pod({"gpuslice.io/colocation": "tidal"}, "1"), CFG).containers[0].request
    assert request_from_json(request_to_json(req)) == req


@pytest.mark.parametrize("anns, priority, key, words", [
    ({"gpuslice.io/colocation": "polite"}, "1", "gpuslice.io/colocation", "preemptive, shared or tidal"),
    ({"gpuslice.io/colocation": "tidal"}, "0", "gpuslice.io/colocation", "low-priority slice with mode hard"),
    ({"gpuslice.io/colocation": "tidal", "gpuslice.io/compute-mode": "soft"}, "1", "gpuslice.io/colocation", "mode hard"),
    ({"gpuslice.io/tidal-schedule": "8-20:30"}, "1", "gpuslice.io/tidal-schedule", "colocation: tidal"),
    ({"gpuslice.io/colocation": "tidal", "gpuslice.io/tidal-schedule": "8-8:30"}, "1", "gpuslice.io/tidal-schedule",
     "UTC hours"),
])
def test_colocation_refusals_name_the_annotation(anns, priority, key, words):
    from gpuslice.kube.podrequest import pod_request

    with pytest.raises(SpecError) as exc:
        pod_request(_prio_pod(anns, priority), CFG)
    assert exc.value.field == f"metadata.annotations[{key}]" and words in exc.value.allowed
