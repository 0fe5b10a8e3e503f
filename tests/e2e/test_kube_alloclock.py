"""The allocation lock against the real API server and kube-scheduler: two pods of the same device count
meant for one node are never both waiting for the kubelet's Allocate there, so Allocate (which learns
device IDs, never the pod) always has exactly one pod to answer for.

Pod a binds; pod b, which only fits that node, stays pending with the lock's reason until the device
plugin's Allocator (the real code, as the chart's agent identity) has allocated a and released the lock;
then kube-scheduler binds b, and b's Allocate gets b's grant even on IDs of a's GPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane, ExtenderProcess

pytestmark = pytest.mark.kube_e2e

NS = "gpuslice-e2e"
NODE = "lock-node"
TAINT = {"key": "gpuslice-e2e/lock", "value": "only", "effect": "NoSchedule"}


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "cuda", "image": "x", "command": ["sleep", "infinity"],
                                     # 50 GB each: the two pods land on different GPUs
                                     "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}}}]}}


def _read(v1: Any, name: str) -> dict[str, Any]:
    return v1.api_client.sanitize_for_serialization(v1.read_namespaced_pod(name, NS))


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what} within {timeout} s")


def test_one_pod_per_device_count_waits_for_allocate_on_a_node(
        control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess", node_maker: Any, devices_of: Any,
        agent_identity: Any, tmp_path: Path) -> None:
    from kubernetes import client

    from gpuslice.kube import formats
    from gpuslice.kube.api import connect
    from gpuslice.kube.allocator import ID_SEP, Allocator, PluginConfig

    v1 = client.CoreV1Api(control_plane.api())
    node_maker(NODE)
    v1.patch_node(NODE, {"spec": {"taints": [TAINT]}})
    v1.create_namespaced_pod(NS, _pod("lock-a"))
    a = _wait(lambda: (p := _read(v1, "lock-a"))["spec"].get("nodeName") and p, 60, "lock-a was not bound")
    v1.create_namespaced_pod(NS, _pod("lock-b"))

    def lock_reason() -> str:
        for c in _read(v1, "lock-b")["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and "waiting for the kubelet to allocate pod" in (c.get("message") or ""):
                return c["message"]
        return ""

    message = _wait(lock_reason, 60, "lock-b was not reported as waiting for the allocation lock")
    assert f"{NS}/lock-a" in message
    assert not _read(v1, "lock-b")["spec"].get("nodeName"), "lock-b was bound while lock-a waited for Allocate"
    node = v1.api_client.sanitize_for_serialization(v1.read_node(NODE))
    assert formats.decode_allocating(node["metadata"]["annotations"].get(formats.NODE_ALLOCATING)) == {a["metadata"]["uid"]}

    # The device plugin's Allocator, as the chart's agent on this node (the kubelet admitting lock-a).
    allocator = Allocator(connect(agent_identity(NODE)),
                          PluginConfig(node=NODE, host_state_dir=tmp_path, device_nodes="none"), lambda: devices_of(NODE))
    ga = formats.decode_pod_grant(a["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    match, resp = allocator.allocate([f"{ga.uuids[0]}{ID_SEP}0"])
    assert match.entry.pod_uid == a["metadata"]["uid"] and resp["envs"]["GPUSLICE_GRANT"] == ga.grant_id
    node = v1.api_client.sanitize_for_serialization(v1.read_node(NODE))
    assert formats.NODE_ALLOCATING not in node["metadata"]["annotations"], "Allocate did not release the lock"

    # The release is a Node change: kube-scheduler retries lock-b, which now binds to the same node.
    b = _wait(lambda: (p := _read(v1, "lock-b"))["spec"].get("nodeName") and p, 60,
              "lock-b was not bound after the lock was released")
    assert b["spec"]["nodeName"] == NODE
    gb = formats.decode_pod_grant(b["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    assert gb.uuids != ga.uuids
    # The kubelet may hand out any free IDs (here some on lock-a's GPU): still lock-b's grant.
    match, resp = allocator.allocate([f"{ga.uuids[0]}{ID_SEP}5"])
    assert match.entry.pod_uid == b["metadata"]["uid"]
    assert resp["envs"]["GPUSLICE_GRANT"] == gb.grant_id and resp["envs"]["NVIDIA_VISIBLE_DEVICES"] == gb.uuids[0]
