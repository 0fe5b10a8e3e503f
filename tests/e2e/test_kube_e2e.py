"""End to end against the real control plane: a HAMi pod spec goes through the real kube-apiserver,
is mutated by our webhook (called by the API server over TLS), scheduled by the real kube-scheduler
calling our extender (filter, prioritize, bind), and bound with a grant — and under 500 concurrent
pods on 50 nodes, with the extender killed and restarted mid-run, no device is ever over-committed
and no pod is granted twice.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator

import pytest

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane, ExtenderProcess

pytestmark = pytest.mark.kube_e2e

NS = "gpuslice-e2e"
SCHEDULER = "gpuslice-scheduler"
GiB, MiB = 1024**3, 1024**2
DEVICE_MEMORY = 80 * GiB
SPLIT_COUNT = 10
POD_GRANT_KEY = "gpuslice.io/grant"  # formats.POD_GRANT, spelled out: the wire name is the contract


def hami_pod(name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod exactly as a HAMi user writes it: no schedulerName, HAMi's resource names in limits."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
                                 "command": ["sleep", "infinity"],
                                 "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]},
    }


def core(cp: "ControlPlane") -> Any:
    from kubernetes import client

    return client.CoreV1Api(cp.api())


def wait_bound(v1: Any, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Poll until every named pod has spec.nodeName; returns the pods as plain dicts."""
    deadline = time.monotonic() + timeout
    want = set(names)
    pods: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        items = v1.api_client.sanitize_for_serialization(v1.list_namespaced_pod(NS).items)
        pods = {p["metadata"]["name"]: p for p in items if p["metadata"]["name"] in want}
        if len(pods) == len(want) and all(p["spec"].get("nodeName") for p in pods.values()):
            return pods
        time.sleep(0.5)
    unbound = sorted(n for n in want if not pods.get(n, {}).get("spec", {}).get("nodeName"))
    why = {n: [c.get("message") for c in (pods.get(n, {}).get("status") or {}).get("conditions") or []]
           for n in unbound[:3]}
    raise AssertionError(f"{len(unbound)} pods not bound after {timeout}s, e.g. {why}")


def grant_of(pod: dict[str, Any]) -> Any:
    from gpuslice.kube import formats

    anns = pod["metadata"].get("annotations") or {}
    assert formats.POD_GRANT in anns, f"pod {pod['metadata']['name']} bound without a grant annotation"
    return formats.decode_pod_grant(anns[formats.POD_GRANT])


# ------------------------------------------------------------------------------- one HAMi pod
def test_hami_pod_is_mutated_scheduled_and_granted(control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess",
                                                   fake_nodes: list[str]) -> None:
    v1 = core(control_plane)
    created = v1.create_namespaced_pod(NS, hami_pod("hami-one", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                                                "nvidia.com/gpucores": 30}))
    # Mutated on the way in by our webhook, through the real API server.
    assert created.spec.scheduler_name == SCHEDULER
    assert "gpuslice.io/request" not in (created.metadata.annotations or {})  # the extender reads the limits
    pod = wait_bound(v1, ["hami-one"], 60)["hami-one"]
    g = grant_of(pod)
    assert g.node == pod["spec"]["nodeName"] and g.pod_uid == pod["metadata"]["uid"]
    (c,) = g.containers
    assert c.container == "cuda"
    (s,) = c.slices
    assert s.memory_limit == 3000 * MiB and s.compute == 30
    assert s.device_uuid.startswith(f"GPU-e2e-{g.node}-")


def test_gpumem_percentage_and_default_gpu_count(control_plane: "ControlPlane", webhook: Any,
                                                 extender: "ExtenderProcess", fake_nodes: list[str]) -> None:
    """HAMi semantics: gpumem-percentage is a share of the device; no nvidia.com/gpu means defaultGPUNum (1)."""
    v1 = core(control_plane)
    created = v1.create_namespaced_pod(NS, hami_pod("hami-pct", {"nvidia.com/gpumem-percentage": 25,
                                                                "nvidia.com/gpucores": 10}))
    assert created.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    pod = wait_bound(v1, ["hami-pct"], 60)["hami-pct"]
    (s,) = grant_of(pod).containers[0].slices
    assert s.memory_limit == DEVICE_MEMORY // 4 and s.compute == 10


def test_contradictory_request_is_refused_with_the_field_named(control_plane: "ControlPlane", webhook: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    v1 = core(control_plane)
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, hami_pod("hami-bad", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3072,
                                                          "nvidia.com/gpumem-percentage": 50}))
    assert 400 <= err.value.status < 500
    body = json.loads(err.value.body)
    assert "pods.gpuslice.io" in body["message"] and "denied" in body["message"]
    assert "nvidia.com/gpumem" in body["message"] and "gpumem-percentage" in body["message"]


@pytest.mark.parametrize("container,needle", [
    ({"volumeMounts": [{"name": "mine", "mountPath": "/etc/ld.so.preload", "subPath": "preload"}]}, "/etc/ld.so.preload"),
    ({"volumeMounts": [{"name": "mine", "mountPath": "/etc/gpuslice/"}]}, "/etc/gpuslice"),
    ({"env": [{"name": "LD_PRELOAD", "value": "/tmp/mine.so"}]}, "LD_PRELOAD"),
    ({"env": [{"name": "GPUSLICE_SLICE", "value": "/tmp/mine"}]}, "GPUSLICE_SLICE"),
])
def test_pods_that_would_step_out_of_their_slice_are_refused(control_plane: "ControlPlane", webhook: Any,
                                                            container: dict[str, Any], needle: str) -> None:
    """Issue 15: a pod mounting its own volume over the enforcer's paths, or setting LD_PRELOAD/GPUSLICE_*,
    is refused by the API server (our webhook), naming the field."""
    from kubernetes.client.exceptions import ApiException

    v1 = core(control_plane)
    pod = hami_pod("escape", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048})
    pod["spec"]["containers"][0].update(container)
    pod["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, pod)
    assert 400 <= err.value.status < 500
    message = json.loads(err.value.body)["message"]
    assert "pods.gpuslice.io" in message and "denied" in message and needle in message, message


def test_pod_without_gpu_is_left_alone(control_plane: "ControlPlane", webhook: Any) -> None:
    v1 = core(control_plane)
    pod = hami_pod("plain", {"cpu": "100m"})
    created = v1.create_namespaced_pod(NS, pod)
    assert created.spec.scheduler_name == "default-scheduler"
    assert "gpuslice.io/request" not in (created.metadata.annotations or {})


# ------------------------------------------------------------------------ 500 pods, one restart
LOAD_POOL = {"gpuslice-e2e/pool": "load"}
LOAD_TAINT = {"key": "gpuslice-e2e/pool", "value": "load-done", "effect": "NoSchedule"}


@pytest.fixture
def load_pool(control_plane: "ControlPlane", node_maker: Any) -> Iterator[list[str]]:
    """50 nodes of the 500-pod run's own. Its pods select them, so the shared nodes keep their room for
    the tests after it; once it is over the pool is tainted so that no later pod lands there either."""
    from concurrent.futures import ThreadPoolExecutor

    names = [f"load-node-{i:02d}" for i in range(50)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: node_maker(n, LOAD_POOL), names))
    yield names
    v1 = core(control_plane)
    for n in names:
        v1.patch_node(n, {"spec": {"taints": [LOAD_TAINT]}})


class FakeKubelets:
    """What the load pool's kubelets would do with each pod bound there: Allocate its GPU containers, in
    spec order, through the device plugin's real Allocator (one per node, as the chart's agent on that node).
    That releases the extender's allocation lock as in a cluster (without it each node would take one pod
    per device count and then wait for the lock's timeout). Unlike the plugin, the kubelet knows which pod
    it admits: every answer must be that pod's grant, or it is recorded in ``wrong``."""

    def __init__(self, agent_identity: Any, nodes: list[str], state: Any, devices_of: Any):
        from concurrent.futures import ThreadPoolExecutor as Pool

        from gpuslice.kube.api import connect
        from gpuslice.kube.allocator import Allocator, PluginConfig

        with Pool(8) as pool:
            apis = dict(zip(nodes, pool.map(lambda n: connect(agent_identity(n)), nodes)))
        self.api = apis[nodes[0]]  # any agent may list pods; each writes only its own node's
        self.allocators = {n: Allocator(apis[n], PluginConfig(node=n, host_state_dir=state / n, device_nodes="none"),
                                        lambda n=n: devices_of(n)) for n in nodes}
        self.admitted: set[str] = set()
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fake-kubelets", daemon=True)

    def __enter__(self) -> "FakeKubelets":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        with ThreadPoolExecutor(8) as pool:
            while not self.stop.wait(0.3):
                try:
                    pods = self.api.list_pods(field_selector="spec.nodeName!=")
                except Exception as exc:  # the API server is busy: next round
                    self.errors.append(f"list: {exc}")
                    continue
                for pod in pods:
                    uid = pod["metadata"]["uid"]
                    if pod["metadata"]["namespace"] == NS and pod["spec"]["nodeName"] in self.allocators \
                            and uid not in self.admitted:
                        self.admitted.add(uid)
                        pool.submit(self._admit, pod)

    def _admit(self, pod: dict[str, Any]) -> None:
        from gpuslice.kube.allocator import ID_SEP

        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        try:
            allocator = self.allocators[pod["spec"]["nodeName"]]
            for c in grant_of(pod).containers:
                match, _ = allocator.allocate([f"{s.device_uuid}{ID_SEP}{k}" for k, s in enumerate(c.slices)])
                if match.entry.pod_uid != uid or match.grant.container != c.container:
                    self.wrong.append(f"{name}/{c.container} got {match.entry.pod}/{match.grant.container}")
        except Exception as exc:  # asserted by the test
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")


def test_500_concurrent_pods_never_overcommit_even_across_extender_restarts(
        control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess", load_pool: list[str],
        agent_identity: Any, devices_of: Any, tmp_path: Any) -> None:
    from gpuslice.kube import formats

    rng = random.Random(7)
    specs: dict[str, dict[str, Any]] = {}
    for i in range(500):
        kind = rng.random()
        if kind < 0.1:    # two devices, a share of each
            limits = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": rng.choice([4096, 8192]), "nvidia.com/gpucores": 20}
        elif kind < 0.2:  # a percent of the device's memory
            limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": rng.choice([10, 25]),
                      "nvidia.com/gpucores": 10}
        else:
            # Both kinds of sizes: the API server rewrites 3000 as "3k" before admission, 3072 stays.
            limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": rng.choice([2000, 3000, 3072, 4096, 8192, 16000]),
                      "nvidia.com/gpucores": rng.choice([5, 10, 20, 30])}
        specs[f"load-{i:03d}"] = limits
    # Binpack (the default) sends them all at the same few nodes first: maximum contention.
    v1 = core(control_plane)
    create_errors: list[str] = []

    def create(name: str) -> None:
        try:
            pod = hami_pod(name, specs[name])
            pod["spec"]["nodeSelector"] = dict(LOAD_POOL)
            v1.create_namespaced_pod(NS, pod)
        except Exception as exc:  # collected and asserted below, not lost in a thread
            create_errors.append(f"{name}: {exc}")

    restarts: list[int] = []

    def restart_midway() -> None:
        # SIGKILL the extender three times while pods are still arriving and binds are in flight:
        # a fresh one has only what the API server holds (a kill between a ledger commit and the
        # binding leaves an entry for a pod that then binds elsewhere: the invariant must hold anyway).
        deadline = time.monotonic() + 150
        for threshold in (100, 220, 340):
            while time.monotonic() < deadline:
                bound = sum(1 for p in v1.list_namespaced_pod(NS).items
                            if p.spec.node_name and p.metadata.name.startswith("load-"))
                if bound >= threshold:
                    extender.restart()
                    restarts.append(bound)
                    break
                time.sleep(0.2)

    kubelets = FakeKubelets(agent_identity, load_pool, tmp_path, devices_of)  # 50 pod-bound tokens: before the clock
    started = time.monotonic()
    killer = threading.Thread(target=restart_midway, daemon=True)
    killer.start()
    with kubelets:
        with ThreadPoolExecutor(48) as pool:
            list(pool.map(create, specs))
        created_s = time.monotonic() - started
        assert not create_errors, create_errors[:5]
        pods = wait_bound(v1, list(specs), 200)
        bound_s = time.monotonic() - started
        killer.join(30)
        deadline = time.monotonic() + 30
        while len(kubelets.admitted) < len(specs) and time.monotonic() < deadline:
            time.sleep(0.2)
    # Allocate always answered with the admitted pod's own grant, and never had to refuse (the lock
    # kept each node at one waiting pod per device count, even across the extender's restarts).
    assert not kubelets.wrong, kubelets.wrong[:5]
    assert not [e for e in kubelets.errors if not e.startswith("list:")], kubelets.errors[:5]
    assert len(kubelets.admitted) == len(specs)
    assert len(restarts) == 3, f"the extender was restarted {len(restarts)} times, not 3: the test did not test that"
    assert extender.alive()
    print(f"500 pods: created in {created_s:.1f}s, all bound in {bound_s:.1f}s "
          f"(extender SIGKILLed and restarted at {restarts} bound)")

    # Every pod: one grant, on the node it is bound to, matching what it asked for.
    per_device: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: {"memory": 0, "compute": 0, "slices": 0})
    for name, pod in pods.items():
        g = grant_of(pod)
        node = pod["spec"]["nodeName"]
        assert g.node == node and g.pod_uid == pod["metadata"]["uid"], name
        assert node in load_pool, f"{name} was bound to {node}, outside the nodes its selector allows"
        (c,) = g.containers
        limits = specs[name]
        assert len(c.slices) == limits["nvidia.com/gpu"], name
        assert len({s.device_uuid for s in c.slices}) == len(c.slices), f"{name}: one device granted twice"
        for s in c.slices:
            assert s.device_uuid.startswith(f"GPU-e2e-{node}-"), f"{name}: device {s.device_uuid} is not on {node}"
            if "nvidia.com/gpumem" in limits:
                assert s.memory_limit == limits["nvidia.com/gpumem"] * MiB, name
            else:
                assert s.memory_limit == DEVICE_MEMORY * limits["nvidia.com/gpumem-percentage"] // 100, name
            assert s.compute == limits["nvidia.com/gpucores"], name
            d = per_device[(node, s.device_uuid)]
            d["memory"] += s.memory_limit
            d["compute"] += s.compute
            d["slices"] += 1

    # The invariant: no device is over-committed by the grants pods actually carry.
    for (node, uuid), d in per_device.items():
        assert d["memory"] <= DEVICE_MEMORY, f"{uuid}: {d['memory'] / GiB:.1f} GiB granted of 80"
        assert d["compute"] <= 100, f"{uuid}: {d['compute']}% compute granted"
        assert d["slices"] <= SPLIT_COUNT, f"{uuid}: {d['slices']} slices, split count {SPLIT_COUNT}"
    # Binpack under contention actually filled devices (else the bound above proves little).
    assert max(d["slices"] for d in per_device.values()) >= SPLIT_COUNT // 2 or \
        max(d["compute"] for d in per_device.values()) >= 80

    # The ledgers (the extender's state in the API server) agree with the pods: each pod's grant is
    # recorded exactly once, on its own node, and nothing is recorded for a pod bound elsewhere.
    nodes = v1.api_client.sanitize_for_serialization(v1.list_node().items)
    seen: dict[str, str] = {}
    uid_to_pod = {p["metadata"]["uid"]: p for p in pods.values()}
    for n in nodes:
        name = n["metadata"]["name"]
        ledger = formats.decode_ledger((n["metadata"].get("annotations") or {}).get(formats.NODE_LEDGER), name)
        for uid, g in ledger.entries.items():
            assert uid not in seen, f"pod {uid} is in the ledgers of both {seen[uid]} and {name}"
            seen[uid] = name
            if uid in uid_to_pod:
                pod = uid_to_pod[uid]
                assert pod["spec"]["nodeName"] == name, f"ledger of {name} holds pod {pod['metadata']['name']} bound elsewhere"
                assert [s for c in g.containers for s in c.slices] == \
                    [s for c in grant_of(pod).containers for s in c.slices]
    missing = [p["metadata"]["name"] for uid, p in uid_to_pod.items() if uid not in seen]
    assert not missing, f"bound pods absent from every ledger: {missing[:5]}"
    # Every pod was allocated, and so no node of the pool still holds the allocation lock.
    for n in nodes:
        if n["metadata"]["name"] in load_pool:
            held = formats.decode_allocating((n["metadata"].get("annotations") or {}).get(formats.NODE_ALLOCATING))
            assert not held & set(uid_to_pod), f"{n['metadata']['name']} still waits for Allocate of {held}"


# --------------------------------------------------------------------- malformed payloads: 4xx
@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
@pytest.mark.parametrize("body", [b"not json", b"", b"[]", b'{"Pod": 5}', b'{"PodName": ""}', b"{\"Nodes\": {\"items\": 7}}",
                                  json.dumps({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "Nodes": {
                                      "items": [{"metadata": {"name": "n", "annotations": ["x"]}}]}}).encode()])
def test_extender_answers_malformed_payloads_with_4xx(extender: "ExtenderProcess", path: str, body: bytes) -> None:
    """Bodies no kube-scheduler would send get a 4xx naming the problem, and the extender stays up."""
    import httpx

    r = httpx.post(extender.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"], r.text
    assert httpx.get(extender.url + "/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("path", ["/filter", "/prioritize"])
@pytest.mark.parametrize("pod", [
    {"metadata": {"name": "p"}, "spec": {"containers": "not-a-list"}},
    {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": ["nvidia.com/gpu"]}}]}},
    {"metadata": "p", "spec": {}},
])
def test_extender_answers_pods_of_the_wrong_shape_with_4xx(extender: "ExtenderProcess", path: str,
                                                           pod: dict[str, Any]) -> None:
    import httpx

    r = httpx.post(extender.url + path, json={"Pod": pod, "NodeNames": ["gpu-node-00"]}, timeout=10)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"], r.text
    assert httpx.get(extender.url + "/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}',
                                  b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x", "kind": {"kind": "Pod"}, "object": 3}}'])
def test_webhook_answers_malformed_reviews_with_4xx(webhook: Any, serving_cert: Any, body: bytes) -> None:
    import ssl

    import httpx

    # Over the same TLS the API server uses, verified against the test CA.
    ctx = ssl.create_default_context(cadata=serving_cert.ca_pem.decode())
    r = httpx.post(webhook.url + "/mutate", content=body, verify=ctx, timeout=10)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"], r.text


HAMI_EXAMPLE = """apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
spec:
  containers:
    - name: ubuntu-container
      image: ubuntu:18.04
      command: ["bash", "-c", "sleep 86400"]
      resources:
        limits:
          nvidia.com/gpu: 2 # requesting 2 vGPUs
          nvidia.com/gpumem: 3000 # Each vGPU contains 3000m device memory （Optional,Integer）
          nvidia.com/gpucores: 30 # Each vGPU uses 30% of the entire GPU （Optional,Integer)
"""


def test_hami_readme_example_works_unchanged(control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess",
                                             fake_nodes: list[str], tmp_path: Any) -> None:
    """HAMi's README pod, byte for byte (integers, comments and all), applied with kubectl."""
    import subprocess
    from pathlib import Path

    manifest = tmp_path / "gpu-pod.yaml"
    manifest.write_text(HAMI_EXAMPLE)
    kubectl = Path(__file__).resolve().parents[2] / "hack" / "bin" / "kubectl"  # linked by `make -C hack`
    assert kubectl.exists(), f"{kubectl} is missing; `make -C hack` links it"
    proc = subprocess.run([str(kubectl), "--kubeconfig", control_plane.kubeconfig, "-n", NS, "apply", "-f", str(manifest)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pod = wait_bound(core(control_plane), ["gpu-pod"], 60)["gpu-pod"]
    assert pod["spec"]["schedulerName"] == SCHEDULER
    (c,) = grant_of(pod).containers
    assert c.container == "ubuntu-container"
    assert len({s.device_uuid for s in c.slices}) == 2
    assert all(s.memory_limit == 3000 * MiB and s.compute == 30 for s in c.slices)
    # As in HAMi: two 3000 MiB vGPUs on two cards that others may still share, not two cards held whole.
    assert not c.exclusive


def _ledger_uids(v1: Any) -> dict[str, str]:
    from gpuslice.kube import formats

    out = {}
    for n in v1.api_client.sanitize_for_serialization(v1.list_node().items):
        name = n["metadata"]["name"]
        for uid in formats.decode_ledger((n["metadata"].get("annotations") or {}).get(formats.NODE_LEDGER), name).entries:
            out[uid] = name
    return out


def test_grants_of_deleted_pods_are_taken_back_and_live_ones_kept(
        control_plane: "ControlPlane", webhook: Any, extender: "ExtenderProcess", fake_nodes: list[str]) -> None:
    """Capacity comes back when pods go away (the extender's ledger collection, running in the chart's
    extender as the chart's ServiceAccount), and grants of pods that still exist are never collected."""
    v1 = core(control_plane)
    names = [f"gc-{i:02d}" for i in range(20)]
    kept = [f"gc-keep-{i}" for i in range(3)]
    for n in names + kept:
        v1.create_namespaced_pod(NS, hami_pod(n, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096,
                                                  "nvidia.com/gpucores": 10}))
    pods = wait_bound(v1, names + kept, 60)
    gone = {pods[n]["metadata"]["uid"] for n in names}
    live = {pods[n]["metadata"]["uid"] for n in kept}
    ledger = _ledger_uids(v1)
    assert gone | live <= set(ledger), "a bound pod's grant is missing from its node's ledger"
    for n in names:
        v1.delete_namespaced_pod(n, NS, grace_period_seconds=0)
    # No kubelet here, so pods vanish at once; the extender collects entries of missing pods 30 s
    # after their bind, every 15 s (chart defaults): allow both plus slack.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ledger = _ledger_uids(v1)
        if not gone & set(ledger):
            break
        time.sleep(1)
    assert not gone & set(ledger), f"{len(gone & set(ledger))} grants of deleted pods still held after 90 s"
    assert live <= set(ledger), f"grants of {len(live - set(ledger))} live pods were taken back"
    # The earlier tests' pods, still there and granted, were not collected either.
    granted = {p.metadata.uid: p.metadata.name for p in v1.list_namespaced_pod(NS).items
               if POD_GRANT_KEY in (p.metadata.annotations or {})}
    lost = sorted(name for uid, name in granted.items() if uid not in set(_ledger_uids(v1)))
    assert not lost, f"grants of live pods missing from every ledger: {lost[:5]}"
