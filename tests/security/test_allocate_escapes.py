"""The device plugin's Allocate checks a pod's escapes itself (attacker's review of issue 15): the webhook fails
open (failurePolicy Ignore), so a pod admitted while it was down or slow reached Allocate with LD_PRELOAD or a
mount over the enforcer's paths and got its slice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))  # kubefixtures.py, fakeapi.py

from fakeapi import FakeAPI  # noqa: E402
from kubefixtures import devices, node, pod  # noqa: E402

from gpuslice.kube import formats  # noqa: E402
from gpuslice.kube.allocator import AllocateError, Allocator, PluginConfig, device_id  # noqa: E402
from gpuslice.kube.extender import Extender  # noqa: E402


def bound(tmp_path: Path, **container) -> tuple[Allocator, str]:
    """A pod bound by the extender (its spec changed behind the webhook's back); the allocator and its device id."""
    api = FakeAPI()
    api.add_node("n0", node("n0", 1)["metadata"]["annotations"])
    p = pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"})
    p["spec"]["containers"][0].update(container)
    m = api.add_pod(p)["metadata"]
    assert Extender(api, allocation_timeout=0).bind({"PodName": "p", "PodNamespace": "default", "PodUID": m["uid"],
                                                     "Node": "n0"})["Error"] == ""
    grant = formats.decode_pod_grant(api.get_pod("default", "p")["metadata"]["annotations"][formats.POD_GRANT])
    cfg = PluginConfig(node="n0", host_state_dir=tmp_path / "st", device_nodes="none", mps_private_shm=False)
    return Allocator(api, cfg, lambda: devices("n0", 1)), device_id(grant.containers[0].uuids[0], 0)


@pytest.mark.parametrize("container, field", [
    ({"env": [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]}, "LD_PRELOAD"),
    ({"volumeMounts": [{"name": "v", "mountPath": "/etc/ld.so.preload"}]}, "/etc/ld.so.preload"),
    ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "NVIDIA_VISIBLE_DEVICES"),
])
def test_allocate_refuses_a_pod_that_would_step_out_of_its_slice(tmp_path, container, field):
    allocator, dev = bound(tmp_path, **container)
    with pytest.raises(AllocateError, match=field):
        allocator.allocate([dev])
    assert not list((tmp_path / "st").rglob("slice"))  # no slice file written for it


def test_allocate_gives_a_plain_pod_its_slice(tmp_path):
    allocator, dev = bound(tmp_path, env=[{"name": "GPUSLICE_LOG_LEVEL", "value": "debug"}])
    _, response = allocator.allocate([dev])
    assert any(c == "/etc/gpuslice/slice" for c, _, _ in response["mounts"])
