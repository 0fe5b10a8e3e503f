"""HAMi's annotations beyond resource names (gpuslice.kube.hami): what is read, what is refused and why."""

from __future__ import annotations

import pytest
from kubefixtures import pod

from gpuslice.kube import hami, podrequest, resources
from gpuslice.spec import SpecError

CFG = resources.KubeConfig()


@pytest.mark.parametrize("value, order, mutex, numa", [
    ("binpack", "binpack", False, False), ("spread,numa", "spread", False, True), ("binpack, numa", "binpack", False, True),
    ("mutex", None, True, False), ("binpack,mutex", "binpack", True, False), ("topology-aware", "topology-aware", False, False),
    ("spread,topology-aware", "spread", False, False), ("NUMA,Spread", "spread", False, True), ("fgd", "fgd", False, False),
])
def test_gpu_policy_reads_hamis_comma_lists(value, order, mutex, numa):
    assert hami.gpu_policy(value) == hami.GpuPolicy(order, mutex, numa)


@pytest.mark.parametrize("value", ["", "binpack,", "binpack,spread", "closest", "binpack,,numa", "mutex,fgd,random"])
def test_gpu_policy_refuses_what_it_cannot_apply(value):
    with pytest.raises(SpecError) as exc:
        hami.gpu_policy(value)
    assert exc.value.field == "metadata.annotations[hami.io/gpu-scheduler-policy]" and "numa" in exc.value.allowed


def test_vgpu_mode_mps_is_the_spatial_engine():
    """Issue 14: HAMi's MPS mode, refused while gpuslice had no MPS-backed slices, now asks for them."""
    assert hami.vgpu_mode({}) == "" and hami.vgpu_mode({"nvidia.com/vgpu-mode": "MIG"}) == "mig"
    assert hami.vgpu_mode({"nvidia.com/vgpu-mode": "MPS"}) == "mps"
    with pytest.raises(SpecError) as exc:
        hami.vgpu_mode({"nvidia.com/vgpu-mode": "vgpu"})
    assert "hami-core, mig or mps" in exc.value.allowed


def test_numa_bind_and_weights():
    assert hami.numa_bind({"nvidia.com/numa-bind": "True"}) and not hami.numa_bind({"nvidia.com/numa-bind": "false"})
    with pytest.raises(SpecError):
        hami.numa_bind({"nvidia.com/numa-bind": "yes"})
    assert hami.scoring_weights({"hami.io/device-scoring-weights": " memory=3, slot=1,core=0"}) == (1, 0, 3)
    for bad in ("slot=1,core=1", "slot=1,core=1,memory=1,slot=2", "slot=0,core=0,memory=0", "slot=-1,core=1,memory=1",
                "slot=1,core=1,memory=x", "slot=1;core=1;memory=1", "slot=1,core=1,memory=1001"):
        with pytest.raises(SpecError) as exc:
            hami.scoring_weights({"hami.io/device-scoring-weights": bad})
        assert "each key once" in exc.value.allowed, bad


def test_mig_names_and_profiles():
    assert hami.mig_profile_of("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert hami.mig_profile_of("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    assert hami.mig_profile_of("nvidia.com/gpu") == "" and hami.mig_profile_of("nvidia.com/mig-big") == ""
    assert hami.mig_profiles({"gpuslice.io/mig-profile": "3g.40gb"}) == {"": "3g.40gb"}
    assert hami.mig_profiles({"gpuslice.io/mig-profile": "a=1g.10gb, b=2g.20gb"}) == {"a": "1g.10gb", "b": "2g.20gb"}
    assert hami.encode_mig_profiles({"b": "2g.20gb", "a": "1g.10gb"}) == "a=1g.10gb,b=2g.20gb"
    for bad in ("a=1g.10gb,a=2g.20gb", "a=big", "=1g.10gb", "3g"):
        with pytest.raises(SpecError):
            hami.mig_profiles({"gpuslice.io/mig-profile": bad})


def test_mig_requests_from_names_mode_and_annotation():
    """nvidia.com/mig-<profile>: N instances of it; vgpu-mode mig: the count, and the memory as the least
    each instance must have; gpuslice.io/mig-profile: that profile. Always whole instances."""
    req = podrequest.pod_request(pod("p", {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/priority": "0"}), CFG)
    (c,) = req.containers
    assert c.mig == podrequest.MigAsk(count=2, profile="1g.10gb", resource="nvidia.com/mig-1g.10gb")
    assert c.request.count == 2 and c.request.exclusive and c.request.models == ("1g.10gb",) and c.request.priority == 0
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "20"},
                                     annotations={"nvidia.com/vgpu-mode": "mig"}), CFG)
    (c,) = req.containers
    assert c.mig.count == 2 and c.mig.memory.bytes == 8000 * 2**20 and c.mig.profile == "" and c.request.models == ()
    assert any("a MIG instance is held whole" in n for n in req.notes)
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"gpuslice.io/mig-profile": "main=3g.40gb"}), CFG)
    assert req.containers[0].mig.profile == "3g.40gb" and req.mode == ""
    for limits, anns, needle in (
            ({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}, {}, "alone"),
            ({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}, {}, "one MIG profile"),
            ({"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/vgpu-mode": "hami-core"}, "hami-core mode never uses"),
            ({"nvidia.com/gpu": "1"}, {"gpuslice.io/mig-profile": "side=1g.10gb"}, "no GPU container named side")):
        with pytest.raises(SpecError) as exc:
            podrequest.pod_request(pod("p", limits, annotations=anns), CFG)
        assert needle in str(exc.value), (limits, anns)


def test_privileged_gpu_container_is_refused_but_a_privileged_cpu_container_is_not():
    p = pod("p", {"nvidia.com/gpu": "1"})
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(SpecError) as exc:
        podrequest.pod_request(p, CFG)
    assert exc.value.field == "spec.containers[0](main).securityContext.privileged"
    p = pod("p", {"cpu": "1"})
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    assert podrequest.pod_request(p, CFG).empty


def test_gpumem_percentage_zero_is_the_default_memory_with_a_warning():
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpumem-percentage": "0"}), resources.KubeConfig(default_memory_mib=2048))
    (c,) = req.containers
    assert c.request.count == 1 and c.request.memory.bytes == 2048 * 2**20
    assert "0 reserves nothing" in req.notes[0]


def test_weights_apply_to_binpack_and_spread_and_are_noted_elsewhere():
    anns = {"hami.io/device-scoring-weights": "slot=1,core=1,memory=3"}
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations=anns), CFG)
    assert req.policy.weights == (1, 1, 3) and req.policy.gpu == "binpack" and req.simple and not req.notes
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={**anns, "gpuslice.io/gpu-policy": "fgd"}), CFG)
    assert "is ignored" in req.notes[0]


def test_index_annotations():
    req = podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gpuindexes": "0, 2"}), CFG)
    assert req.use_indexes == (0, 2) and not req.simple
    with pytest.raises(SpecError):
        podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gpuindexes": "GPU-1"}), CFG)
