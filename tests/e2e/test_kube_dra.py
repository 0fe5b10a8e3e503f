"""The DRA driver end to end, on the real v1.37 kube-apiserver, kube-scheduler (its own DRA allocator, consumable
capacity) and the real resourceclaim controller, with stand-in kubelets that call the driver's real gRPC sockets
the way the kubelet's plugin manager and DRA manager do (the kubelet's own protos, k8s.io/kubelet v0.37.2).

* ``test_chart_examples_...``: `gpuslice kube-agent` with the chart's DRA flags (mode: dra), as the chart's agent
  account under its RBAC and write policy, publishes a node's ResourceSlice; the chart's two example
  ResourceClaimTemplates (4Gi + 30 % of one GPU; 2 whole GPUs on one NVLink island) become claims, kube-scheduler
  allocates them, the stand-in kubelet registers the plugin and prepares them: slice files and CDI specs say
  exactly what was allocated. Prepare again, kill the agent (SIGKILL) and start it again: the same answers, the
  plugin registers again. Unprepare removes everything, twice.
* ``test_500_claims_...``: 500 claims of mixed shapes on 50 nodes, created at once: the scheduler's allocator
  never puts more on a device than its capacities, whole-GPU claims hold their GPUs alone, pairs share an NVLink
  island; every bound pod's claim is prepared through its node's gRPC socket (concurrently) into the slice its
  allocation says.

The agent's write policy is checked too: a node's agent cannot write another node's ResourceSlice.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import grpc
import pytest
import yaml

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane

pytestmark = pytest.mark.kube_e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuslice"
HELM = ROOT / "hack" / "bin" / "helm"
KUBECTL = ROOT / "hack" / "bin" / "kubectl"
EXAMPLES = ROOT / "deploy" / "examples" / "dra"
SYSTEM_NS = "gpuslice-system"
RELEASE = "gd"                      # its own release: the device-plugin tests' "gs" objects stay as they are
AGENT_SA = f"{RELEASE}-gpuslice-agent"
NS = "gpuslice-dra"
TAINT = {"key": "gpuslice-e2e/dra", "value": "only", "effect": "NoSchedule"}
TOLERATION = {"key": "gpuslice-e2e/dra", "operator": "Exists", "effect": "NoSchedule"}
GiB = 1024**3
DEVICE_MEMORY = 80 * GiB
SPLIT = 10


# ------------------------------------------------------------------------------------ helpers
def wait_for(cond: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


def fake_devices(node: str) -> list[Any]:
    """4 × H100 80GB: GPUs 0-1 and 2-3 joined by NVLink (two islands), two per NUMA node."""
    from gpuslice.spec import Device

    uuids = [f"GPU-dra-{node}-{k}" for k in range(4)]
    return [Device(uuid=u, index=k, name="NVIDIA H100 80GB HBM3", memory_total=DEVICE_MEMORY, sm_count=132,
                   model="H100-80GB-HBM3", numa_node=k // 2, nvlink_peers=(uuids[k ^ 1],), pci_bus_id=f"0000:{k:02x}:00.0",
                   compute_capability="9.0")
            for k, u in enumerate(uuids)]


def create_node(core: Any, name: str, group: str) -> None:
    """A plain Node (no kubelet), Ready, labelled ``gpuslice-e2e/dra=<group>``, with only DRA pods allowed (the
    taint keeps other tests' pods away)."""
    core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpuslice-e2e/dra": group}}})
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node"}]}})
    core.patch_node(name, {"spec": {"taints": [TAINT]}})


def kubectl_apply(cp: "ControlPlane", docs: list[dict[str, Any]], namespace: str | None = None) -> None:
    args = [str(KUBECTL), "--kubeconfig", cp.kubeconfig, "apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    done = subprocess.run(args, input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


class StandInKubelet:
    """The kubelet's side for one node: its plugin watcher (registration socket → GetInfo, NotifyRegistrationStatus)
    and its DRA manager (NodePrepareResources / NodeUnprepareResources with the pod's claims, as the kubelet
    names them: namespace, UID, name, read from the API server)."""

    def __init__(self, registry_dir: Path, core: Any, custom: Any):
        from gpuslice.kube.dra.kubeletapi import load

        self.k = load()
        self.registry_dir = registry_dir
        self.core, self.custom = core, custom
        self.channel: grpc.Channel | None = None
        self.info: Any = None

    def register(self, timeout: float = 60) -> Any:
        """Wait for a registration socket that answers (a killed plugin leaves a dead one behind until its
        successor replaces it; the kubelet's watcher acts on the new socket), then register the plugin."""
        def answering() -> tuple[Path, Any] | None:
            for sock in self.registry_dir.glob("*-reg.sock"):
                try:
                    with grpc.insecure_channel(f"unix://{sock}") as ch:
                        return sock, self.k.reg_grpc.RegistrationStub(ch).GetInfo(self.k.reg.InfoRequest(), timeout=5)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
            return None

        sock, info = wait_for(answering, timeout, f"a registration socket in {self.registry_dir} that answers")
        # What the kubelet's DRA plugin manager checks before it accepts a plugin.
        assert info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions, info
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            self.k.reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                self.k.reg.RegistrationStatus(plugin_registered=True), timeout=10)
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        self.info = info
        return info

    def claims_of(self, pod: dict[str, Any]) -> list[Any]:
        ns = pod["metadata"]["namespace"]
        names = {s["name"]: s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out = []
        for ref in pod["spec"].get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or names.get(ref["name"])
            assert name, f"pod {ns}/{pod['metadata']['name']}: no claim for {ref['name']} yet"
            claim = self.custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", name)
            out.append(self.k.dra.Claim(namespace=ns, uid=claim["metadata"]["uid"], name=name))
        return out

    def prepare(self, claims: list[Any]) -> Any:
        assert self.channel is not None
        stub = self.k.dra_grpc.DRAPluginStub(self.channel)
        return stub.NodePrepareResources(self.k.dra.NodePrepareResourcesRequest(claims=claims), timeout=60)

    def unprepare(self, claims: list[Any]) -> Any:
        assert self.channel is not None
        stub = self.k.dra_grpc.DRAPluginStub(self.channel)
        return stub.NodeUnprepareResources(self.k.dra.NodeUnprepareResourcesRequest(claims=claims), timeout=60)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


def answer_of(resp: Any, uid: str) -> dict[str, Any]:
    c = resp.claims[uid]
    return {"error": c.error, "devices": [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids),
                                           d.share_id) for d in c.devices]}


def results_of(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def dra_chart(control_plane: "ControlPlane") -> dict[str, Any]:
    """The chart rendered with mode: dra (release "gd"): its DeviceClass, agent account, RBAC and write policy
    applied to the API server; the agent's command line returned for the tests to run."""
    from kubernetes import client

    done = subprocess.run([str(HELM), "template", RELEASE, str(CHART), "--namespace", SYSTEM_NS, "--set", "mode=dra"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Deployment", "MutatingWebhookConfiguration"}, "mode: dra must not install the scheduler"
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--dra" in args
    wanted = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                                               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    ns = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (SYSTEM_NS, NS)]
    kubectl_apply(control_plane, ns + wanted)
    return {"args": args, "docs": docs, "core": client.CoreV1Api(control_plane.api()),
            "custom": client.CustomObjectsApi(control_plane.api())}


@pytest.fixture(scope="module")
def dra_identity(dra_chart: dict[str, Any], agent_identity: Any) -> Any:
    """``identity(node)``: the chart's DRA agent account with a token bound to a pod on ``node`` (conftest's
    agent_identity): the API server names the node in it, and the write policy checks that name."""
    return lambda node: agent_identity(node, AGENT_SA)


class AgentProcess:
    """`gpuslice kube-agent` with the chart's DRA flags for one fake node; host paths under ``root``."""

    def __init__(self, args: list[str], node: str, kubeconfig: str, root: Path):
        from gpuslice.host.devices import snapshot_json

        self.root = root
        self.paths = {k: root / k for k in ("plugins", "registry", "cdi", "state", "lib")}
        for p in self.paths.values():
            p.mkdir(parents=True, exist_ok=True)
        snapshot = root / "devices.json"
        snapshot.write_text(json.dumps(snapshot_json(fake_devices(node), "e2e fake node")))
        self.cmd = [str(Path(sys.executable).parent / "gpuslice"), *args, "--node", node, "--kubeconfig", kubeconfig,
                    "--snapshot", str(snapshot), "--dra-plugin-dir", str(self.paths["plugins"]),
                    "--dra-registry-dir", str(self.paths["registry"]), "--cdi-dir", str(self.paths["cdi"]),
                    "--host-state-dir", str(self.paths["state"]), "--state-dir", str(self.paths["state"]),
                    "--library", str(self.paths["lib"] / "libgpuslice.so"), "--metrics-port", "0",
                    "--device-nodes", "always"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.log = self.root / f"agent-{self.starts}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(30)

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""


# ------------------------------------------------------------------------------------ one node, the examples
def test_chart_examples_are_allocated_by_the_scheduler_and_prepared_by_the_agent(
        control_plane: "ControlPlane", dra_chart: dict[str, Any], dra_identity: Any, tmp_path: Path) -> None:
    from gpuslice.enforcer.slicefile import read_slice_file
    from gpuslice.kube.api import KubeError, connect
    from gpuslice.kube.dra.api import ClientDraAPI

    core, custom = dra_chart["core"], dra_chart["custom"]
    node = "dra-examples"
    create_node(core, node, "examples")
    agent = AgentProcess(dra_chart["args"], node, dra_identity(node), tmp_path)
    agent.start()
    kubelet = StandInKubelet(agent.paths["registry"], core, custom)
    try:
        slice_name = f"{node}-gpuslice.io"
        got = wait_for(lambda: _get_slice(custom, slice_name), 60, f"ResourceSlice {slice_name}\n{agent.tail()}")
        assert [d["attributes"]["uuid"]["string"] for d in got["spec"]["devices"]] == [d.uuid for d in fake_devices(node)]
        # The write policy: this node's agent may not write another node's slice.
        other = json.loads(json.dumps(got))
        other["metadata"] = {"name": "someone-else-gpuslice.io"}
        other["spec"]["nodeName"] = other["spec"]["pool"]["name"] = "someone-else"
        agent_api = ClientDraAPI(connect(dra_identity(node)))

        def refused() -> KubeError | None:
            try:
                agent_api.create_resource_slice(other)
            except KubeError as exc:
                return exc
            # The API server compiles a new policy asynchronously: created before it was active. Take it back.
            custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", "someone-else-gpuslice.io")
            return None

        refusal = wait_for(refused, 60, "the chart's write policy to refuse another node's ResourceSlice")
        assert refusal.status == 403 and "may write only ResourceSlices" in str(refusal), refusal

        info = kubelet.register()
        assert info.name == "gpuslice.io" and Path(info.endpoint) == agent.paths["plugins"] / "dra.sock"

        # The chart's examples, as a user applies them (plus the toleration and node of this test).
        docs = []
        for f in sorted(EXAMPLES.glob("*.yaml")):
            for d in yaml.safe_load_all(f.read_text()):
                if d["kind"] == "Pod":
                    d["spec"]["tolerations"] = [TOLERATION]
                    d["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
                docs.append(d)
        kubectl_apply(control_plane, docs, NS)
        pods = {d["metadata"]["name"] for d in docs if d["kind"] == "Pod"}
        assert pods == {"gpu-slice-4gi-30", "two-gpus-nvlink"}
        bound = wait_for(lambda: _bound(core, NS, pods), 90, "the example pods to be scheduled")
        assert {p["spec"]["nodeName"] for p in bound.values()} == {node}

        # Then a pod that would step out of its slice (its own LD_PRELOAD): no webhook sees DRA pods, so the
        # driver refuses to prepare its claim, naming the container and the variable (issue 15); it reads the
        # pod with the chart's RBAC.
        escaping = json.loads(json.dumps(next(d for d in docs if d["kind"] == "Pod"
                                              and d["metadata"]["name"] == "gpu-slice-4gi-30")))
        escaping["metadata"]["name"] = "escapes-its-slice"
        escaping["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]
        kubectl_apply(control_plane, [escaping], NS)
        placed = wait_for(lambda: _bound(core, NS, {"escapes-its-slice"}), 90, "the escaping pod to be scheduled")
        (refused_claim,) = kubelet.claims_of(placed["escapes-its-slice"])
        refusal = answer_of(kubelet.prepare([refused_claim]), refused_claim.uid)
        assert not refusal["devices"] and "spec.containers[0] (main).env[0].name 'LD_PRELOAD'" in refusal["error"], \
            refusal
        assert not (agent.paths["cdi"] / f"gpuslice.io-claim_{refused_claim.uid}.json").exists()

        answers = {}
        for name, pod in bound.items():
            claims = kubelet.claims_of(pod)
            resp = kubelet.prepare(claims)
            (claim,) = claims
            answers[name] = (claim, answer_of(resp, claim.uid))
            assert answers[name][1]["error"] == "", answers[name]
        state, cdi = agent.paths["state"], agent.paths["cdi"]
        devices = {d.uuid.lower(): d for d in fake_devices(node)}

        # 4Gi + 30 %: one device, the slice file says 4 GiB and 30, the CDI spec mounts it read-only.
        claim, answer = answers["gpu-slice-4gi-30"]
        ((requests, pool, device, cdi_ids, share),) = answer["devices"]
        assert requests == ["gpu"] and pool == node and share and cdi_ids == [f"gpuslice.io/claim={claim.uid}-{device}"]
        sf = read_slice_file(state / "kube" / "grants" / f"dra-{claim.uid}" / "slice")
        assert (sf.devices, sf.memory_limit, sf.compute, sf.mode, sf.priority) == \
            ((devices[device].uuid,), 4 * GiB, 30, "hard", 1)
        spec = json.loads((cdi / f"gpuslice.io-claim_{claim.uid}.json").read_text())
        mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
        assert mounts["/etc/gpuslice/slice"]["hostPath"] == str(state / "kube" / "grants" / f"dra-{claim.uid}" / "slice")
        for path in ("/etc/gpuslice/slice", "/usr/local/gpuslice/lib/libgpuslice.so", "/etc/ld.so.preload"):
            assert mounts[path]["options"][0] == "ro", path
        assert f"NVIDIA_VISIBLE_DEVICES={devices[device].uuid}" in spec["containerEdits"]["env"]

        # Two whole GPUs on one NVLink island: the pair 0-1 or 2-3, each held whole.
        claim2, answer2 = answers["two-gpus-nvlink"]
        pair = sorted(devices[d[2]].index for d in answer2["devices"])
        assert pair in ([0, 1], [2, 3]), pair
        sf2 = read_slice_file(state / "kube" / "grants" / f"dra-{claim2.uid}" / "slice")
        assert set(sf2.devices) == {devices[d[2]].uuid for d in answer2["devices"]} and sf2.memory_limit == DEVICE_MEMORY
        assert device not in {d[2] for d in answer2["devices"]}  # the shared slice's GPU is not held whole

        # Prepare again: the same answer. SIGKILL the agent and start it again: it registers again and answers
        # the same from its checkpoint (the claims are not re-read: their allocation could not change anyway).
        refs = [answers[n][0] for n in sorted(answers)]
        first = kubelet.prepare(refs)
        assert kubelet.prepare(refs) == first
        agent.stop(signal.SIGKILL)
        agent.start()
        kubelet.register()
        assert kubelet.prepare(refs) == first, agent.tail()
        checkpoint = json.loads((state / "kube" / "dra" / "checkpoint.json").read_text())
        assert set(checkpoint["claims"]) == {c.uid for c in refs}

        # Unprepare: every file of the claims goes; again: still success.
        undo = kubelet.unprepare(refs)
        assert {u: c.error for u, c in undo.claims.items()} == {c.uid: "" for c in refs}
        for c in refs:
            assert not (cdi / f"gpuslice.io-claim_{c.uid}.json").exists()
            assert not (state / "kube" / "grants" / f"dra-{c.uid}").exists()
            assert not (state / "kube" / "regions" / f"dra-{c.uid}").exists()
        assert {u: c.error for u, c in kubelet.unprepare(refs).claims.items()} == {c.uid: "" for c in refs}
        assert json.loads((state / "kube" / "dra" / "checkpoint.json").read_text())["claims"] == {}
        # SIGTERM: the plugin leaves and takes its sockets away; the ResourceSlice stays.
        assert agent.stop(signal.SIGTERM) == 0, agent.tail()
        assert not list(agent.paths["registry"].iterdir()), "the registration socket outlived the agent"
        assert _get_slice(custom, slice_name)
    finally:
        kubelet.close()
        if agent.proc and agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        for name in ("gpu-slice-4gi-30", "two-gpus-nvlink"):
            _delete_pod(core, NS, name)
        # No garbage collector runs here to follow the slice's owner reference: delete both.
        _delete(lambda: custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", slice_name))
        _delete(lambda: core.delete_node(node))


def _get_slice(custom: Any, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _bound(core: Any, ns: str, names: set[str]) -> dict[str, dict[str, Any]] | None:
    items = core.api_client.sanitize_for_serialization(core.list_namespaced_pod(ns).items)
    pods = {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in names}
    if len(pods) == len(names) and all(p["spec"].get("nodeName") for p in pods.values()):
        return pods
    return None


def _delete(call: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        if exc.status != 404:
            raise


def _delete_pod(core: Any, ns: str, name: str) -> None:
    _delete(lambda: core.delete_namespaced_pod(name, ns, grace_period_seconds=0))


# ------------------------------------------------------------------------------------ 500 claims, 50 nodes
SCALE_NODES = 50
SCALE_CLAIMS = 500


@pytest.fixture(scope="module")
def dra_fleet(control_plane: "ControlPlane", dra_chart: dict[str, Any], dra_identity: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """50 fake nodes, each with the DRA agent's parts running in this process (publisher: the node's
    ResourceSlice, written with that node's agent identity; the kubelet plugin on its own sockets) and a
    stand-in kubelet registered with it."""
    from gpuslice.kube.allocator import PluginConfig
    from gpuslice.kube.api import connect
    from gpuslice.kube.dra.agent import build
    from gpuslice.kube.dra.api import ClientDraAPI
    from gpuslice.kube.dra.driver import DraConfig
    from gpuslice.kube.dra.resourceslice import Sharing

    core, custom = dra_chart["core"], dra_chart["custom"]
    root = tmp_path_factory.mktemp("dra-fleet")
    nodes = [f"dra-{i:02d}" for i in range(SCALE_NODES)]

    def up(node: str) -> tuple[Any, StandInKubelet]:
        create_node(core, node, "fleet")
        base = root / node
        files = PluginConfig(node=node, split_count=SPLIT, host_state_dir=base / "state",
                             host_library=base / "libgpuslice.so", device_nodes="always")
        cfg = DraConfig(node=node, sharing=Sharing(split_count=SPLIT), files=files, plugin_dir=base / "plugins",
                        registry_dir=base / "registry", cdi_dir=base / "cdi", watch_interval=0.5)
        agent = build(ClientDraAPI(connect(dra_identity(node))), cfg, fake_devices(node))
        agent.publisher.publish()
        agent.plugin.start()
        kubelet = StandInKubelet(cfg.registry_dir, core, custom)
        kubelet.register()
        return agent, kubelet

    with ThreadPoolExecutor(8) as pool:
        parts = dict(zip(nodes, pool.map(up, nodes)))
    yield {"nodes": nodes, "agents": {n: a for n, (a, _) in parts.items()},
           "kubelets": {n: k for n, (_, k) in parts.items()}, "core": core, "custom": custom}
    for agent, kubelet in parts.values():
        kubelet.close()
        agent.plugin.stop()


def _shape(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A claim spec: 80 % a shared slice (1-24 GiB, 0-50 % compute), 12 % one whole GPU, 8 % two whole GPUs on
    one NVLink island. Together they ask for more than 50 × 4 GPUs hold, so the allocator must also refuse."""
    kind = rng.random()
    if kind < 0.80:
        req = {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "capacity": {"requests": {
            "memory": f"{rng.randint(1, 24)}Gi", "compute": str(rng.choice([0, 10, 20, 30, 50]))}}}}
        return "shared", {"devices": {"requests": [req]}}
    if kind < 0.92:
        return "whole", {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io"}}]}}
    return "pair", {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": 2}}],
                                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpuslice.io/nvlinkIsland"}]}}


def test_500_claims_on_50_nodes_never_exceed_a_device_and_prepare_to_what_was_allocated(
        control_plane: "ControlPlane", dra_fleet: dict[str, Any]) -> None:
    from gpuslice.enforcer.slicefile import read_slice_file
    from gpuslice.kube.dra.resourceslice import device_name

    core, custom = dra_fleet["core"], dra_fleet["custom"]
    rng = random.Random(16)
    shapes = {f"claim-{i:03d}": _shape(rng) for i in range(SCALE_CLAIMS)}
    errors: list[str] = []
    started = time.monotonic()

    def create(name: str) -> None:
        try:
            custom.create_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": shapes[name][1]})
            core.create_namespaced_pod(NS, {
                "metadata": {"name": name},
                "spec": {"tolerations": [TOLERATION], "nodeSelector": {"gpuslice-e2e/dra": "fleet"},
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                         "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}})
        except Exception as exc:  # collected and asserted below, not lost in a thread
            errors.append(f"{name}: {exc}")

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(create, shapes))
    assert not errors, errors[:3]
    created = time.monotonic() - started

    def settled() -> dict[str, dict[str, Any]] | None:
        """Every pod bound, or marked unschedulable by the scheduler (no capacity left for it)."""
        items = core.api_client.sanitize_for_serialization(core.list_namespaced_pod(NS).items)
        pods = {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in shapes}
        done = [p for p in pods.values() if p["spec"].get("nodeName") or any(
            c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
            for c in (p.get("status") or {}).get("conditions") or [])]
        return pods if len(done) == len(shapes) else None

    pods = wait_for(settled, 600, "every pod to be scheduled or found unschedulable", interval=1.0)
    scheduled = time.monotonic() - started
    claims = {c["metadata"]["name"]: c for c in custom.list_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaims")["items"] if c["metadata"]["name"] in shapes}
    bound = {n for n, p in pods.items() if p["spec"].get("nodeName")}
    refused = set(shapes) - bound
    # Both happen: the shapes ask for more than the fleet holds.
    assert len(bound) >= 350 and refused, (len(bound), len(refused))

    # Per device, what the scheduler's allocator handed out.
    use: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: {"memory": 0, "compute": 0, "slices": 0, "whole": 0,
                                                                       "claims": 0})
    islands = {device_name(d.uuid): d.index // 2 for n in dra_fleet["nodes"] for d in fake_devices(n)}
    for name in bound:
        results = results_of(claims[name])
        node = pods[name]["spec"]["nodeName"]
        kind = shapes[name][0]
        assert len(results) == (2 if kind == "pair" else 1), (name, results)
        assert {r["pool"] for r in results} == {node} and {r["driver"] for r in results} == {"gpuslice.io"}
        if kind == "pair":
            assert len({r["device"] for r in results}) == 2 and len({islands[r["device"]] for r in results}) == 1
        for r in results:
            u = use[(node, r["device"])]
            for k in ("memory", "compute", "slices"):
                u[k] += int(r["consumedCapacity"][k])
            u["claims"] += 1
            u["whole"] += kind != "shared"
    for name in refused:
        assert not results_of(claims[name]), f"{name} is unscheduled but allocated"
    for (node, device), u in use.items():
        assert u["memory"] <= DEVICE_MEMORY and u["compute"] <= 100 and u["slices"] <= SPLIT, (node, device, u)
        if u["whole"]:
            assert u["claims"] == 1, (node, device, u)  # a whole GPU is held alone

    # Every bound pod's claim prepared through its node's gRPC socket, all at once.
    def prepare(name: str) -> tuple[str, Any, Any]:
        kubelet = dra_fleet["kubelets"][pods[name]["spec"]["nodeName"]]
        (claim,) = kubelet.claims_of(pods[name])
        return name, claim, kubelet.prepare([claim])

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        prepared = list(pool.map(prepare, sorted(bound)))
    prepare_s = time.monotonic() - t0
    for name, claim, resp in prepared:
        answer = answer_of(resp, claim.uid)
        assert answer["error"] == "", (name, answer)
        results = results_of(claims[name])
        assert sorted(d[2] for d in answer["devices"]) == sorted(r["device"] for r in results)
        node = pods[name]["spec"]["nodeName"]
        agent = dra_fleet["agents"][node]
        sf = read_slice_file(agent.driver.cfg.file_config.local_state / "kube" / "grants" / f"dra-{claim.uid}" / "slice")
        by_device = {device_name(u): u for u in sf.devices}
        assert sorted(by_device) == sorted(r["device"] for r in results)
        for r in results:
            limit = sf.limit_for(by_device[r["device"]])
            consumed = int(r["consumedCapacity"]["memory"])
            assert limit == (DEVICE_MEMORY if consumed == DEVICE_MEMORY else consumed), (name, r, limit)
            assert sf.compute == int(r["consumedCapacity"]["compute"])
    print(f"\n500 DRA claims on 50 nodes: created in {created:.1f}s, all scheduled or refused after {scheduled:.1f}s "
          f"({len(bound)} bound, {len(refused)} unschedulable); {len(bound)} prepared over gRPC in {prepare_s:.1f}s")
    for name in shapes:
        _delete_pod(core, NS, name)
