"""HAMi conformance: every case in ``tests/kube/hami/`` — manifests modelled on HAMi's NVIDIA examples and
documented annotations (Pods, Deployments, Jobs, CronJobs, StatefulSets, init containers, native sidecars,
multi-container pods) — goes through the admission webhook (``webhook.mutate``, with the namespace quota
check), then the extender's filter, prioritize and bind (against ``fakeapi.FakeAPI`` holding a fake fleet),
and what it was granted is checked against the case's expectations (``tests/support/hamicases.py``).

The same cases marked ``e2e: true`` run through the real kube-apiserver and kube-scheduler in
``tests/e2e/test_kube_hami_conformance.py``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from fakeapi import FakeAPI
from hamicases import MiB, case_files, check_grant, load, pods_of, quantity_bytes, role
from kubefixtures import H100
from mpskit import install_standin, short_root

from gpuslice.host.devices import load_snapshot
from gpuslice.kube import formats, resources, webhook
from gpuslice.kube.allocator import Allocator, PluginConfig, device_id
from gpuslice.kube.extender import Extender
from gpuslice.kube.quota import AdmissionQuota
from gpuslice.placement import PlacementPolicy
from gpuslice.spec import Device, GiB, Grant, Slice

NAMESPACE = "team-a"


def _gpus(node: str, model: str, name: str, memory: int, count: int, *, pairs: bool = True) -> list[Device]:
    """``count`` GPUs; NVLink between 0-1 and 2-3 (when ``pairs``), NUMA node = index // 2."""
    uuids = [f"GPU-{node}-{i}" for i in range(count)]
    return [Device(uuid=u, index=i, name=name, memory_total=memory, sm_count=132, model=model, numa_node=i // 2,
                   nvlink_peers=(uuids[i ^ 1],) if pairs and (i ^ 1) < count else ())
            for i, u in enumerate(uuids)]


def _h100(node: str, count: int = 4) -> list[Device]:
    return _gpus(node, "H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", H100, count)


def _triangle(node: str) -> list[Device]:
    """4 H100s: 0, 1 and 2 NVLinked to each other, 3 to none; NUMA nodes 0, 0, 1, 1."""
    uuids = [f"GPU-{node}-{i}" for i in range(4)]
    return [Device(uuid=u, index=i, name="NVIDIA H100 80GB HBM3", memory_total=H100, sm_count=132,
                   model="H100-80GB-HBM3", numa_node=i // 2,
                   nvlink_peers=tuple(p for p in uuids[:3] if p != u) if i < 3 else ())
            for i, u in enumerate(uuids)]


def _all_linked(node: str) -> list[Device]:
    """4 H100s on an NVSwitch (every pair NVLinked), NUMA nodes 0, 0, 1, 1 (as the e2e nodes)."""
    uuids = [f"GPU-{node}-{i}" for i in range(4)]
    return [Device(uuid=u, index=i, name="NVIDIA H100 80GB HBM3", memory_total=H100, sm_count=132,
                   model="H100-80GB-HBM3", numa_node=i // 2, nvlink_peers=tuple(p for p in uuids if p != u))
            for i, u in enumerate(uuids)]


FLEETS = {
    "h100": lambda: [("n1", _h100("n1")), ("n2", _h100("n2"))],
    "h100-one": lambda: [("n1", _h100("n1"))],
    "mixed": lambda: [("a100", _gpus("a100", "A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40 * GiB, 2)),
                      ("v100", _gpus("v100", "V100-PCIE-32GB", "Tesla V100-PCIE-32GB", 32 * GiB, 2)),
                      ("a10", _gpus("a10", "A10", "NVIDIA A10", 24 * GiB, 2))],
    "mig": lambda: [("mig", load_snapshot("a100-80gb-mig")), ("h100", _h100("h100", 2))],
    "l4": lambda: [("n1", _gpus("n1", "L4", "NVIDIA L4", 24 * GiB, 1))],
    "topo": lambda: [("n1", _triangle("n1"))],
    "nvswitch": lambda: [("n1", _all_linked("n1"))],
}


def _fleet(api: FakeAPI, spec: Any) -> tuple[dict[str, dict[str, Any]], dict[str, list[Device]]]:
    """Put the case's fleet into ``api``; returns every placeable UUID → what check_grant reads, and each
    node's devices."""
    spec = {"preset": spec} if isinstance(spec, str) else dict(spec)
    occupied: dict[str, list[Slice]] = {}
    info: dict[str, dict[str, Any]] = {}
    nodes = FLEETS[spec["preset"]]()
    for k, slot in enumerate(spec.get("occupied") or []):
        uuid = next(d.uuid for n, devs in nodes if n == slot["node"] for d in devs if d.index == slot["index"])
        for _ in range(int(slot.get("count", 1))):
            occupied.setdefault(slot["node"], []).append(
                Slice(uuid, int(slot.get("memory", 1000)) * MiB, int(slot.get("compute", 0))))
    for name, devs in nodes:
        anns = {formats.NODE_DEVICES: formats.encode_node_devices(devs)}
        if occupied.get(name):
            grant = formats.PodGrant(name, f"occupied-{name}", "other", f"occupied-{name}", tuple(
                formats.ContainerGrant(f"c{k}", Grant(f"k-occupied-{name}-{k}", (s,)))
                for k, s in enumerate(occupied[name])))
            anns[formats.NODE_LEDGER] = formats.encode_ledger(formats.Ledger({}).with_entry(grant))
        cordon = (spec.get("cordon") or {}).get(name)
        if cordon:
            anns[formats.HAMI_DEVICE_CORDON] = ",".join(f"GPU-{name}-{i}" for i in cordon)
        api.add_node(name, anns)
        for d in devs:
            base = {"uuid": d.uuid, "numa": d.numa_node, "index": d.index, "card": d.uuid, "peers": d.nvlink_peers}
            if d.mig_enabled:
                for m in d.mig_instances:
                    info[m.uuid] = {**base, "uuid": m.uuid, "memory": m.memory_total, "profile": m.profile}
            else:
                info[d.uuid] = {**base, "memory": d.memory_total, "profile": ""}
    return info, dict(nodes)


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "review-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": pod["metadata"]["namespace"], "operation": "CREATE", "object": pod}}


class Run:
    """One case: the fleet in a FakeAPI, the webhook's quota check and an extender on them."""

    def __init__(self, case: dict[str, Any], state: Path):
        knobs = case.get("config") or {}
        self.cfg = resources.KubeConfig(policy=PlacementPolicy.parse(knobs.get("policy", "binpack")),
                                        default_memory_mib=int(knobs.get("defaultMem", 0)))
        self.api = FakeAPI()
        self.devices, self.node_devices = _fleet(self.api, case.get("fleet", "h100"))
        self.state = state
        if case.get("quota"):
            self.api.add_quota(NAMESPACE, "gpu-quota", {k: str(v) for k, v in case["quota"].items()})
        self.extender = Extender(self.api, self.cfg)
        self.quota = AdmissionQuota(self.api, self.cfg)
        self.before_uuids: set[str] = set()
        self.daemons: list = []  # the MPS daemons of spatial containers (the stand-in), stopped at the end

    def admit(self, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the AdmissionReview response, the pod as admitted or None)."""
        response = webhook.mutate(_review(pod), self.cfg, self.quota)["response"]
        if not response["allowed"]:
            return response, None
        patch = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
        return response, self.api.add_pod(webhook.apply_json_patch(pod, patch))

    def schedule(self, pod: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
        """Filter, prioritize and bind as kube-scheduler would: (filter result, chosen node, bind error)."""
        nodes, _ = self.api.list_nodes()
        args = {"Pod": pod, "Nodes": {"items": nodes}}
        out = self.extender.filter(args)
        fitting = [n["metadata"]["name"] for n in out["Nodes"]["items"]]
        if not fitting or out["Error"]:
            return out, "", ""
        scores = self.extender.prioritize({"Pod": pod, "Nodes": {"items": [n for n in nodes if n["metadata"]["name"] in fitting]}})
        best = max(scores, key=lambda h: h["Score"])["Host"]  # ties: the first, as listed
        meta = pod["metadata"]
        bound = self.extender.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                                    "Node": best})
        if not bound["Error"]:
            self.kubelet(pod, best)
        return out, best, bound["Error"]

    def kubelet(self, pod: dict[str, Any], node: str) -> None:
        """What the node's kubelet does next: Allocate each GPU container through the device plugin's real
        Allocator, init containers first, in spec order (an app container after an init container of the
        same device count is handed the init container's device IDs again, as the kubelet reuses them).
        Each answer must be that container's own grant; the allocation lock is released at the end."""
        grant = self.grant(pod)
        alloc = Allocator(self.api, PluginConfig(node=node, host_state_dir=self.state / node, device_nodes="none",
                                                 mps_private_shm=False), lambda: self.node_devices[node])
        self.daemons.append(alloc.mps)
        reusable: dict[int, list[str]] = {}
        spec = pod["spec"]
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
            cg = grant.container(c["name"])
            if cg is None:
                continue
            ids = reusable.pop(len(cg.slices), None) or [device_id(u, 0) for u in cg.uuids]
            match, answer = alloc.allocate(ids)
            assert match.grant.container == c["name"], f"Allocate for {c['name']} answered {match.grant.container}"
            assert answer["envs"]["GPUSLICE_GRANT"] == cg.grant_id
            if cg.kind == "init":
                reusable[len(cg.slices)] = ids
        node_anns = self.api.get_node(node)["metadata"]["annotations"]
        assert pod["metadata"]["uid"] not in formats.decode_allocating(node_anns.get(formats.NODE_ALLOCATING))

    def grant(self, pod: dict[str, Any]) -> formats.PodGrant:
        got = self.api.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        return formats.decode_pod_grant(got["metadata"]["annotations"][formats.POD_GRANT])


def _check_admission(where: str, want: dict[str, Any], response: dict[str, Any], admitted: dict[str, Any] | None,
                     cfg: resources.KubeConfig) -> None:
    warnings = " | ".join(response.get("warnings") or [])
    for text in want.get("warnings") or []:
        assert text in warnings, f"{where}: no warning with {text!r} in {warnings!r}"
    if "refused" in want:
        assert not response["allowed"], f"{where}: admitted, expected refusal with {want['refused']!r}"
        assert want["refused"] in response["status"]["message"], f"{where}: {response['status']['message']}"
        return
    assert response["allowed"] and admitted is not None, f"{where}: refused: {response.get('status')}"
    assert admitted["spec"]["schedulerName"] == want.get("schedulerName", cfg.scheduler_name), where
    containers = {c["name"]: c for part in ("initContainers", "containers") for c in admitted["spec"].get(part) or []}
    for name, limits in (want.get("limits") or {}).items():
        got = containers[name]["resources"]["limits"]
        for key, value in limits.items():
            if value is None:
                assert key not in got and key not in containers[name]["resources"].get("requests", {}), f"{where}/{name}: {key}"
            else:
                assert got.get(key) == str(value) == containers[name]["resources"]["requests"].get(key), \
                    f"{where}/{name}: {key} = {got.get(key)}"
    anns = admitted["metadata"].get("annotations") or {}
    for key, value in (want.get("annotations") or {}).items():
        assert anns.get(key) == value, f"{where}: annotation {key} = {anns.get(key)!r}"


def _check_placement(run: Run, where: str, want: dict[str, Any], pod: dict[str, Any]) -> None:
    out, node, error = run.schedule(pod)
    if "unschedulable" in want:
        assert not out["Nodes"]["items"], f"{where}: fits {[n['metadata']['name'] for n in out['Nodes']['items']]}"
        reasons = out["Error"] or " | ".join(out["FailedNodes"].values())
        assert want["unschedulable"] in reasons, f"{where}: {reasons}"
        return
    assert node, f"{where}: no node fits: {out['Error'] or out['FailedNodes']}"
    if "bindRefused" in want:
        assert want["bindRefused"] in error, f"{where}: bind answered {error!r}"
        return
    assert not error, f"{where}: bind refused: {error}"
    if "node" in want:
        assert node == want["node"], f"{where}: placed on {node}, expected {want['node']}"
    grant = run.grant(pod)
    if "grant" in want:
        check_grant(grant, want["grant"], run.devices, where)
    used = {s.device_uuid for s in grant.slices()}
    if want.get("apart_from_before"):
        assert not used & run.before_uuids, f"{where}: shares {sorted(used & run.before_uuids)} with the before pods"
    if "accounted" in want:
        held = sum(s.memory_limit for slices, _ in grant.charges() for s in slices)
        assert held == quantity_bytes(want["accounted"]["memory"]), f"{where}: the pod holds {held // MiB} MiB"


@pytest.fixture
def mps_root(monkeypatch: pytest.MonkeyPatch):
    """A short state folder (MPS sockets need short paths) with the stand-in MPS control daemon on it."""
    for folder in short_root("gshami-"):
        monkeypatch.setenv("GPUSLICE_MPS_CONTROL", str(install_standin(folder / "bin")))
        yield folder


@pytest.mark.parametrize("path", case_files(), ids=lambda p: p.stem)
def test_hami_case(path: Path, mps_root: Path) -> None:
    case, workloads = load(path)
    run = Run(case, mps_root / "s")
    try:
        _check_case(path, case, workloads, run)
    finally:
        for daemons in run.daemons:
            daemons.stop_all()


def _check_case(path: Path, case: dict, workloads: list, run: "Run") -> None:
    for w in (w for w in workloads if role(w) == "before"):
        for pod in pods_of(w, NAMESPACE):
            response, admitted = run.admit(pod)
            assert admitted is not None, f"{path.name}: before pod {pod['metadata']['name']} refused: {response}"
            _, node, error = run.schedule(admitted)
            assert node and not error, f"{path.name}: before pod {pod['metadata']['name']} not bound ({error})"
            run.before_uuids |= {s.device_uuid for s in run.grant(admitted).slices()}
    subjects = [p for w in workloads if role(w) != "before" for p in pods_of(w, NAMESPACE)]
    for k, pod in enumerate(subjects):
        want = case["last"] if k + 1 == len(subjects) and "last" in case else case["expect"]
        where = f"{path.name}:{pod['metadata']['name']}"
        response, admitted = run.admit(pod)
        _check_admission(where, want, response, admitted, run.cfg)
        if admitted is not None and want.get("schedule", True):
            _check_placement(run, where, want, admitted)


def test_every_hami_example_kind_and_annotation_has_a_case() -> None:
    """The suite covers each of HAMi's NVIDIA examples and each annotation the issue lists (by the
    ``follows`` text of the cases), and every workload kind."""
    follows = " ".join(load(p)[0]["follows"] for p in case_files())
    kinds = {w["kind"] for p in case_files() for w in load(p)[1]}
    examples = ("default_use", "default_use_legacy", "example", "mig_example", "dynamic_mig_example",
                "dynamic_mig_profile_preference", "sglang_gpu_sharing", "specify_card_type_not_use",
                "specify_card_type_to_use", "specify_index_not_use", "specify_index_to_use",
                "specify_scheduling_policy", "specify_uuid_not_use", "specify_uuid_to_use", "use_as_normal",
                "use_exclusive_card", "use_memory_fraction", "use_sharing_card", "vllm_cross_vgpu", "vulkan_example")
    missing = [e for e in examples if f"examples/nvidia/{e}.yaml" not in follows]
    assert not missing, f"no case follows {missing}"
    for topic in ("topology-aware", "mutex", "binpack,numa", "spread,numa", "vgpu-mode", "nvidia.com/mig-",
                  "init container", "sidecar", "schedulerName", "numa-bind", "gpuSchedulerPolicy", "ResourceQuota",
                  "use-gpuuuid", "privileged", "device-scoring-weights", "gpumem-percentage: 0", "device-cordon",
                  "multi-container"):
        assert topic in follows, f"no case follows {topic}"
    assert {"Pod", "Deployment", "Job", "CronJob", "StatefulSet"} <= kinds
