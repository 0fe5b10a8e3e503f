"""The device plugin over real gRPC on Unix sockets: a client speaking the kubelet's protocol, and a fake
kubelet Registration server (registration, and registration again after a kubelet restart)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")  # pinned in pyproject; absent only on bare GPU images (pytest -m gpu there)
from fakeapi import FakeAPI
from kubefixtures import devices, node, pod

from gpuslice.kube import formats
from gpuslice.kube.deviceplugin import load
from gpuslice.kube.extender import Extender
from gpuslice.kube.allocator import PluginConfig, device_id
from gpuslice.kube.plugin import DevicePlugin
from gpuslice.enforcer.policy import read_policies
from gpuslice.enforcer.slicefile import read_slice_file

pb, pb_grpc = load()


class FakeKubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service on <dir>/kubelet.sock, recording every RegisterRequest."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.requests: list = []
        self.endpoint_there: list[bool] = []
        self.event = threading.Event()
        self.server = None

    def Register(self, request, context):
        # a real kubelet dials the endpoint it is given: whether it was there when the registration came
        self.endpoint_there.append((self.folder / request.endpoint).is_socket())
        self.requests.append(request)
        self.event.set()
        return pb.Empty()

    def start(self):
        sock = self.folder / "kubelet.sock"
        if sock.exists():
            sock.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{sock}")
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()

    def restart(self):
        """What a kubelet restart looks like to plugins: every socket in the folder is removed, then
        kubelet.sock comes back."""
        self.stop()
        for f in self.folder.iterdir():
            if f.is_socket():
                f.unlink()
        self.start()


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def folder():
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # short: Unix socket paths max 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_plugin(folder: Path, api=None, node_name="n0", count=2, **kw):
    cfg = PluginConfig(node=node_name, plugin_dir=folder / "dp", host_state_dir=folder / "state",
                       host_library=Path("/opt/gpuslice/libgpuslice.so"), device_nodes="always",
                       watch_interval=0.05, split_count=4, **kw)
    (folder / "dp").mkdir(exist_ok=True)
    return DevicePlugin(cfg, devices(node_name, count), api)


def stub(plugin):
    channel = grpc.insecure_channel(f"unix://{plugin.cfg.socket_path}")
    return channel, pb_grpc.DevicePluginStub(channel)


@contextlib.contextmanager
def serving(plugin):
    """The plugin serving its socket and a client on it; stopped and shut down afterwards."""
    plugin.serve()
    try:
        channel, client = stub(plugin)
        with channel:
            yield client
    finally:
        plugin.stop()
        plugin.shutdown()


def test_registers_and_registers_again_after_kubelet_restart(folder):
    plugin = make_plugin(folder)
    kubelet = FakeKubelet(folder / "dp")
    kubelet.start()
    plugin.start()
    try:
        assert wait_for(lambda: len(kubelet.requests) == 1)
        req = kubelet.requests[0]
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gpuslice.sock", "nvidia.com/gpu")
        assert req.options.get_preferred_allocation_available
        kubelet.restart()
        assert wait_for(lambda: len(kubelet.requests) >= 2), "no registration after the kubelet restarted"
        assert wait_for(lambda: plugin.cfg.socket_path.exists())
        # every registration named a socket that was there (before, the plugin could register again on the new
        # kubelet socket before it saw its own gone: the kubelet then dialled nothing)
        assert all(kubelet.endpoint_there), kubelet.endpoint_there
        channel, client = stub(plugin)
        with channel:
            opts = client.GetDevicePluginOptions(pb.Empty(), timeout=5)
            assert opts.get_preferred_allocation_available and not opts.pre_start_required
            assert isinstance(client.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["x"]), timeout=5),
                              pb.PreStartContainerResponse)
    finally:
        plugin.stop()
        kubelet.stop()


def test_list_and_watch_advertises_split_devices_and_health_changes(folder):
    plugin = make_plugin(folder)
    with serving(plugin) as client:
        stream = client.ListAndWatch(pb.Empty())
        first = next(stream)
        ids = [d.ID for d in first.devices]
        uuids = [d.uuid for d in devices("n0", 2)]
        assert ids == [device_id(u, k) for u in uuids for k in range(4)]
        assert all(d.health == "Healthy" and d.topology.nodes[0].ID == 0 for d in first.devices)
        plugin.set_health(uuids[1], False, "XID 79")
        second = next(stream)
        health = {d.ID: d.health for d in second.devices}
        assert all(health[device_id(uuids[1], k)] == "Unhealthy" for k in range(4))
        assert all(health[device_id(uuids[0], k)] == "Healthy" for k in range(4))
        # GPU 1 vanished from discovery: it stays listed, Unhealthy (it already is: no new message)
        assert plugin.set_devices(devices("n0", 1)) is False
        assert [d.uuid for d in plugin.devices()] == uuids and plugin.health[uuids[1]] == "Unhealthy"
        # a later discovery finds it again, and a third GPU: all advertised; GPU 1 stays Unhealthy
        # while the health source has not cleared its XID, the new one is Healthy
        assert plugin.set_devices(devices("n0", 3)) is True
        third = {d.ID: d.health for d in next(stream).devices}
        assert len(third) == 12 and third[device_id(uuids[1], 0)] == "Unhealthy"
        assert third[device_id(devices("n0", 3)[2].uuid, 0)] == "Healthy"
        plugin.set_health(uuids[1], True, "recovered")
        assert {d.health for d in next(stream).devices} == {"Healthy"}
        stream.cancel()


def bound_cluster(names_limits, allocation_timeout=300.0):
    api = FakeAPI()
    api.add_node("n0", node("n0", 2)["metadata"]["annotations"])
    ext = Extender(api, allocation_timeout=allocation_timeout)
    pods = []
    for name, limits in names_limits:
        p = api.add_pod(pod(name, limits))
        m = p["metadata"]
        assert ext.bind({"PodName": name, "PodNamespace": "default", "PodUID": m["uid"], "Node": "n0"})["Error"] == ""
        pods.append(api.get_pod("default", name))
    return api, pods


def test_allocate_returns_the_grant_mounts_env_and_devices(folder):
    api, (p,) = bound_cluster([("train", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000",
                                          "nvidia.com/gpucores": "30"})])
    grant = formats.decode_pod_grant(p["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    plugin = make_plugin(folder, api)
    with serving(plugin) as client:
        available = [device_id(u, k) for u in reversed([d.uuid for d in devices("n0", 2)]) for k in range(4)]
        pref = client.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)]), timeout=5)
        (chosen,) = pref.container_responses[0].deviceIDs
        assert chosen.split("::")[0] == grant.uuids[0]
        resp = client.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[chosen])]), timeout=5)
        c = resp.container_responses[0]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == grant.uuids[0]
        assert c.envs["GPUSLICE_SLICE"] == "/etc/gpuslice/slice" and c.envs["GPUSLICE_GRANT"] == grant.grant_id
        mounts = {m.container_path: (m.host_path, m.read_only) for m in c.mounts}
        slice_host, ro = mounts["/etc/gpuslice/slice"]
        assert ro and mounts["/etc/ld.so.preload"][1] and mounts["/usr/local/gpuslice/lib/libgpuslice.so"] == (
            "/opt/gpuslice/libgpuslice.so", True)
        # The container sees its own region and devices only: the region folder is this grant's, the
        # device-state folder is this grant's (only mount points), with the granted device's slice records folder
        # mounted into it read-only and this grant's own record file in that read-write — never the node's whole
        # <state>/devices folder, never a neighbour's record writable, no shared .dev file. No host folder is
        # writable (a pod filled the node's disk through them: no ephemeral-storage limit counts a bind mount);
        # only the region and the grant's record file are.
        state = folder / "state"
        records = f"/var/run/gpuslice/devices/{grant.uuids[0]}.slices"
        own = f"{records}/{grant.grant_id}"
        roster = f"/var/run/gpuslice/devices/{grant.uuids[0]}.policy"
        assert mounts == {
            "/etc/gpuslice/slice": (str(state / "kube" / "grants" / grant.grant_id / "slice"), True),
            "/var/run/gpuslice/region": (str(state / "kube" / "regions" / grant.grant_id), True),
            "/var/run/gpuslice/region/region": (str(state / "kube" / "regions" / grant.grant_id / "region"), False),
            "/var/run/gpuslice/devices": (str(state / "kube" / "grants" / grant.grant_id / "devices"), True),
            records: (str(state / "devices" / f"{grant.uuids[0]}.slices"), True),
            own: (str(state / "devices" / f"{grant.uuids[0]}.slices" / grant.grant_id), False),
            roster: (str(state / "devices" / f"{grant.uuids[0]}.policy"), True),  # root's, read-only (issue 15)
            "/usr/local/gpuslice/lib/libgpuslice.so": ("/opt/gpuslice/libgpuslice.so", True),
            "/etc/ld.so.preload": (str(state / "kube" / "ld.so.preload"), True),
        }
        assert not any(path.endswith(".dev") or host.endswith(".dev") for path, (host, _) in mounts.items())
        order = [m.container_path for m in c.mounts]
        assert order.index("/var/run/gpuslice/devices") < order.index(records) < order.index(own)  # parents first
        assert order.index("/var/run/gpuslice/region") < order.index("/var/run/gpuslice/region/region")
        assert oct(Path(mounts["/var/run/gpuslice/devices"][0]).stat().st_mode & 0o7777) == "0o755"
        # the mount points the runtime cannot make inside that read-only folder are there
        assert sorted(p.name for p in Path(mounts["/var/run/gpuslice/devices"][0]).iterdir()) == [
            f"{grant.uuids[0]}.policy", f"{grant.uuids[0]}.slices"]
        own_file = os.lstat(mounts[own][0])
        assert stat.S_ISREG(own_file.st_mode) and own_file.st_size == 0  # for the bind mount; the enforcer sizes it
        assert (own_file.st_uid, stat.S_IMODE(own_file.st_mode)) == (os.geteuid(), 0o666)
        assert oct(Path(mounts[records][0]).stat().st_mode & 0o7777) == "0o755"
        assert read_policies(state / "devices", grant.uuids[0])[grant.grant_id].compute == 30
        assert oct(Path(mounts[roster][0]).stat().st_mode & 0o777) == "0o755"
        assert not any(host == str(state / "devices") for host, _ in mounts.values())
        written = read_slice_file(slice_host)  # the enforcer's own parsing rules
        assert written.memory_limit == 10000 * 1024**2 and written.compute == 30
        assert written.devices == grant.uuids and written.grant == grant.grant_id
        assert written.region == "/var/run/gpuslice/region/region" and not written.fail_open
        assert oct(Path(slice_host).stat().st_mode & 0o777) == "0o644"
        assert Path(mounts["/etc/ld.so.preload"][0]).read_text() == "/usr/local/gpuslice/lib/libgpuslice.so\n"
        index = [d.uuid for d in devices("n0", 2)].index(grant.uuids[0])
        assert [d.container_path for d in c.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm",
                                                         "/dev/nvidia-uvm-tools", f"/dev/nvidia{index}"]
        marked = api.get_pod("default", "train")["metadata"]["annotations"][formats.POD_ALLOCATED]
        assert formats.decode_allocated(marked) == {"main"}
        with pytest.raises(grpc.RpcError) as exc:  # nothing left to allocate for this pod
            client.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[chosen])]), timeout=5)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no gpuslice grant" in exc.value.details()


def allocate(client, ids):
    return client.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                           timeout=5).container_responses[0]


def test_two_pods_waiting_for_the_same_device_count_are_refused_not_guessed(folder):
    """The kubelet names devices, never the pod, and may admit b before a. With the allocation lock off
    both wait at once: Allocate must not hand one pod the other's grant (matching by UUIDs would, since
    GetPreferredAllocation steered to a's devices whichever pod the kubelet was admitting)."""
    # 50 GiB each: the two pods land on different GPUs
    api, (a, b) = bound_cluster([("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}),
                                 ("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"})], allocation_timeout=0)
    ga = formats.decode_pod_grant(a["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    gb = formats.decode_pod_grant(b["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    assert ga.uuids != gb.uuids
    plugin = make_plugin(folder, api)
    with serving(plugin) as client:
        for uuid in (ga.uuids[0], gb.uuids[0]):
            with pytest.raises(grpc.RpcError) as exc:
                allocate(client, [device_id(uuid, 3)])
            assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "default/a, default/b" in exc.value.details() and "cannot tell" in exc.value.details()
        assert formats.POD_ALLOCATED not in api.get_pod("default", "a")["metadata"]["annotations"]
        # a 2-device request is not ambiguous with them: no candidate at all
        with pytest.raises(grpc.RpcError) as exc:
            allocate(client, [device_id(ga.uuids[0], 0), device_id(gb.uuids[0], 0)])
        assert "no gpuslice grant" in exc.value.details()


def test_allocation_lock_gives_allocate_exactly_one_candidate(folder):
    """With the lock (the default) b is not bound while a waits; once a is allocated the plugin releases
    the lock, b binds, and b's Allocate gets b's grant even when the kubelet ignored the preference and
    chose IDs on a's GPU."""
    big = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}
    api, (a,) = bound_cluster([("a", big)])
    ext = Extender(api)
    b = api.add_pod(pod("b", big))
    body = {"PodName": "b", "PodNamespace": "default", "PodUID": b["metadata"]["uid"], "Node": "n0"}
    assert "waiting for the kubelet to allocate pod default/a" in ext.bind(body)["Error"]
    ga = formats.decode_pod_grant(a["metadata"]["annotations"][formats.POD_GRANT]).containers[0]
    plugin = make_plugin(folder, api)
    with serving(plugin) as client:
        assert allocate(client, [device_id(ga.uuids[0], 1)]).envs["GPUSLICE_GRANT"] == ga.grant_id
        holders = api.get_node("n0")["metadata"]["annotations"].get(formats.NODE_ALLOCATING)
        assert formats.decode_allocating(holders) == frozenset()  # released by the plugin
        assert ext.bind(body)["Error"] == ""
        gb = formats.decode_pod_grant(api.get_pod("default", "b")["metadata"]["annotations"][formats.POD_GRANT])
        gb = gb.containers[0]
        assert gb.uuids != ga.uuids
        resp = allocate(client, [device_id(ga.uuids[0], 2)])  # IDs on a's GPU: still b's grant
        assert resp.envs["GPUSLICE_GRANT"] == gb.grant_id
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == gb.uuids[0]


def test_lock_is_released_only_when_every_container_of_the_pod_is_allocated(folder):
    cs = [{"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
          for i in range(2)]
    api = FakeAPI()
    api.add_node("n0", node("n0", 2)["metadata"]["annotations"])
    p = api.add_pod(pod("two", containers=cs))
    assert Extender(api).bind({"PodName": "two", "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                                "Node": "n0"})["Error"] == ""
    plugin = make_plugin(folder, api)
    uid = p["metadata"]["uid"]
    with serving(plugin) as client:
        g = formats.decode_pod_grant(api.get_pod("default", "two")["metadata"]["annotations"][formats.POD_GRANT])
        first = allocate(client, [device_id(g.containers[0].uuids[0], 0)])
        assert first.envs["GPUSLICE_GRANT"] == g.containers[0].grant_id
        node_anns = api.get_node("n0")["metadata"]["annotations"]
        assert formats.decode_allocating(node_anns[formats.NODE_ALLOCATING]) == {uid}  # c1 still to come
        second = allocate(client, [device_id(g.containers[1].uuids[0], 0)])
        assert second.envs["GPUSLICE_GRANT"] == g.containers[1].grant_id
        assert formats.NODE_ALLOCATING not in api.get_node("n0")["metadata"]["annotations"]


def test_allocate_refuses_unhealthy_devices_and_missing_grants(folder):
    api, _ = bound_cluster([])
    plugin = make_plugin(folder, api)
    uuid = devices("n0", 2)[0].uuid
    with serving(plugin) as client:
        with pytest.raises(grpc.RpcError) as exc:
            client.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[device_id(uuid, 0)])]), timeout=5)
        assert "must be scheduled by the gpuslice scheduler" in exc.value.details()
        plugin.set_health(uuid, False)
        with pytest.raises(grpc.RpcError) as exc:
            client.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[device_id(uuid, 0)])]), timeout=5)
        assert "unhealthy" in exc.value.details()


def test_device_file_names_follow_the_enforcer():
    """The pacer names a device's files after cuDeviceGetUuid_v2 as GPU-hex: a MIG instance's own UUID with GPU-."""
    from gpuslice.kube.allocator import Allocator
    from gpuslice.spec import Grant, Slice

    mig = "MIG-0b0c7a3e-1f2d-5a6b-9c8d-7e6f5a4b3c2d"
    g = formats.ContainerGrant("c", Grant("k-1-c", (Slice("GPU-aaaa", 1), Slice(mig, 1))))
    assert Allocator.device_stems(g) == ["GPU-aaaa", "GPU-0b0c7a3e-1f2d-5a6b-9c8d-7e6f5a4b3c2d"]


def test_ended_pods_folders_are_pruned_and_a_tree_too_deep_stops_none_of_the_others(folder):
    """The node loop removes the host folders of ended pods' grants (older than the grace, kept while the ledger
    or the node still names them). A tree too deep for Python 3.11's recursive rmtree (a pod could build one when
    its folders were writable) raised RecursionError, which ignore_errors does not catch: every later prune and
    the rest of the node loop's pass stopped there (attacker's review, stop 28). Since stop 39 every ended folder
    is moved aside into kube/.left at once (deleted there in the background; what is too deep stays for an admin):
    the deep one is gone from its place too, and the pass never waited on it."""
    import os

    from deeptree import make_deep_tree, remove_any_depth

    from gpuslice.kube.allocator import Allocator

    cfg = PluginConfig(node="n0", plugin_dir=folder / "dp", host_state_dir=folder / "state",
                       host_library=Path("/opt/gpuslice/libgpuslice.so"))
    alloc = Allocator(FakeAPI(), cfg, lambda: devices("n0", 1))
    kube = folder / "state" / "kube"
    for sub, name in (("regions", "k-deep"), ("grants", "k-old"), ("grants", "k-kept"), ("regions", "k-old")):
        (kube / sub / name).mkdir(parents=True)
    try:
        make_deep_tree(kube / "regions" / "k-deep", 3000)
        gone = alloc.prune_grant_folders(["k-kept"], older_than=0, now=time.time() + 60)
        assert set(gone) == {"k-old", "k-deep"}
        assert sorted(os.listdir(kube / "grants")) == [".left", "k-kept"] and os.listdir(kube / "regions") == [".left"]
        # moved aside (what rmtree cannot delete stays there; Pythons whose rmtree walks any depth delete it too)
        assert all(n.startswith("regions-k-") for n in os.listdir(kube / "regions" / ".left"))
        assert not alloc.prune_grant_folders(["k-kept"], older_than=0, now=time.time() + 60)  # .left is no grant
    finally:  # pytest's clean-up would recurse as rmtree does
        remove_any_depth(kube)


def test_ended_pods_record_files_are_pruned_with_their_folders(folder):
    """Pods end without telling the device plugin: the node loop's prune removes an ended grant's slice record
    files too (older than the grace; kept while the ledger or the node still names the grant; other writers'
    grants never)."""
    from gpuslice.enforcer.devstate import records_folder_name
    from gpuslice.enforcer.slicerecords import write_records
    from gpuslice.kube.allocator import Allocator

    cfg = PluginConfig(node="n0", plugin_dir=folder / "dp", host_state_dir=folder / "state",
                       host_library=Path("/opt/gpuslice/libgpuslice.so"))
    alloc = Allocator(FakeAPI(), cfg, lambda: devices("n0", 1))
    uuid = devices("n0", 1)[0].uuid
    devs = folder / "state" / "devices"
    devs.mkdir(parents=True)
    for grant in ("k-old-main", "k-kept-main", "dra-claim"):
        write_records(devs, grant, (uuid,))
    assert alloc.prune_grant_folders(["k-kept-"], older_than=120) == ()  # within the grace
    assert alloc.prune_grant_folders(["k-kept-"], older_than=120, now=time.time() + 600) == ("k-old-main",)
    assert sorted(p.name for p in (devs / records_folder_name(uuid)).iterdir()) == ["dra-claim", "k-kept-main"]
