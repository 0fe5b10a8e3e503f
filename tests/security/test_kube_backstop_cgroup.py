"""The backstop on a Kubernetes node: a GPU process belongs to the container its cgroup names (which the process
cannot change), the container to the grant the ledger gives it; over the limit its processes are killed, those
of other containers and of no gpuslice container are never counted against it (issue 15: processes of one
container could hold N times the limit by rewriting their read-write region)."""

from __future__ import annotations

from pathlib import Path

from gpuslice.host.backstop import Backstop, GpuProcess, Policy
from gpuslice.kube import formats
from gpuslice.kube.backstop import KubeBackstop, attribute_by_cgroup, container_grants
from gpuslice.spec import Grant, Slice

GiB, MiB = 1 << 30, 1 << 20
DEV = "GPU-11111111-2222-3333-4444-555555555555"
CID_A = "a" * 64
CID_B = "b" * 64
CID_OTHER = "c" * 64


def _ledger() -> formats.Ledger:
    entry = formats.PodGrant(node="n1", pod_uid="0f0e-pod-a", namespace="ns", pod="train", bound_at=1.0, containers=(
        formats.ContainerGrant("main", Grant(formats.grant_id_for("0f0e-pod-a", "main"), (Slice(DEV, 4 * GiB),))),
        formats.ContainerGrant("side", Grant(formats.grant_id_for("0f0e-pod-a", "side"), (Slice(DEV, 2 * GiB),))),))
    return formats.Ledger({}).with_entry(entry)


PODS = [{"metadata": {"uid": "0f0e-pod-a", "name": "train", "namespace": "ns"},
         "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{CID_A}"},
                                          {"name": "side", "containerID": f"cri-o://{CID_B}"}]}},
        {"metadata": {"uid": "other-pod"}, "status": {"containerStatuses": [
            {"name": "x", "containerID": f"containerd://{CID_OTHER}"}]}}]


def _proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)


def _fake_proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    # systemd driver (containerd), cgroupfs driver, cri-o, and a container of a pod gpuslice never granted
    _proc(root, 101, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f0e_pod_a.slice/"
                     f"cri-containerd-{CID_A}.scope\n")
    _proc(root, 102, f"12:memory:/kubepods/burstable/pod0f0e-pod-a/{CID_A}\n0::/kubepods/burstable/pod0f0e-pod-a/{CID_A}\n")
    _proc(root, 201, f"0::/kubepods.slice/crio-{CID_B}.scope\n")
    _proc(root, 301, f"0::/kubepods.slice/cri-containerd-{CID_OTHER}.scope\n")
    _proc(root, 401, "0::/user.slice/user-1000.slice/session-3.scope\n")
    # a container gpuslice never granted, with cgroup delegation, names a child cgroup after a granted
    # container's ID; and a cgroup v1 text whose hierarchies disagree (no runtime writes that)
    _proc(root, 501, f"0::/kubepods.slice/cri-containerd-{CID_OTHER}.scope/{CID_A}\n")
    _proc(root, 502, f"12:memory:/kubepods/burstable/pod0f0e-pod-a/{CID_A}\n0::/kubepods/besteffort/podx/{CID_OTHER}\n")
    return root


def test_container_ids_map_to_their_grants():
    found = container_grants(_ledger(), PODS)
    assert found == {CID_A: formats.grant_id_for("0f0e-pod-a", "main"), CID_B: formats.grant_id_for("0f0e-pod-a", "side")}


def test_processes_are_attributed_by_their_cgroup_only(tmp_path):
    root = _fake_proc(tmp_path)
    found = attribute_by_cgroup(container_grants(_ledger(), PODS), [101, 102, 201, 301, 401, 999], root)
    main, side = formats.grant_id_for("0f0e-pod-a", "main"), formats.grant_id_for("0f0e-pod-a", "side")
    assert found == {101: main, 102: main, 201: side}


def test_a_nested_cgroup_named_after_a_granted_container_is_not_that_container(tmp_path):
    """Attributed to the victim, such a process was counted against the victim's limit, and the backstop killed
    the victim's processes with it (issue 15's review): the container is the first ID on the path."""
    root = _fake_proc(tmp_path)
    assert attribute_by_cgroup(container_grants(_ledger(), PODS), [501, 502], root) == {}


def test_a_container_over_its_limit_is_killed_and_no_one_else(tmp_path):
    root = _fake_proc(tmp_path)
    procs = [GpuProcess(DEV, 101, 3 * GiB), GpuProcess(DEV, 102, 3 * GiB),  # main: 6 GiB on a 4 GiB slice
             GpuProcess(DEV, 201, 1 * GiB),                                  # side: within its 2 GiB
             GpuProcess(DEV, 301, 9 * GiB), GpuProcess(DEV, 401, 9 * GiB)]   # no gpuslice container
    killed: list[int] = []
    now = [0.0]
    guard = KubeBackstop(Backstop(lambda: procs, Policy(grace=2.0), kill=lambda pid, start: killed.append(pid) or True,
                                  clock=lambda: now[0], start_of=lambda pid: 1),
                         ledger=_ledger, pods=lambda: PODS, proc_root=root, clock=lambda: now[0])
    first = guard.check_once()
    assert [(o.grant_id.endswith("main"), o.used, o.action) for o in first.overruns] == [(True, 6 * GiB, "reported")]
    assert sorted(s.pid for s in first.unattributed) == [301, 401] and killed == []
    now[0] = 2.5
    second = guard.check_once()
    assert second.overruns[0].action == "killed" and sorted(killed) == [101, 102]
    assert guard.latest is second


def test_a_new_container_is_looked_up_at_once_not_after_the_pod_cache_expires(tmp_path):
    root = _fake_proc(tmp_path)
    pods = [PODS[1]]  # the pod's statuses are not known yet at the first look
    now = [0.0]
    guard = KubeBackstop(Backstop(lambda: [GpuProcess(DEV, 101, GiB)], Policy()), ledger=_ledger,
                         pods=lambda: list(pods), proc_root=root, clock=lambda: now[0], pods_ttl=60)
    assert [s.pid for s in guard.check_once().unattributed] == [101]
    pods[:] = PODS
    now[0] = 1.5  # well within the pods' 60 s cache: an unattributed process refreshes it
    assert guard.check_once().unattributed == ()


def test_a_cgroup_name_that_is_not_utf8_stops_no_attribution(tmp_path):
    """A container with cgroup delegation names its own cgroups, with any bytes: one that is not UTF-8 is read like
    any other path (it belongs to no granted container here) and the other processes are still attributed."""
    root = _fake_proc(tmp_path)
    (root / "601").mkdir()
    (root / "601" / "cgroup").write_bytes(f"0::/kubepods.slice/cri-containerd-{CID_OTHER}.scope/x\xff\n".encode("latin-1"))
    found = attribute_by_cgroup(container_grants(_ledger(), PODS), [101, 601, 201], root)
    assert found == {101: formats.grant_id_for("0f0e-pod-a", "main"), 201: formats.grant_id_for("0f0e-pod-a", "side")}
