"""The chart's rendered objects are accepted by a real kube-apiserver (server-side dry run with
strict field validation): no unknown fields, no wrong types, RBAC that references roles the API
server bootstraps, a MutatingWebhookConfiguration the admission registry accepts.

`helm template` and `helm lint` alone cannot catch a misspelt field inside a Deployment; the API
server can.
"""

from __future__ import annotations

import subprocess
import time
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.kube_e2e

CHART = ROOT / "deploy" / "helm" / "gpuslice"
HELM = ROOT / "hack" / "bin" / "helm"
NAMESPACE = "gpuslice-system"


def _helm() -> Path:
    if not HELM.exists():
        proc = subprocess.run(["make", "-C", str(ROOT / "hack"), "helm"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"`make -C hack helm` failed:\n{proc.stdout}\n{proc.stderr}")
    return HELM


def _kubectl() -> str:
    # The kubectl of the harness's release, linked by `make -C hack`.
    path = ROOT / "hack" / "bin" / "kubectl"
    if not path.exists():
        pytest.fail(f"{path} is missing; `make -C hack` links it")
    return str(path)


def _kubectl_file(cp: ControlPlane, manifest: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl ARGS -f <manifest>` against the test control plane."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(manifest)
        f.flush()
        return subprocess.run([_kubectl(), "--kubeconfig", cp.kubeconfig, *args, "-f", f.name],
                              capture_output=True, text=True, timeout=120)


def _apply(cp: ControlPlane, manifest: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _kubectl_file(cp, manifest, "apply", "--validate=strict", *extra)


@pytest.mark.parametrize("sets", [[], ["metrics.port=9555", "sharing.splitCount=4", "scheduler.webhook.failurePolicy=Fail"]])
def test_rendered_chart_is_accepted_by_the_api_server(control_plane: ControlPlane, sets: list[str]) -> None:
    ns = _apply(control_plane, f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n")
    assert ns.returncode == 0, ns.stderr
    args = [str(_helm()), "template", "gs", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    rendered = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = sorted({d["kind"] for d in docs})
    assert {"DaemonSet", "Deployment", "MutatingWebhookConfiguration", "ClusterRole"} <= set(kinds)
    proc = _apply(control_plane, rendered.stdout, "--dry-run=server")
    assert proc.returncode == 0, f"API server refused the chart:\n{proc.stderr}\n{proc.stdout}"
    # One "... (server dry run)" line per object: nothing was skipped.
    accepted = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(accepted) == len(docs), proc.stdout


def test_a_misspelt_field_is_refused(control_plane: ControlPlane) -> None:
    """The dry run above can fail: strict validation refuses an unknown field."""
    bad = """apiVersion: apps/v1
kind: DaemonSet
metadata: {name: typo, namespace: default}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: x, volumeMount: []}]
"""
    proc = _apply(control_plane, bad, "--dry-run=server")
    assert proc.returncode != 0
    assert "volumeMount" in proc.stderr


@pytest.mark.parametrize(("identity", "verb", "resource", "allowed"), [
    ("scheduler", "create", "pods/binding", True),
    ("scheduler", "patch", "nodes", True),
    ("scheduler", "watch", "nodes", True),
    ("scheduler", "list", "secrets", False),
    ("scheduler", "delete", "nodes", False),  # (it may delete pods: kube-scheduler's own role, for preemption)
    ("scheduler", "update", "nodes", False),
    ("agent", "patch", "nodes", True),
    ("agent", "list", "pods", True),
    ("agent", "create", "pods/binding", False),
    ("agent", "list", "nodes", False),
    ("agent", "get", "secrets", False),
])
def test_chart_rbac_is_enforced_by_the_api_server(control_plane: "ControlPlane", chart_identities: dict[str, str],
                                                  identity: str, verb: str, resource: str, allowed: bool) -> None:
    """The identities the e2e extender and agent run as hold exactly the chart's grants: the positive
    e2e results are not an artefact of an all-powerful token."""
    # `can-i create pods/binding` would ask about a pod named "binding"; subresources have their own flag.
    kind, _, sub = resource.partition("/")
    args = [verb, kind, "--all-namespaces"] + ([f"--subresource={sub}"] if sub else [])
    proc = subprocess.run([_kubectl(), "--kubeconfig", chart_identities[identity], "auth", "can-i", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == ("yes" if allowed else "no"), (proc.stdout, proc.stderr)


GUARDED = "guard-e2e.example.com/gpu"  # a name no other e2e test asks for: the live policy cannot touch them


def _guard_pod(name: str, scheduler: str | None) -> str:
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"limits": {GUARDED: "1"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                           "spec": spec})


def test_guard_policy_is_enforced_by_the_api_server(control_plane: ControlPlane) -> None:
    """The chart's ValidatingAdmissionPolicy, live in the real API server: a pod asking for the advertised
    resource that would go to another scheduler (the webhook did not mutate it) is refused with the
    guard's message; the same pod sent to the gpuslice scheduler is admitted."""
    rendered = subprocess.run([str(_helm()), "template", "gs", str(CHART), "--namespace", NAMESPACE,
                               "--set", f"resourceName={GUARDED}", "--set", "scheduler.name=gs-guard"],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    guard = [d for d in yaml.safe_load_all(rendered.stdout)
             if d and d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
             and d["metadata"]["name"].endswith("-guard")]
    assert len(guard) == 2
    manifest = yaml.safe_dump_all(guard)
    applied = _apply(control_plane, manifest)
    assert applied.returncode == 0, applied.stderr
    try:
        # The API server compiles a new policy asynchronously: wait until it refuses.
        deadline = time.monotonic() + 30
        while True:
            refused = _apply(control_plane, _guard_pod("bypass", "default-scheduler"), "--dry-run=server")
            if refused.returncode != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert refused.returncode != 0, "the guard never refused a GPU pod for default-scheduler"
        assert "must be scheduled by gs-guard" in refused.stderr and "default-scheduler" in refused.stderr
        admitted = _apply(control_plane, _guard_pod("through-gpuslice", "gs-guard"), "--dry-run=server")
        assert admitted.returncode == 0, admitted.stderr
        plain = _apply(control_plane, yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                                      "metadata": {"name": "no-gpu", "namespace": "default"},
                                                      "spec": {"containers": [{"name": "c", "image": "x"}]}}),
                       "--dry-run=server")
        assert plain.returncode == 0, plain.stderr  # pods without the resource are not the guard's business
    finally:
        _kubectl_file(control_plane, manifest, "delete")


def test_write_policies_keep_each_account_to_its_own_annotations(control_plane: ControlPlane,
                                                                chart_identities: dict[str, str],
                                                                agent_identity: Any, node_maker: Any,
                                                                devices_of: Any) -> None:
    """RBAC lets the agent patch every Node and Pod and the extender every Node; the chart's
    ValidatingAdmissionPolicies, live in the API server, narrow that to what the code writes: the agent only
    gpuslice.io/devices / allocating of the node its pod-bound token names and gpuslice.io/allocated /
    resize-status of pods bound there; the extender only gpuslice.io/ledger / allocating of nodes and
    gpuslice.io/grant / allocated / resize-status of pods (its account is kube-scheduler's too, whose pod writes
    go through subresources)."""
    from kubernetes import client

    from gpuslice.kube import formats
    from gpuslice.kube.api import KubeError, connect

    core = client.CoreV1Api(control_plane.api())
    for n in ("policy-a", "policy-b"):
        node_maker(n)
    for name, node in (("on-a", "policy-a"), ("on-b", "policy-b")):
        core.create_namespaced_pod("default", {"metadata": {"name": name},
                                               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
    agent, unbound, extender = (connect(agent_identity("policy-a")), connect(chart_identities["agent"]),
                                connect(chart_identities["scheduler"]))

    def outcome(call: Any) -> str:
        try:
            call()
            return "allowed"
        except KubeError as exc:
            assert exc.status == 403, exc
            return str(exc)

    def node_patch(api: Any, node: str, body: dict[str, Any]) -> Any:
        return lambda: api._call("PATCH", f"/api/v1/nodes/{node}", body, api.MERGE)

    # Valid values where a write is allowed: the session's extender reads these nodes too.
    devices = formats.encode_node_devices(devices_of("policy-a"), split_count=10)
    allowed = [
        lambda: agent.patch_node_annotations("policy-a", {"gpuslice.io/devices": devices, "gpuslice.io/allocating": None}),
        lambda: agent.patch_pod_annotations("default", "on-a", {"gpuslice.io/allocated": formats.encode_allocated([])}),
        lambda: agent.patch_pod_annotations("default", "on-a", {"gpuslice.io/resize-status": "{}"}),  # live resize
        lambda: extender.patch_node_annotations("policy-b", {"gpuslice.io/ledger": formats.encode_ledger(formats.Ledger({})),
                                                             "gpuslice.io/allocating": formats.encode_allocating(["x"])}),
        lambda: extender.patch_node_annotations("policy-b", {"gpuslice.io/allocating": None}),
        lambda: extender.patch_pod_annotations("default", "on-b", {"gpuslice.io/grant": "g", "gpuslice.io/allocated": None}),
        lambda: extender.patch_pod_annotations("default", "on-b", {"gpuslice.io/resize-status": "{}"}),
    ]
    for call in allowed:
        assert outcome(call) == "allowed"
    refused = {
        "may not change node policy-b":
            lambda: agent.patch_node_annotations("policy-b", {"gpuslice.io/devices": "refused"}),
        "not gpuslice.io/ledger": lambda: agent.patch_node_annotations("policy-a", {"gpuslice.io/ledger": "refused"}),
        "labels, finalizers": node_patch(agent, "policy-a", {"metadata": {"labels": {"gpu": "off"}}}),
        "spec stay": node_patch(agent, "policy-a", {"spec": {"unschedulable": True}}),
        "not gpuslice.io/grant":
            lambda: agent.patch_pod_annotations("default", "on-a", {"gpuslice.io/grant": "refused"}),
        "on-b is bound to policy-b":
            lambda: agent.patch_pod_annotations("default", "on-b", {"gpuslice.io/allocated": "refused"}),
        "pod-bound service-account token":
            lambda: unbound.patch_node_annotations("policy-a", {"gpuslice.io/devices": "refused"}),
        "not gpuslice.io/devices":
            lambda: extender.patch_node_annotations("policy-a", {"gpuslice.io/devices": "refused"}),
        "labels, finalizers, owner": node_patch(extender, "policy-a", {"metadata": {"labels": {"gpu": "off"}}}),
        "annotation(s) gpuslice.io/grant, gpuslice.io/allocated, gpuslice.io/resize-status of pods, not team":
            lambda: extender.patch_pod_annotations("default", "on-b", {"team": "refused"}),
        "only annotations of pods":
            lambda: extender._call("PATCH", "/api/v1/namespaces/default/pods/on-b",
                                   {"metadata": {"labels": {"gpu": "off"}}}, extender.MERGE),
    }
    for needle, call in refused.items():
        said = outcome(call)
        assert said != "allowed" and needle in said, (needle, said)
