"""MPS daemons are per tenant, not per user id: in Kubernetes the daemon's clients share its pipe and shared-
memory folders (mounted read-write into every client container), so two pods of one ``runAsUser`` in two
namespaces were clients of one daemon and could reach each other's MPS server before this fix (issue 15,
attacker's review). The key of a daemon now holds the pod's namespace; local mode keeps one per user."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))

from fakeapi import FakeAPI  # noqa: E402
from kubefixtures import devices, node, pod  # noqa: E402
from mpskit import install_standin, mps_processes, short_root  # noqa: E402
from tenantkit import tenant_python  # noqa: E402

from gpuslice.host.mpsfleet import DaemonKey  # noqa: E402
from gpuslice.kube import formats  # noqa: E402
from gpuslice.kube.allocator import Allocator, PluginConfig, device_id  # noqa: E402
from gpuslice.kube.extender import Extender  # noqa: E402
from gpuslice.kube.mpsnode import MpsNode, wanted_daemons  # noqa: E402
from gpuslice.local.ledger import daemon_keys  # noqa: E402
from gpuslice.spec import Engine, Grant, Slice  # noqa: E402

SPATIAL = {formats.POD_ENGINE: "spatial"}
LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "25"}


@pytest.fixture
def root():
    for folder in short_root("gsmpst-"):
        os.chmod(folder, 0o755)  # the daemons run as uid 1000 (root drops to it) and must reach their folders
        yield folder


def bind_pod(api, ext, namespace: str) -> None:
    """Pod ``svc`` of ``runAsUser: 1000`` in ``namespace``, bound to the one-GPU node ``n0``."""
    p = pod("svc", LIMITS, namespace=namespace, annotations=SPATIAL)
    p["spec"]["securityContext"] = {"runAsUser": 1000}
    m = api.add_pod(p)["metadata"]
    assert ext.bind({"PodName": "svc", "PodNamespace": namespace, "PodUID": m["uid"], "Node": "n0"})["Error"] == ""


def grant_in(api, namespace: str):
    p = api.get_pod(namespace, "svc")
    return formats.decode_pod_grant(p["metadata"]["annotations"][formats.POD_GRANT]).containers[0]


def test_pods_of_one_user_in_two_namespaces_get_two_daemons(root: Path) -> None:
    api = FakeAPI()
    api.add_node("n0", node("n0", 1)["metadata"]["annotations"])
    ext = Extender(api, allocation_timeout=0)
    cfg = PluginConfig(node="n0", host_state_dir=root / "st", mps_control=install_standin(root / "bin", tenant_python()),
                       mps_private_shm=False, device_nodes="none")
    alloc = Allocator(api, cfg, lambda: devices("n0", 1))
    pipes = {}
    try:
        for ns in ("team-a", "team-b"):  # one after the other, as the scheduler's allocation lock makes it
            bind_pod(api, ext, ns)
            g = grant_in(api, ns)
            _, resp = alloc.allocate([device_id(g.uuids[0], 0)])
            pipes[ns] = dict((c, h) for c, h, _ in resp["mounts"])["/var/run/gpuslice/mps"]
        assert grant_in(api, "team-a").uuids[0] == grant_in(api, "team-b").uuids[0]  # one device, one user
        assert pipes["team-a"] != pipes["team-b"]  # yet a pipe directory (a daemon) each
        assert len(mps_processes(root)) == 2
        keys = {k.tenant for k in alloc.mps.known().values() if k is not None}
        assert keys == {"team-a", "team-b"}
        ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"].get(formats.NODE_LEDGER), "n0")
        pods = [api.get_pod(ns, "svc") for ns in ("team-a", "team-b")]
        assert {k.tenant for k in wanted_daemons(ledger, pods)} == {"team-a", "team-b"}
        assert MpsNode(api, "n0", alloc, grace=0).reconcile_once().stopped == []  # both wanted: both kept
    finally:
        alloc.mps.stop_all()


def test_a_namespace_cannot_name_a_path_and_local_mode_stays_per_user() -> None:
    key = DaemonKey("GPU-aaaaaaaa-1111-2222-3333-444444444444", 1000, "../../etc")
    assert "/" not in key.name and "." not in key.name and len(key.name) <= 40
    grant = Grant("g1", (Slice("GPU-x", 1 << 30, compute=25, engine=Engine.SPATIAL),))
    assert [k.tenant for k in daemon_keys(grant.slices, 1000)] == [""]
