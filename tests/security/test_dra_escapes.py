"""DRA pods reach no webhook (DRA mode installs none), so the escape rules the webhook applies to device-plugin
pods (issue 15: no mount over ``/etc/ld.so.preload``, ``/etc/gpuslice``, the library or ``/var/run/gpuslice``; no
``LD_PRELOAD``/``LD_AUDIT``/node-agent ``GPUSLICE_*`` variables) are applied by the DRA driver when the kubelet
prepares a claim: for the containers of the claim's pods that get the claim. Before this, the driver prepared
such a pod's claim and the container ran with its own ``/etc/ld.so.preload`` or ``LD_PRELOAD``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))  # fakedra.py, as tests/kube/conftest.py does

from fakedra import FakeDraAPI, allocated_claim  # noqa: E402

from gpuslice.host.devices import load_snapshot  # noqa: E402
from gpuslice.kube.allocator import PluginConfig  # noqa: E402
from gpuslice.kube.dra import cdi  # noqa: E402
from gpuslice.kube.dra.driver import ClaimRef, DraConfig, DraDriver  # noqa: E402
from gpuslice.kube.dra.resourceslice import device_name  # noqa: E402

GiB = 1 << 30
H100 = load_snapshot("h100-80gb")
NODE = "n1"


def _driver(tmp_path: Path) -> tuple[FakeDraAPI, DraDriver]:
    api = FakeDraAPI()
    files = PluginConfig(node=NODE, host_state_dir=tmp_path / "host-state", local_state_dir=tmp_path / "state",
                         host_library=Path("/opt/gpuslice/libgpuslice.so"), device_nodes="always")
    return api, DraDriver(api, DraConfig(node=NODE, files=files, cdi_dir=tmp_path / "cdi"), lambda: list(H100))


def _pod(name: str, claim: str, *, gpu: dict, other: dict | None = None) -> dict:
    """A pod whose container ``main`` gets ResourceClaim ``claim`` (from a template: named in the pod's status)
    and whose container ``side`` (if given) does not."""
    containers = [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}, **gpu}]
    if other is not None:
        containers.append({"name": "side", "image": "x", **other})
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"containers": containers, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}}


ESCAPES = {
    "preload mount": {"volumeMounts": [{"name": "v", "mountPath": "/etc/ld.so.preload"}]},
    "slice folder mount": {"volumeMounts": [{"name": "v", "mountPath": "/etc/gpuslice/"}]},
    "run folder mount": {"volumeMounts": [{"name": "v", "mountPath": "/var/run/gpuslice/region"}]},
    "LD_PRELOAD": {"env": [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]},
    "GPUSLICE_SLICE": {"env": [{"name": "GPUSLICE_SLICE", "value": "/tmp/bigger"}]},
}


@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_a_dra_pod_that_would_escape_its_slice_is_not_prepared(tmp_path: Path, how: str) -> None:
    api, driver = _driver(tmp_path)
    api.add_claim(allocated_claim("c1", "pod-gpu-x", NODE, [{"device": device_name(H100[0].uuid), "memory": 4 * GiB}],
                                  pods=("p0",)))
    api.add_pod(_pod("p0", "pod-gpu-x", gpu=ESCAPES[how]))
    answer = driver.prepare([ClaimRef("ml", "c1", "pod-gpu-x")])["c1"]
    assert not answer.devices and "spec.containers[0] (main)" in answer.error and "ml/p0" in answer.error, answer
    assert not cdi.spec_path(driver.cfg.cdi_dir, "c1").exists()  # nothing prepared, nothing half written
    assert driver.checkpoint.get("c1") is None


def test_containers_that_do_not_get_the_claim_are_theirs_to_configure(tmp_path: Path) -> None:
    api, driver = _driver(tmp_path)
    api.add_claim(allocated_claim("c1", "pod-gpu-x", NODE, [{"device": device_name(H100[0].uuid), "memory": 4 * GiB}]))
    api.add_pod(_pod("p0", "pod-gpu-x", gpu={}, other=ESCAPES["LD_PRELOAD"]))
    answer = driver.prepare([ClaimRef("ml", "c1", "pod-gpu-x")])["c1"]
    assert answer.devices and not answer.error



def test_a_pod_that_shares_a_prepared_claim_by_name_is_checked_too(tmp_path: Path) -> None:
    """The claim was prepared for a clean pod; a second pod that names the same claim (reservedFor grows) and
    would step out of its slice is refused when the kubelet prepares the claim for it. Before, the checkpoint
    answered without looking at the new pod (issue 15, attacker's review)."""
    api, driver = _driver(tmp_path)
    claim = allocated_claim("c1", "shared-gpu", NODE, [{"device": device_name(H100[0].uuid), "memory": 4 * GiB}],
                            pods=("p0",))
    api.add_claim(claim)
    api.add_pod(_pod("p0", "shared-gpu", gpu={}))
    first = driver.prepare([ClaimRef("ml", "c1", "shared-gpu")])["c1"]
    assert first.devices and not first.error
    claim["status"]["reservedFor"].append({"resource": "pods", "name": "p1", "uid": "uid-p1"})
    api.add_claim(claim)
    api.add_pod(_pod("p1", "shared-gpu", gpu=ESCAPES["LD_PRELOAD"]))
    again = driver.prepare([ClaimRef("ml", "c1", "shared-gpu")])["c1"]
    assert not again.devices and "ml/p1" in again.error, again
    assert driver.checkpoint.get("c1").pods == ("p0",)  # still prepared for p0 alone
    api.pods.pop(("ml", "p1"))
    api.add_pod(_pod("p1", "shared-gpu", gpu={}))  # p1 fixed: prepared for it too
    assert driver.prepare([ClaimRef("ml", "c1", "shared-gpu")])["c1"] == first
    assert driver.checkpoint.get("c1").pods == ("p0", "p1")
