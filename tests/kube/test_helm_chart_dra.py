"""The chart with ``mode: dra``: the agent runs as a DRA driver with the kubelet's plugin folders and the CDI
folder, a DeviceClass selects the driver's devices, the agent's account may do exactly what the DRA driver
calls, a write policy keeps it to its own node's ResourceSlice, and nothing of the gpuslice scheduler is
installed. The policy's behaviour is checked live in tests/e2e/test_kube_dra.py."""

from __future__ import annotations

import json
from pathlib import Path

from test_helm_chart import CHART, _rules, args_of, by_kind, flag, helm, one, render, run_helm  # noqa: F401 (fixture)

from gpuslice.kube.dra.resourceslice import DRIVER


def test_dra_mode_renders_the_driver_and_no_scheduler(helm: Path) -> None:
    objs = render(helm, "mode=dra", "dra.minMemory=2Gi", "sharing.splitCount=4", "sharing.computeMode=soft")
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"Deployment", "MutatingWebhookConfiguration", "ConfigMap", "Job"}, kinds
    assert set(by_kind(objs, "ServiceAccount")) == {"gs-gpuslice-agent"}
    assert set(by_kind(objs, "Service")) == {"gs-gpuslice-metrics"}
    args = args_of(objs, "DaemonSet", "agent")
    assert "--dra" in args
    assert (flag(args, "--min-memory"), flag(args, "--split-count"), flag(args, "--compute-mode")) == ("2Gi", "4", "soft")
    spec = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert host["kubelet-plugins"] == "/var/lib/kubelet/plugins" and host["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert host["cdi"] == "/var/run/cdi" and "device-plugins" not in host
    # The agent's sockets and CDI specs land where the kubelet and the runtime look for them on the host.
    assert flag(args, "--dra-plugin-dir").startswith(mounts["kubelet-plugins"] + "/")
    assert flag(args, "--dra-registry-dir") == mounts["plugins-registry"]
    assert flag(args, "--cdi-dir") == mounts["cdi"]
    dc = one(objs, "DeviceClass")
    assert dc["metadata"]["name"] == "gpuslice.io"
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


def test_dra_agent_flags_exist_in_the_cli() -> None:
    import typer

    from gpuslice.cli import app
    from test_helm_chart import _helm_for_module

    options = {o for p in typer.main.get_command(app).commands["kube-agent"].params for o in (*p.opts, *p.secondary_opts)}
    for a in args_of(render(_helm_for_module(), "mode=dra"), "DaemonSet", "agent")[1:]:
        assert a.split("=", 1)[0] in options, a


def test_dra_rbac_is_what_the_driver_calls_and_the_policy_keeps_it_to_its_node(helm: Path) -> None:
    objs = render(helm, "mode=dra")
    agent = _rules(objs, "ClusterRole", "gs-gpuslice-agent")
    assert agent == ({("", "nodes", "get", ""), ("", "pods", "get", ""), ("", "pods", "list", "")}
                     | {("resource.k8s.io", "resourceclaims", "get", "")}
                     | {("resource.k8s.io", "resourceslices", v, "") for v in ("get", "list", "create", "update", "delete")})
    assert set(by_kind(objs, "ClusterRole")) == {"gs-gpuslice-agent"}
    vap = by_kind(objs, "ValidatingAdmissionPolicy")
    assert set(vap) == {"gs-gpuslice-agent-resourceslices"}
    spec = vap["gs-gpuslice-agent-resourceslices"]["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert spec["failurePolicy"] == "Fail"
    assert "authentication.kubernetes.io/node-name" in json.dumps(spec["variables"])
    assert any("s.spec.driver == 'gpuslice.io'" in v["expression"] for v in spec["validations"])
    assert by_kind(objs, "ValidatingAdmissionPolicyBinding")["gs-gpuslice-agent-resourceslices"]["spec"]["validationActions"] == ["Deny"]
    assert not by_kind(render(helm, "mode=dra", "rbac.writePolicies=false"), "ValidatingAdmissionPolicy")


def test_dra_mode_is_refused_before_kubernetes_1_36(helm: Path) -> None:
    proc = run_helm(helm, "template", "gs", str(CHART), "--set", "mode=dra", "--kube-version", "1.35.0")
    assert proc.returncode != 0 and "needs Kubernetes >= 1.36" in proc.stderr, proc.stderr
    assert run_helm(helm, "template", "gs", str(CHART), "--kube-version", "1.35.0").returncode == 0


def test_schema_refuses_unknown_modes_and_bad_dra_values(helm: Path) -> None:
    for setting, field in (("mode=hami", "mode"), ("dra.minMemory=lots", "minMemory"),
                           ("dra.hostPaths.cdi=relative", "cdi"), ("dra.deviceClassName=Not_A_Name", "deviceClassName")):
        proc = run_helm(helm, "template", "gs", str(CHART), "--set", setting)
        assert proc.returncode != 0 and field in proc.stderr, (setting, proc.stderr)
