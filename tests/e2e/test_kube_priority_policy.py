"""Who may ask for high priority, through the real API server (issue 15): with the chart's
``sharing.highPriorityNamespaces`` naming one namespace, the API server (calling our webhook over TLS, run with the
flags the chart renders for that value) refuses a pod asking for ``nvidia.com/priority: 0`` in any other namespace,
with the field and the namespaces that may in its message, and admits it, mutated, where it is allowed. A pod at
low priority is admitted everywhere. The unit side of the policy is tests/security/test_priority_policy_kube.py."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane

pytestmark = pytest.mark.kube_e2e

ONLINE, BATCH = "gs-prio-online", "gs-prio-batch"  # conftest.PRIORITY_NAMESPACES


def pod(name: str, priority: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "srv", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
                                     "command": ["sleep", "infinity"],
                                     "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                                              "nvidia.com/priority": priority}}}]}}


def core(cp: "ControlPlane") -> Any:
    from kubernetes import client

    return client.CoreV1Api(cp.api())


def test_high_priority_is_refused_outside_the_listed_namespace(control_plane: "ControlPlane",
                                                               priority_webhook: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        core(control_plane).create_namespaced_pod(BATCH, pod("srv-high", "0"))
    assert err.value.status == 403, err.value.body
    message = json.loads(err.value.body)["message"]
    assert "pods.gpuslice.io" in message and "denied" in message, message
    assert "resources.limits[nvidia.com/priority]" in message and f"namespace '{BATCH}'" in message, message
    assert f"allowed in: {ONLINE}" in message, message


def test_high_priority_is_admitted_and_mutated_in_the_listed_namespace(control_plane: "ControlPlane",
                                                                       priority_webhook: Any) -> None:
    created = core(control_plane).create_namespaced_pod(ONLINE, pod("srv-high", "0"))
    assert created.spec.scheduler_name == "gpuslice-scheduler", "admitted and mutated by our webhook"


def test_low_priority_is_admitted_everywhere(control_plane: "ControlPlane", priority_webhook: Any) -> None:
    for ns in (ONLINE, BATCH):
        created = core(control_plane).create_namespaced_pod(ns, pod("srv-low", "1"))
        assert created.spec.scheduler_name == "gpuslice-scheduler", ns
