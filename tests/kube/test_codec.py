"""The annotation codec and the parsing of pod requests from resource names."""

from __future__ import annotations

import json

import pytest
from kubefixtures import H100, devices, node, pod

from gpuslice.kube import codec
from gpuslice.placement import PlacementPolicy
from gpuslice.spec import ComputeMode, GiB, MiB, MemoryAmount, MigInstance, Device, Priority, Slice, SpecError

CFG = codec.KubeConfig()


def test_node_devices_round_trip_keeps_topology_mig_and_health():
    devs = devices("n1", 2)
    mig = Device(uuid="GPU-mig-parent", index=2, name="NVIDIA A100 80GB", memory_total=80 * GiB, sm_count=108,
                 model="A100-80GB", numa_node=1, nvlink_peers=(devs[0].uuid,), mig_enabled=True,
                 mig_instances=(MigInstance("MIG-aaaa", "3g.40gb", 40 * GiB, 42),), extra={"minor": 2})
    text = codec.encode_node_devices([*devs, mig], health={devs[1].uuid: codec.UNHEALTHY}, split_count=4,
                                     memory_scaling=1.5, now=1000.0)
    back = codec.decode_node_devices(text)
    assert [d.uuid for d in back.devices] == [devs[0].uuid, devs[1].uuid, "GPU-mig-parent"]
    assert back.devices[2].mig_instances == mig.mig_instances and back.devices[2].nvlink_peers == (devs[0].uuid,)
    assert back.devices[2].extra["minor"] == 2 and back.devices[0].memory_total == H100
    assert back.split_count == 4 and back.memory_scaling == 1.5 and back.updated == 1000.0
    assert not back.healthy(devs[1].uuid) and back.healthy(devs[0].uuid)
    assert json.loads(text)["version"] == 1


@pytest.mark.parametrize("text, field", [
    ("not json", "gpuslice.io/devices"),
    ('{"version": 2, "devices": []}', "gpuslice.io/devices.version"),
    ('{"version": 1, "devices": [{"uuid": "GPU-1", "memory": -5}]}', "gpuslice.io/devices.devices[0].memory"),
    ('{"version": 1, "devices": [{"uuid": "GPU-1", "memory": 5, "health": "meh"}]}',
     "gpuslice.io/devices.devices[0].health"),
    ('{"version": 1, "devices": [{"memory": 5}]}', "gpuslice.io/devices.devices[0].uuid"),
    ('{"version": 1, "devices": "x"}', "gpuslice.io/devices.devices"),
])
def test_bad_node_devices_name_the_field(text, field):
    with pytest.raises(SpecError) as exc:
        codec.decode_node_devices(text)
    assert exc.value.field == field


def _grant(uid="u1", node="n1", uuid="GPU-1", memory=4 * GiB, compute=30):
    return codec.PodGrant(node=node, pod_uid=uid, namespace="ns", pod="p", bound_at=12.5, containers=(
        codec.ContainerGrant("main", codec.grant_id_for(uid, "main"),
                             (Slice(uuid, memory, compute, Priority.HIGH, ComputeMode.SOFT, 3),)),))


def test_pod_grant_and_ledger_round_trip():
    g = _grant()
    assert codec.decode_pod_grant(codec.encode_pod_grant(g)) == g
    led = codec.Ledger({}).with_entry(g).with_entry(_grant("u2", memory=GiB))
    back = codec.decode_ledger(codec.encode_ledger(led), "n1")
    assert back.entries == led.entries
    assert len(back.without(["u1"]).entries) == 1
    slices, exclusive = back.slices()
    assert sum(s.memory_limit for s in slices) == 5 * GiB and exclusive == set()
    assert codec.decode_ledger(None, "n1").entries == {}


def test_bad_grant_names_the_field():
    data = json.loads(codec.encode_pod_grant(_grant()))
    data["containers"][0]["slices"][0]["compute"] = 130
    with pytest.raises(SpecError) as exc:
        codec.decode_pod_grant(json.dumps(data))
    assert exc.value.field == "gpuslice.io/grant.containers[0].slices[0].compute"


def test_node_state_counts_ledger_and_blocks_unhealthy_devices():
    devs = devices("n1", 2)
    nd = codec.decode_node_devices(codec.encode_node_devices(devs, health={devs[1].uuid: codec.UNHEALTHY}))
    led = codec.Ledger({}).with_entry(_grant(uuid=devs[0].uuid, memory=10 * GiB, compute=40))
    st = codec.node_state("n1", nd, led)
    assert st.devices[0].used_memory == 10 * GiB and st.devices[0].used_compute == 40
    assert st.devices[1].free_memory == 0  # unhealthy: nothing new lands there


@pytest.mark.parametrize("scaling", [1.0, 0.9, 2.0])
def test_a_lost_gpu_with_live_grants_is_a_phantom_not_a_broken_node(scaling):
    """The ledger names a GPU the node no longer publishes (lost, or an agent restarted without it): the
    node keeps taking slices on its other devices; the lost one takes nothing and its grants still count."""
    devs = devices("n1", 2)
    nd = codec.decode_node_devices(codec.encode_node_devices(devs, memory_scaling=scaling))
    led = (codec.Ledger({}).with_entry(_grant("u1", uuid="GPU-gone", memory=60 * GiB, compute=60))
           .with_entry(_grant("u2", uuid="GPU-gone", memory=5 * GiB, compute=10))
           .with_entry(_grant("u3", uuid=devs[0].uuid, memory=GiB)))
    st = codec.node_state("n1", nd, led)
    by = {d.uuid: d for d in st.devices}
    assert set(by) == {devs[0].uuid, devs[1].uuid, "GPU-gone"}
    ghost = by["GPU-gone"]
    assert (ghost.used_memory, ghost.used_compute, ghost.slice_count) == (65 * GiB, 70, 2)  # held
    assert ghost.exclusive_taken and ghost.free_memory == 0 and ghost.model == codec.PHANTOM
    assert by[devs[0].uuid].used_memory == GiB and not by[devs[1].uuid].exclusive_taken
    from gpuslice.placement import place
    from gpuslice.spec import MemoryAmount as M, Request

    p = place(Request(count=2, memory=M(bytes=GiB)), [st])  # the two real GPUs, never the phantom
    assert {s.device_uuid for s in p.slices} == {devs[0].uuid, devs[1].uuid}
    # the GPU comes back: the same grants count on it again, nothing phantom remains
    back = codec.decode_node_devices(codec.encode_node_devices(
        [*devs, Device(uuid="GPU-gone", index=2, name="NVIDIA H100 80GB HBM3", memory_total=devs[0].memory_total,
                       sm_count=132, model=devs[0].model)], memory_scaling=scaling))
    st = codec.node_state("n1", back, led)
    assert {d.uuid: d.used_memory for d in st.devices}["GPU-gone"] == 65 * GiB
    assert not any(d.model == codec.PHANTOM for d in st.devices)


# ------------------------------------------------------------------------------ pod requests
def _one(limits, cfg=CFG, **kw):
    req = codec.pod_request(pod("p", limits, **kw), cfg)
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
    cfg = codec.KubeConfig(default_memory_mib=1024, default_cores=20, default_gpu_num=2)
    r = _one({"nvidia.com/gpucores": "10"}, cfg)
    assert r.count == 2 and r.memory == MemoryAmount(bytes=1024 * MiB) and r.compute == 10
    assert _one({"nvidia.com/gpu": "1"}, cfg).compute == 20
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}).exclusive


def test_default_gpu_num_zero_leaves_a_container_without_count_as_non_gpu():
    """HAMi (mutateContainerResource): memory/cores but no count and defaultGPUNum 0 -> not a GPU
    container; we say so in a note (the webhook's admission warning) instead of refusing the pod."""
    cfg = codec.KubeConfig(default_gpu_num=0)
    req = codec.pod_request(pod("p", {"nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"}), cfg)
    assert req.empty
    (note,) = req.notes
    assert "nvidia.com/gpumem" in note and "nvidia.com/gpucores" in note and "defaultGPUNum is 0" in note
    assert note.startswith("spec.containers[0](main)")
    # with a count the container is a GPU container as usual
    assert not codec.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}), cfg).empty


def test_priority_follows_hami():
    """HAMi passes any whole number on (its test uses 5); HAMi-core knows 0 (high) and the rest (low)."""
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}).priority is Priority.HIGH
    for value in ("1", "5", "100"):
        assert _one({"nvidia.com/gpu": "1", "nvidia.com/priority": value}).priority is Priority.LOW
    assert _one({"nvidia.com/gpu": "1"}).priority is Priority.LOW  # HAMi's default: 1
    # a priority without any GPU request: HAMi sets its env var on a container with no GPU; nothing to do
    req = codec.pod_request(pod("p", {"nvidia.com/priority": "0", "cpu": "1"}), CFG)
    assert req.empty and "nvidia.com/priority is ignored" in req.notes[0]


def test_gpucores_100_takes_the_card_whole_even_with_a_memory_size():
    """HAMi: "Coresreq=100 indicates it want this card exclusively" (the card must be unused, and nothing
    fits after it) — also with gpumem given; the slice keeps the memory limit that was asked."""
    r = _one({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "100"})
    assert r.exclusive and r.memory == MemoryAmount(bytes=3000 * MiB) and r.compute == 100
    assert _one({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "99"}).exclusive is False
    assert _one({"nvidia.com/gpu": "1"}, codec.KubeConfig(default_cores=100)).exclusive  # HAMi defaultCores: 100


def test_no_gpu_is_empty():
    assert codec.pod_request(pod("p", {"cpu": "1"}), CFG).empty
    assert codec.pod_request(pod("p", {"nvidia.com/gpu": "0"}), CFG).empty


@pytest.mark.parametrize("limits, needle", [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpumem-percentage": "50"}, "not both"),
    ({"nvidia.com/gpu": "1", "gpuslice.io/gpu": "2"}, "contradict"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}, "1 to 100"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}, "0 to 100"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}, "MiB"),
    ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"}, "at least 1"),
    ({"nvidia.com/gpu": "1", "nvidia.com/priority": "-1"}, "0 = high priority, 1 or more = low"),
    ({"nvidia.com/gpu": "lots"}, "Kubernetes quantity"),
])
def test_contradictions_name_the_field(limits, needle):
    with pytest.raises(SpecError) as exc:
        codec.pod_request(pod("p", limits), CFG)
    assert needle in str(exc.value)
    assert exc.value.field.startswith("spec.containers[0]")


def test_pod_policy_annotations():
    r = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"hami.io/node-scheduler-policy": "spread",
                                                                       "gpuslice.io/gpu-policy": "fgd"}), CFG)
    assert r.policy == PlacementPolicy(node="spread", gpu="fgd")
    r = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/policy": "bestfit"}), CFG)
    assert r.policy.node == "bestfit" and r.policy.gpu == "bestfit"
    with pytest.raises(SpecError) as exc:
        codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/node-policy": "closest"}), CFG)
    assert exc.value.field == "metadata.annotations[gpuslice.io/node-policy]" and "binpack" in exc.value.allowed
    r = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/compute-mode": "soft",
                                                                       "nvidia.com/use-gputype": "A100|H100"}), CFG)
    assert r.containers[0].request.mode is ComputeMode.SOFT and r.containers[0].request.models == ("A100", "H100")


def test_init_containers_with_gpus_are_refused():
    p = pod("p", {"nvidia.com/gpu": "1"})
    p["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    with pytest.raises(SpecError) as exc:
        codec.pod_request(p, CFG)
    assert exc.value.field.startswith("spec.initContainers[0]")


def test_request_annotation_round_trip():
    req = codec.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}), CFG)
    back = codec.decode_pod_request(codec.encode_pod_request(req))
    assert back == [("main", req.containers[0].request)]


def test_blocked_devices_from_hami_annotations():
    nd = codec.decode_node_devices(node("n1", 2)["metadata"]["annotations"][codec.NODE_DEVICES])
    uuids = [d.uuid for d in nd.devices]
    req = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gpuuuid": uuids[1]}), CFG)
    assert codec.blocked_devices(nd, req) == {uuids[0]}
    req = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gpuuuid": uuids[1]}), CFG)
    assert codec.blocked_devices(nd, req) == {uuids[1]}
    req = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "H100-80GB-HBM3"}), CFG)
    assert codec.blocked_devices(nd, req) == set(uuids)


@pytest.mark.parametrize("pattern, hit", [
    ("H100", True), ("h100", True), ("80GB HBM3", True), ("H100-80GB", True), ("NVIDIA", True),
    ("NVIDIA-NVIDIA H100", True), ("A100", False), ("H100 PCIe", False), ("A100,H100", True), ("V100|h100", True),
])
def test_gpu_type_annotations_match_a_substring_of_the_card_type_like_hami(pattern, hit):
    """HAMi's checkGPUtype: upper-cased card type contains the upper-cased entry. Discovery names an H100
    model H100-80GB-HBM3 (NVML name "NVIDIA H100 80GB HBM3"), so use-gputype: H100 must match it."""
    devs = devices("n1", 2)  # model H100-80GB-HBM3, name NVIDIA H100 80GB HBM3
    nd = codec.decode_node_devices(codec.encode_node_devices(devs))
    use = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": pattern}), CFG)
    resolved = codec.resolve_gpu_types(use, codec.device_kinds(nd.devices))
    models = resolved.containers[0].request.models
    assert (models == ("H100-80GB-HBM3",)) is hit
    if not hit:  # nothing matches: the patterns stay, so placement finds nothing and names them
        assert models == use.containers[0].request.models
    avoid = codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": pattern}), CFG)
    assert codec.blocked_devices(nd, avoid) == ({d.uuid for d in devs} if hit else set())


def test_use_gputype_picks_among_models_and_keeps_placement_exact():
    """Two models on one node: "A100" allows only the A100 (placement keeps its exact models rule)."""
    from gpuslice.placement import NoFit, place

    a100 = Device(uuid="GPU-a", index=0, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108,
                  model="A100-SXM4-80GB")
    h100 = devices("n1", 1)[0]
    nd = codec.decode_node_devices(codec.encode_node_devices([h100, a100]))
    st = codec.node_state("n1", nd, codec.Ledger({}))
    req = codec.pod_request(pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
                                annotations={"nvidia.com/use-gputype": "a100"}), CFG)
    req = codec.resolve_gpu_types(req, codec.device_kinds(nd.devices))
    assert req.containers[0].request.models == ("A100-SXM4-80GB",)
    assert place(req.containers[0].request, [st]).slices[0].device_uuid == "GPU-a"
    none = codec.resolve_gpu_types(codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={
        "nvidia.com/use-gputype": "V100"}), CFG), codec.device_kinds(nd.devices))
    with pytest.raises(NoFit) as exc:
        place(none.containers[0].request, [st])
    assert "V100" in exc.value.reason


def test_resource_names_are_configurable():
    names = codec.ResourceNames.configured(count="example.com/vgpu", memory="example.com/vmem",
                                           memory_percentage="example.com/vmem-pct", cores="example.com/vcores",
                                           priority="example.com/prio")
    assert names.advertised == "example.com/vgpu" and names.count == ("example.com/vgpu", "gpuslice.io/gpu")
    cfg = codec.KubeConfig(names=names)
    r = _one({"example.com/vgpu": "2", "example.com/vmem": "1000", "example.com/vcores": "20",
              "example.com/prio": "0"}, cfg)
    assert r.count == 2 and r.memory == MemoryAmount(bytes=1000 * MiB) and r.compute == 20 and r.priority is Priority.HIGH
    assert _one({"example.com/vmem-pct": "50"}, cfg).memory == MemoryAmount(percent=50.0)
    assert _one({"gpuslice.io/gpu": "1", "gpuslice.io/gpu-memory": "1Gi"}, cfg).memory == MemoryAmount(bytes=GiB)
    # HAMi's names mean nothing once renamed
    assert codec.pod_request(pod("p", {"nvidia.com/gpu": "1"}), cfg).empty
    assert codec.ResourceNames.configured() == codec.ResourceNames()  # the defaults are HAMi's names


@pytest.mark.parametrize("kw, needle", [
    ({"count": "gpu"}, "domain/name"),
    ({"count": "kubernetes.io/gpu"}, "kubernetes.io"),
    ({"memory": "nvidia.com/gpu"}, "already used for count"),
    ({"cores": "Nvidia.com/cores"}, "domain/name"),
])
def test_bad_resource_names_are_refused(kw, needle):
    with pytest.raises(SpecError) as exc:
        codec.ResourceNames.configured(**kw)
    assert needle in str(exc.value)


def test_allocated_marks():
    assert codec.decode_allocated(codec.encode_allocated(["b", "a", "a"])) == {"a", "b"}
    assert codec.decode_allocated(None) == set()


def test_allocation_lock_annotation_round_trips_and_names_bad_fields():
    assert codec.decode_allocating(codec.encode_allocating(["b", "a", "a"])) == {"a", "b"}
    assert codec.encode_allocating(["b", "a"]) == '{"pods":["a","b"],"version":1}'
    assert codec.encode_allocating([]) is None  # no holder: the key is deleted, not left empty
    assert codec.decode_allocating(None) == frozenset()
    for bad, field in (('{"version": 1, "pods": "u1"}', "gpuslice.io/allocating.pods"),
                       ('{"version": 1, "pods": [""]}', "gpuslice.io/allocating.pods"),
                       ('{"version": 2, "pods": []}', "gpuslice.io/allocating.version"),
                       ("[]", "gpuslice.io/allocating")):
        with pytest.raises(SpecError) as exc:
            codec.decode_allocating(bad)
        assert exc.value.field == field, bad
