"""Resource names (HAMi's, configurable, and gpuslice's own) and their checks."""

from __future__ import annotations

import pytest
from kubefixtures import pod

from gpuslice.kube import podrequest, resources
from gpuslice.spec import GiB, MemoryAmount, MiB, Priority, SpecError

from .test_podrequest import _one

CFG = resources.KubeConfig()


def test_resource_names_are_configurable():
    names = resources.ResourceNames.configured(count="example.com/vgpu", memory="example.com/vmem",
                                           memory_percentage="example.com/vmem-pct", cores="example.com/vcores",
                                           priority="example.com/prio")
    assert names.advertised == "example.com/vgpu" and names.count == ("example.com/vgpu", "gpuslice.io/gpu")
    cfg = resources.KubeConfig(names=names)
    r = _one({"example.com/vgpu": "2", "example.com/vmem": "1000", "example.com/vcores": "20",
              "example.com/prio": "0"}, cfg)
    assert r.count == 2 and r.memory == MemoryAmount(bytes=1000 * MiB) and r.compute == 20 and r.priority is Priority.HIGH
    assert _one({"example.com/vmem-pct": "50"}, cfg).memory == MemoryAmount(percent=50.0)
    assert _one({"gpuslice.io/gpu": "1", "gpuslice.io/gpu-memory": "1Gi"}, cfg).memory == MemoryAmount(bytes=GiB)
    # HAMi's names mean nothing once renamed
    assert podrequest.pod_request(pod("p", {"nvidia.com/gpu": "1"}), cfg).empty
    assert resources.ResourceNames.configured() == resources.ResourceNames()  # the defaults are HAMi's names


@pytest.mark.parametrize("kw, needle", [
    ({"count": "gpu"}, "domain/name"),
    ({"count": "kubernetes.io/gpu"}, "kubernetes.io"),
    ({"memory": "nvidia.com/gpu"}, "already used for count"),
    ({"cores": "Nvidia.com/cores"}, "domain/name"),
])
def test_bad_resource_names_are_refused(kw, needle):
    with pytest.raises(SpecError) as exc:
        resources.ResourceNames.configured(**kw)
    assert needle in str(exc.value)
