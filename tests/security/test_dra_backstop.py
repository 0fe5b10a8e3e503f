"""The backstop in DRA mode: NVML's per-process device memory held to each prepared claim's limit, a process's
container known from its cgroup (which it cannot change) and the container's claim from the pod's
``resources.claims``. Before this the DRA agent ran no backstop at all (its ``--backstop`` flags were accepted and
ignored), so a container that cleared ``LD_PRELOAD`` for a child, or whose processes rewrote their shared
region, held whatever the device had free."""

from __future__ import annotations

from pathlib import Path

from gpuslice.host.backstop import Backstop, GpuProcess, Policy
from gpuslice.kube.backstop import KubeBackstop
from gpuslice.kube.dra.backstop import claim_containers, claim_tracked
from gpuslice.kube.dra.checkpoint import PreparedClaim
from gpuslice.spec import Grant, Slice

GiB = 1 << 30
DEV = "GPU-11111111-2222-3333-4444-555555555555"
CID = {name: c * 64 for name, c in (("main", "a"), ("helper", "b"), ("side", "c"), ("other", "d"))}


def _claims() -> dict[str, PreparedClaim]:
    grant = Grant("dra-c1", (Slice(DEV, 4 * GiB),))
    return {"c1": PreparedClaim("c1", "ml", "train-gpu-x", grant, (), pods=("train",))}


def _pods() -> list[dict]:
    statuses = [{"name": n, "containerID": f"containerd://{CID[n]}"} for n in ("main", "helper", "side")]
    return [{"metadata": {"name": "train", "namespace": "ml", "uid": "u-train"},
             "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                      "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                                     {"name": "helper", "resources": {"claims": [{"name": "gpu"}]}},
                                     {"name": "side"}]},
             "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x"}],
                        "containerStatuses": statuses}},
            # the same pod name in another namespace: not the claim's
            {"metadata": {"name": "train", "namespace": "other", "uid": "u-other"},
             "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "train-gpu-x"}],
                      "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]},
             "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{CID['other']}"}]}}]


def _proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, name in ((101, "main"), (102, "helper"), (201, "side"), (301, "other")):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/cri-containerd-{CID[name]}.scope\n")
    return root


def test_the_containers_that_get_a_claim_share_its_slice_and_no_one_else_does() -> None:
    assert claim_containers(_claims(), _pods()) == {CID["main"]: "dra-c1", CID["helper"]: "dra-c1"}
    assert [(t.grant_id, t.device_uuid, t.limit) for t in claim_tracked(_claims())] == [("dra-c1", DEV, 4 * GiB)]


def test_colluding_containers_of_a_claim_over_its_limit_are_killed_after_the_grace(tmp_path: Path) -> None:
    procs = [GpuProcess(DEV, 101, 3 * GiB), GpuProcess(DEV, 102, 3 * GiB),  # 6 GiB together on a 4 GiB claim
             GpuProcess(DEV, 201, 9 * GiB), GpuProcess(DEV, 301, 9 * GiB)]   # no claim of this node: reported
    killed: list[int] = []
    now = [0.0]
    guard = KubeBackstop(Backstop(lambda: procs, Policy(grace=2.0), kill=lambda pid, start: killed.append(pid) or True,
                                  clock=lambda: now[0], start_of=lambda pid: 1),
                         _claims, _pods, proc_root=_proc(tmp_path), clock=lambda: now[0],
                         tracked_of=claim_tracked, containers_of=claim_containers)
    first = guard.check_once()
    assert [(o.grant_id, o.used, o.action) for o in first.overruns] == [("dra-c1", 6 * GiB, "reported")]
    assert sorted(p.pid for p in first.unattributed) == [201, 301] and killed == []
    now[0] = 2.5
    assert guard.check_once().overruns[0].action == "killed" and sorted(killed) == [101, 102]
