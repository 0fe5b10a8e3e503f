"""Spatial containers in Kubernetes: Allocate starts the device's MPS daemon on first use and mounts it (pipe
directory, env, slice file); the node's loop stops it once the node ledger holds no spatial container of it,
and clears what a killed agent left. The daemon is the stand-in control daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakeapi import FakeAPI
from kubefixtures import devices, node, pod
from mpskit import failing_control, install_standin, mps_processes, short_root

from gpuslice.enforcer.policy import folder_name, read_policies
from gpuslice.enforcer.slicefile import read_slice_file
from gpuslice.host.mpsfleet import DaemonKey
from gpuslice.kube import formats
from gpuslice.kube.allocator import AllocateError, Allocator, PluginConfig, device_id, run_as_user
from gpuslice.kube.extender import Extender
from gpuslice.kube.mpsnode import MpsNode, wanted_daemons

SPATIAL = {formats.POD_ENGINE: "spatial"}
LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "25"}


@pytest.fixture
def root():
    yield from short_root("gskube-")


def cluster(*pods):
    api = FakeAPI()
    api.add_node("n0", node("n0", 2)["metadata"]["annotations"])
    ext = Extender(api, allocation_timeout=0)
    for p in pods:
        m = api.add_pod(p)["metadata"]
        assert ext.bind({"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "n0"})["Error"] == ""
    return api


def allocator(api, root: Path, control: Path) -> Allocator:
    cfg = PluginConfig(node="n0", host_state_dir=root / "st", mps_control=control, mps_private_shm=False,
                       device_nodes="none")
    return Allocator(api, cfg, lambda: devices("n0", 2))


def grant_of(api, name: str):
    p = api.get_pod("default", name)
    return formats.decode_pod_grant(p["metadata"]["annotations"][formats.POD_GRANT]).containers[0]


def test_allocate_starts_the_daemon_and_mounts_it(root: Path) -> None:
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "svc")
    assert g.slices[0].engine.value == "spatial"
    match, resp = alloc.allocate([device_id(g.uuids[0], 0)])
    pipe = root / "st" / "kube" / "mps" / DaemonKey(g.uuids[0], tenant="default").name / "pipe"
    mounts = {c: (h, ro) for c, h, ro in resp["mounts"]}
    assert mounts["/var/run/gpuslice/mps"] == (str(pipe), False)
    assert resp["envs"]["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/gpuslice/mps"
    assert resp["envs"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert resp["envs"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M"
    written = read_slice_file(mounts["/etc/gpuslice/slice"][0])
    assert written.engine == "spatial" and written.mps_pipe_dir == "/var/run/gpuslice/mps"
    assert (pipe / "nvidia-cuda-mps-control.pid").exists() and len(mps_processes(root)) == 1
    alloc.mps.stop_all()


def test_the_roster_names_a_spatial_containers_daemon_and_the_node_loop_keeps_it(root: Path) -> None:
    """The device's roster entry of a spatial container names its MPS daemon (the host pipe directory), so the
    enforcer caps a yielding process only beside a high-priority slice of its own daemon; the node loop's
    reconcile writes the same entry (nothing to rewrite), and writes it again, daemon and all, when it is lost."""
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "svc")
    alloc.allocate([device_id(g.uuids[0], 0)])
    pipe = str(root / "st" / "kube" / "mps" / DaemonKey(g.uuids[0], tenant="default").name / "pipe")
    devices_dir = alloc.paths(g.grant_id, local=True)["devices"]
    entry = read_policies(devices_dir, g.uuids[0])[g.grant_id]
    assert entry.engine == "spatial" and entry.mps_pipe_dir == pipe
    loop = MpsNode(api, "n0", alloc, grace=0)
    pods = api.list_pods()
    assert loop.reconcile_rosters(formats.decode_ledger(
        api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0"), pods).written == ()
    (devices_dir / folder_name(g.uuids[0]) / g.grant_id).unlink()
    loop.reconcile_once()
    assert read_policies(devices_dir, g.uuids[0])[g.grant_id].mps_pipe_dir == pipe
    alloc.mps.stop_all()


def test_a_time_sliced_container_gets_no_daemon(root: Path) -> None:
    api = cluster(pod("ts", LIMITS))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "ts")
    _, resp = alloc.allocate([device_id(g.uuids[0], 0)])
    assert "/var/run/gpuslice/mps" not in {c for c, _, _ in resp["mounts"]}
    assert not any(k.startswith("CUDA_MPS") for k in resp["envs"]) and mps_processes(root) == []
    assert "engine" not in Path(dict((c, h) for c, h, _ in resp["mounts"])["/etc/gpuslice/slice"]).read_text()


def test_the_node_loop_stops_the_daemon_once_no_pod_needs_it(root: Path) -> None:
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "svc")
    alloc.allocate([device_id(g.uuids[0], 0)])
    loop = MpsNode(api, "n0", alloc, grace=0)
    assert loop.reconcile_once().stopped == []  # the ledger holds the pod: kept
    assert len(mps_processes(root)) == 1
    api.patch_node_annotations("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}))})
    assert loop.reconcile_once().stopped == [DaemonKey(g.uuids[0], tenant="default")]
    assert mps_processes(root) == [] and alloc.mps.known() == {}


def test_a_daemon_allocate_just_started_is_kept_through_a_stale_ledger_read(root: Path) -> None:
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "svc")
    alloc.allocate([device_id(g.uuids[0], 0)])
    api.patch_node_annotations("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}))})
    assert MpsNode(api, "n0", alloc, grace=60).reconcile_once().stopped == []
    alloc.mps.stop_all()


def test_a_restarted_agent_clears_the_daemons_left_behind(root: Path) -> None:
    """An agent container that restarts loses its daemons' processes but not their folders; the new agent's
    first pass starts the daemons the ledger still needs and clears the others."""
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    control = install_standin(root / "bin")
    first = allocator(api, root, control)
    g = grant_of(api, "svc")
    first.allocate([device_id(g.uuids[0], 0)])
    (root / "st" / "kube" / "mps" / "deadbeef0000-self" / "pipe").mkdir(parents=True)  # a stale folder
    second = allocator(api, root, control)
    done = MpsNode(api, "n0", second, grace=0).reconcile_once()
    assert done.started == [] and len(mps_processes(root)) == 1  # the one the ledger needs kept running
    assert not (root / "st" / "kube" / "mps" / "deadbeef0000-self").exists()
    second.mps.stop_all()


def test_a_daemon_that_cannot_start_fails_allocate(root: Path) -> None:
    bad = failing_control(root / "bad", "no MPS here")
    api = cluster(pod("svc", LIMITS, annotations=SPATIAL))
    g = grant_of(api, "svc")
    with pytest.raises(AllocateError, match="spatial container main: .*no MPS here"):
        allocator(api, root, bad).allocate([device_id(g.uuids[0], 0)])


def test_each_user_gets_a_daemon_of_their_own() -> None:
    p = pod("svc", LIMITS)
    assert run_as_user(p, "main") == -1
    p["spec"]["securityContext"] = {"runAsUser": 1000}
    assert run_as_user(p, "main") == 1000
    p["spec"]["containers"][0]["securityContext"] = {"runAsUser": 2000}
    assert run_as_user(p, "main") == 2000
    ledger = formats.Ledger({}).with_entry(formats.PodGrant("n0", p["metadata"]["uid"], "default", "svc", (
        formats.ContainerGrant("main", _spatial_grant()),)))
    assert wanted_daemons(ledger, [p]) == {DaemonKey("GPU-x", 2000, "default")}  # the agent runs as root here


def test_a_pod_the_list_missed_keeps_its_daemon_but_no_roster_guess(root: Path) -> None:
    """A spatial container whose pod the node's pod list does not hold (a list read mid-change): its daemon is
    still wanted (never stopped for a missed pod), but its roster entry is not rewritten naming a daemon guessed
    from an empty spec (its user unknown)."""
    p = pod("svc", LIMITS)
    p["spec"]["securityContext"] = {"runAsUser": 1000}
    ledger = formats.Ledger({}).with_entry(formats.PodGrant("n0", p["metadata"]["uid"], "default", "svc", (
        formats.ContainerGrant("main", _spatial_grant()),)))
    assert wanted_daemons(ledger, []) == {DaemonKey("GPU-x", -1, "default")}
    alloc = allocator(FakeAPI(), root, install_standin(root / "bin"))  # the daemon's folder names only
    from gpuslice.kube.mpsnode import _daemons

    assert _daemons(ledger, [], alloc) == {}
    assert _daemons(ledger, [p], alloc) == {"k-1-main": str(alloc.mps_paths(DaemonKey("GPU-x", 1000, "default"))[0])}


def _spatial_grant():
    from gpuslice.spec import Engine, Grant, Slice

    return Grant("k-1-main", (Slice("GPU-x", 1 << 30, compute=25, engine=Engine.SPATIAL),))


def test_the_node_loop_takes_ended_pods_off_the_device_rosters(root: Path) -> None:
    """Pods end without telling the device plugin; the node loop takes their grants off the devices' policy rosters
    (the pacers' lists are bounded) once the ledger stops listing them, and keeps a grant written within the
    grace period (issue 15: the roster is root's, mounted read-only into the containers)."""
    api = cluster(pod("ts", LIMITS))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "ts")
    alloc.allocate([device_id(g.uuids[0], 0)])
    devices = alloc.paths(g.grant_id, local=True)["devices"]
    assert g.grant_id in read_policies(devices, g.uuids[0])
    MpsNode(api, "n0", alloc, grace=0).reconcile_once()
    assert g.grant_id in read_policies(devices, g.uuids[0])  # the ledger holds the pod: kept
    api.patch_node_annotations("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}))})
    MpsNode(api, "n0", alloc, grace=60).reconcile_once()
    assert g.grant_id in read_policies(devices, g.uuids[0])  # written moments ago: kept
    MpsNode(api, "n0", alloc, grace=0).reconcile_once()
    assert g.grant_id not in read_policies(devices, g.uuids[0])


def test_the_node_loop_writes_a_ledger_grant_missing_from_the_roster(root: Path) -> None:
    """A grant the ledger holds but the roster lacks (allocated before the roster existed, or its file removed)
    counts for nothing in its neighbours' allocation: the node loop writes it again at its next pass, as the ledger
    says it (issue 15)."""
    api = cluster(pod("ts", LIMITS))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "ts")
    alloc.allocate([device_id(g.uuids[0], 0)])
    devices = alloc.paths(g.grant_id, local=True)["devices"]
    want = read_policies(devices, g.uuids[0])[g.grant_id]
    (devices / folder_name(g.uuids[0]) / g.grant_id).unlink()
    assert g.grant_id not in read_policies(devices, g.uuids[0])
    MpsNode(api, "n0", alloc, grace=60).reconcile_once()
    assert read_policies(devices, g.uuids[0])[g.grant_id] == want


def test_the_node_loop_removes_the_host_folders_of_ended_pods_only(root: Path) -> None:
    """Pods end without telling the device plugin; their host folders (slice file, region, pacing-file folder) are
    mounted into the container while the pod exists, so the node loop removes them only once the pod is in neither
    the ledger nor the node's pod list, and the folders are older than the grace."""
    api = cluster(pod("ts", LIMITS))
    alloc = allocator(api, root, install_standin(root / "bin"))
    g = grant_of(api, "ts")
    alloc.allocate([device_id(g.uuids[0], 0)])
    local = alloc.paths(g.grant_id, local=True)
    folders = (local["slice"].parent, local["region"])
    assert all(f.is_dir() for f in folders)
    api.patch_node_annotations("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}))})
    MpsNode(api, "n0", alloc, grace=0).reconcile_once()
    assert all(f.is_dir() for f in folders)  # the pod is still on the node: its mounts are live
    api.delete_pod("default", "ts")
    MpsNode(api, "n0", alloc, grace=60).reconcile_once()
    assert all(f.is_dir() for f in folders)  # written moments ago: kept
    MpsNode(api, "n0", alloc, grace=0).reconcile_once()
    assert not any(f.exists() for f in folders)
