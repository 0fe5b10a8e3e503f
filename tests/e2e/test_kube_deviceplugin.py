"""The device plugin, driven the way the kubelet drives it, for a pod the real scheduler placed.

A pod is scheduled through the real API server and kube-scheduler (our webhook and extender) onto
a node of its own; `gpuslice kube-agent` runs for that node; a stand-in kubelet (Python stubs
generated from the kubelet's own api.proto, hack/kubelet-api) takes the agent's Register call,
reads ListAndWatch, asks GetPreferredAllocation and calls Allocate — and the answer must match the
grant the extender wrote: NVIDIA_VISIBLE_DEVICES = the granted UUIDs, the slice file (read-only)
holding the granted memory and compute, the enforcer library and ld.so.preload read-only. Then the
stand-in "restarts" (wipes the socket folder, listens again) and the plugin must register again.

The kubelet stand-in runs in a subprocess: its generated module declares the same protobuf
package (v1beta1) as gpuslice's own, and one Python process cannot hold both in its default pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane, ExtenderProcess

pytestmark = pytest.mark.kube_e2e

NS = "gpuslice-e2e"
NODE = "alloc-node"
MiB = 1024**2

KUBELET = r"""
import json, sys, time
from concurrent import futures
import grpc
sys.path.insert(0, sys.argv[1])
from kubeletdp import api_pb2 as pb, api_pb2_grpc as rpc

plugin_dir, want, timeout = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
registered = []

class Registration(rpc.RegistrationServicer):
    def Register(self, request, context):
        registered.append(request)
        return pb.Empty()

server = grpc.server(futures.ThreadPoolExecutor(4))
rpc.add_RegistrationServicer_to_server(Registration(), server)
server.add_insecure_port(f"unix://{plugin_dir}/kubelet.sock")
server.start()
print("KUBELET_LISTENING", flush=True)
deadline = time.time() + timeout
while not registered and time.time() < deadline:
    time.sleep(0.05)
if not registered:
    print(json.dumps({"error": "the plugin never called Register"}))
    sys.exit(0)
reg = registered[0]
out = {"register": {"version": reg.version, "endpoint": reg.endpoint, "resource_name": reg.resource_name,
                    "preferred": reg.options.get_preferred_allocation_available}}
stub = rpc.DevicePluginStub(grpc.insecure_channel(f"unix://{plugin_dir}/{reg.endpoint}"))
opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
out["options"] = {"preferred": opts.get_preferred_allocation_available, "prestart": opts.pre_start_required}
first = next(stub.ListAndWatch(pb.Empty(), timeout=30))
out["devices"] = [[d.ID, d.health, [n.ID for n in d.topology.nodes]] for d in first.devices]
ids = [d.ID for d in first.devices]
pref = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
    pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, must_include_deviceIDs=[], allocation_size=want)]),
    timeout=10)
chosen = list(pref.container_responses[0].deviceIDs)
out["chosen"] = chosen
resp = stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]), timeout=30)
r = resp.container_responses[0]
out["envs"] = dict(r.envs)
out["mounts"] = [{"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only} for m in r.mounts]
out["device_specs"] = [{"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
                       for d in r.devices]
# Asking again for the same container's devices: its grant is already allocated, nothing else matches.
try:
    stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]), timeout=30)
    out["second"] = "OK"
except grpc.RpcError as exc:
    out["second"] = f"{exc.code().name}: {exc.details()}"

# A kubelet restart: the kubelet removes every socket in the folder (the plugin's too) and
# listens again; the plugin must notice, serve again and register again.
server.stop(0).wait()
import os
for name in os.listdir(plugin_dir):
    os.unlink(os.path.join(plugin_dir, name))
registered.clear()
started = time.time()
server = grpc.server(futures.ThreadPoolExecutor(4))
rpc.add_RegistrationServicer_to_server(Registration(), server)
server.add_insecure_port(f"unix://{plugin_dir}/kubelet.sock")
server.start()
while not registered and time.time() < started + 30:
    time.sleep(0.05)
if registered:
    reg = registered[0]
    stub = rpc.DevicePluginStub(grpc.insecure_channel(f"unix://{plugin_dir}/{reg.endpoint}"))
    again = next(stub.ListAndWatch(pb.Empty(), timeout=30))
    out["reregistered"] = {"seconds": round(time.time() - started, 2), "resource_name": reg.resource_name,
                           "devices": len(again.devices)}
else:
    out["reregistered"] = None
print(json.dumps(out), flush=True)
"""


def test_allocate_returns_what_the_grant_says(control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess",
                                             node_maker: Any, devices_of: Any, kubelet_api: Path,
                                             agent_identity: Any, chart_args: dict[str, list[str]],
                                             tmp_path: Path) -> None:
    from kubernetes import client

    from gpuslice.kube import formats
    from gpuslice.host.devices import snapshot_json
    from gpuslice.enforcer.slicefile import parse_slice_text

    v1 = client.CoreV1Api(control_plane.api())
    node_maker(NODE)
    # Only the pod below may land here (it tolerates this taint), so its grant is the node's only one.
    v1.patch_node(NODE, {"spec": {"taints": [{"key": "gpuslice-e2e/alloc", "value": "only", "effect": "NoSchedule"}]}})
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "alloc-me", "namespace": NS},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                 "tolerations": [{"key": "gpuslice-e2e/alloc", "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "train", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
                                 "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8192",
                                                          "nvidia.com/gpucores": "25"}}}]},
    }
    v1.create_namespaced_pod(NS, pod)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = v1.read_namespaced_pod("alloc-me", NS)
        if got.spec.node_name:
            break
        time.sleep(0.3)
    assert got.spec.node_name == NODE, got.status.conditions
    grant = formats.decode_pod_grant(got.metadata.annotations[formats.POD_GRANT])
    (cg,) = grant.containers
    granted = {s.device_uuid for s in cg.slices}
    assert len(granted) == 2

    # The agent for this node, started as the chart starts it, serving the node's devices (a snapshot
    # stands in for NVML: this machine's GPUs, if any, are not the fake node's).
    snapshot = tmp_path / "devices.json"
    snapshot.write_text(json.dumps(snapshot_json(devices_of(NODE), "e2e fake node")))
    plugin_dir, state = tmp_path / "dp", tmp_path / "state"
    plugin_dir.mkdir()
    state.mkdir()
    kubelet = subprocess.Popen([sys.executable, "-c", KUBELET, str(kubelet_api), str(plugin_dir), "2", "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert kubelet.stdout is not None
    assert kubelet.stdout.readline().strip() == "KUBELET_LISTENING", kubelet.stderr.read() if kubelet.stderr else ""
    gpuslice = Path(sys.executable).parent / "gpuslice"
    agent_log = tmp_path / "agent.log"
    with open(agent_log, "w") as log:
        agent = subprocess.Popen(
            # The chart's agent container, as the chart's agent ServiceAccount (with the pod-bound token
            # its DaemonSet pod on this node would hold) under the chart's RBAC and write policies; only
            # host paths, the node's identity and the device source differ here. (The chart's library
            # path is kept: Allocate only names it, the kubelet would mount it.)
            [str(gpuslice), *chart_args["agent"], "--node", NODE, "--kubeconfig", agent_identity(NODE),
             "--snapshot", str(snapshot), "--plugin-dir", str(plugin_dir), "--host-state-dir", str(state),
             "--state-dir", str(state), "--metrics-port", "0", "--device-nodes", "always"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        out_text, err_text = kubelet.communicate(timeout=90)
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
    assert out_text.strip(), f"kubelet stand-in printed nothing:\n{err_text[-3000:]}\nagent:\n{agent_log.read_text()[-3000:]}"
    out = json.loads(out_text.strip().splitlines()[-1])
    assert "error" not in out, f"{out}\nagent:\n{agent_log.read_text()[-3000:]}"

    # Registration as the kubelet expects it.
    assert out["register"] == {"version": "v1beta1", "endpoint": out["register"]["endpoint"],
                               "resource_name": "nvidia.com/gpu", "preferred": True}
    assert (plugin_dir / out["register"]["endpoint"]).is_socket()
    # devices × split count, all healthy, with their NUMA node.
    devices = out["devices"]
    assert len(devices) == 4 * 10
    assert {h for _, h, _ in devices} == {"Healthy"}
    by_uuid = {d.uuid: d for d in devices_of(NODE)}
    for dev_id, _, numa in devices:
        uuid = dev_id.split("::")[0]
        assert uuid in by_uuid and numa == [by_uuid[uuid].numa_node]

    # The kubelet is steered to the granted devices, and Allocate answers with the grant.
    assert {c.split("::")[0] for c in out["chosen"]} == granted
    envs = out["envs"]
    assert set(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == granted
    assert envs["GPUSLICE_GRANT"] == cg.grant_id
    mounts = {m["container_path"]: m for m in out["mounts"]}
    slice_mount = mounts[envs["GPUSLICE_SLICE"]]
    # The container cannot raise its own limits: what configures the enforcer is read-only.
    assert slice_mount["read_only"] is True
    assert mounts["/etc/ld.so.preload"]["read_only"] is True
    assert mounts["/usr/local/gpuslice/lib/libgpuslice.so"] == {
        "container_path": "/usr/local/gpuslice/lib/libgpuslice.so",
        "host_path": "/usr/local/gpuslice/lib/libgpuslice.so", "read_only": True}
    assert Path(mounts["/etc/ld.so.preload"]["host_path"]).read_text().strip() == "/usr/local/gpuslice/lib/libgpuslice.so"
    # The slice file the container will read says what the grant says.
    sl = parse_slice_text(Path(slice_mount["host_path"]).read_text())
    assert set(sl.devices) == granted
    assert all(sl.limit_for(u) == 8192 * MiB for u in granted)
    assert sl.compute == 25 and sl.grant == cg.grant_id
    # Device nodes: the control devices and one per granted GPU (minor = index on the fake node).
    paths = {d["container_path"] for d in out["device_specs"]}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths
    assert {f"/dev/nvidia{by_uuid[u].index}" for u in granted} <= paths
    # The same devices asked for again: that grant is used up, so Allocate refuses instead of
    # handing one slice to two containers.
    assert out["second"] != "OK"
    marked = v1.read_namespaced_pod("alloc-me", NS).metadata.annotations.get(formats.POD_ALLOCATED, "")
    assert formats.decode_allocated(marked) == {"train"}
    # After a kubelet restart (sockets wiped, kubelet.sock recreated) the plugin registered again
    # and serves the same devices.
    again = out["reregistered"]
    assert again is not None, f"no Register after the kubelet restart\nagent:\n{agent_log.read_text()[-3000:]}"
    assert again["resource_name"] == "nvidia.com/gpu" and again["devices"] == 40
    print(f"device plugin registered again {again['seconds']} s after the kubelet restart")
