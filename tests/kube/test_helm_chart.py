"""The Helm chart (deploy/helm/gpuslice): it lints, renders, wires the parts together, grants
least-privilege RBAC, and its values schema refuses bad values before anything is rendered.

helm comes from hack/bin (built from the Go module proxy by ``make -C hack helm``; it is not a
Debian package). These tests build it when it is missing and fail, never skip, when that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuslice"
HELM = ROOT / "hack" / "bin" / "helm"
HAMI_NAMES = {
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
}


def _helm_for_module() -> Path:
    if not HELM.exists():
        # Cached by make: builds once per machine (about a minute), then is a no-op.
        proc = subprocess.run(["make", "-C", str(ROOT / "hack"), "helm"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"could not build helm with `make -C hack helm`:\n{proc.stdout}\n{proc.stderr}")
    return HELM


@pytest.fixture(scope="module")
def helm() -> Path:
    return _helm_for_module()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HELM_CACHE_HOME="/tmp/gpuslice-helm/cache", HELM_CONFIG_HOME="/tmp/gpuslice-helm/config",
               HELM_DATA_HOME="/tmp/gpuslice-helm/data")
    return subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=120)


def render(helm: Path, *sets: str, namespace: str = "gpuslice-system") -> list[dict[str, Any]]:
    args = ["template", "gs", str(CHART), "--namespace", namespace]
    for s in sets:
        # --set turns "1.5" into a string; --set-json keeps numbers numbers.
        args += ["--set-json", s[5:]] if s.startswith("json:") else ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = list(by_kind(objs, kind).values())
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def scheduler_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(by_kind(objs, "ConfigMap")["gs-gpuslice-scheduler-config"]["data"]["config.yaml"])


def args_of(objs: list[dict[str, Any]], kind: str, container: str) -> list[str]:
    spec = one(objs, kind)["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == container]
    return c["args"]


def flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {args}"
    return values[0]


# ------------------------------------------------------------------------------------------ lint
def test_chart_lints_strict(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_chart_lints_with_cert_manager_and_service_monitor(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--set", "certificates.certManager.enabled=true",
                    "--set", "metrics.serviceMonitor.enabled=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------------- the objects
def test_default_render_has_every_part(helm: Path) -> None:
    objs = render(helm)
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "Deployment", "MutatingWebhookConfiguration", "ConfigMap", "Service", "ServiceAccount",
            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job"} <= kinds
    assert "ServiceMonitor" not in kinds and "Certificate" not in kinds
    for o in objs:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            assert o["metadata"]["namespace"] in ("gpuslice-system", "kube-system"), o["metadata"]


def test_daemonset_runs_the_agent_with_kubelet_dir_state_and_enforcer(helm: Path) -> None:
    objs = render(helm, "agent.hostPaths.state=/data/gs", "metrics.port=9555", "sharing.splitCount=4")
    ds = one(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"device-plugins": "/var/lib/kubelet/device-plugins", "state": "/data/gs",
                    "enforcer": "/usr/local/gpuslice"}
    (agent,) = spec["containers"]
    args = agent["args"]
    assert args[0] == "kube-agent"
    assert flag(args, "--split-count") == "4"
    assert flag(args, "--resource-name") == "nvidia.com/gpu"
    assert flag(args, "--metrics-port") == "9555"
    # The kubelet mounts slice files by their host path; the agent writes them through its mount.
    assert flag(args, "--host-state-dir") == "/data/gs"
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["state"]["mountPath"] == flag(args, "--state-dir")
    assert mounts["device-plugins"]["mountPath"] == flag(args, "--plugin-dir")
    # Containers get the library by its host path; the agent itself cannot modify it.
    assert flag(args, "--library") == "/usr/local/gpuslice/lib/libgpuslice.so"
    assert mounts["enforcer"].get("readOnly") is True
    (init,) = spec["initContainers"]
    assert init["volumeMounts"][0]["name"] == "enforcer"
    assert "/host-enforcer/lib/libgpuslice.so" in " ".join(init["command"])
    assert agent["ports"][0]["containerPort"] == 9555
    assert any(e["name"] == "NODE_NAME" and e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
               for e in agent["env"])
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["serviceAccountName"] == "gs-gpuslice-agent"


def test_agent_flags_exist_in_the_cli() -> None:
    """Every flag the chart passes is one `gpuslice kube-agent` / `gpuslice scheduler` accepts,
    so a rendered pod does not crash-loop on an unknown option."""
    import typer

    from gpuslice.cli import app

    commands = typer.main.get_command(app).commands  # the click commands behind `gpuslice <verb>`
    objs = render(_helm_for_module(), "certificates.certManager.enabled=false")
    for kind, container in (("DaemonSet", "agent"), ("Deployment", "extender"), ("Deployment", "webhook")):
        args = args_of(objs, kind, container)
        options = {o for p in commands[args[0]].params for o in (*p.opts, *p.secondary_opts)}
        for a in args[1:]:
            name = a.split("=", 1)[0]
            assert name in options, f"{kind}/{container} passes {name}, which `gpuslice {args[0]}` does not take"


def test_scheduler_pod_runs_kube_scheduler_extender_and_webhook(helm: Path) -> None:
    objs = render(helm, "scheduler.extender.port=12345", "scheduler.webhook.port=9999", "scheduler.name=gs-sched")
    # defaults: the allocation lock on (HAMi's 5 minutes), node ageing off, the enforcer refusing on failure
    ext_defaults, agent_defaults = args_of(objs, "Deployment", "extender"), args_of(objs, "DaemonSet", "agent")
    assert (flag(ext_defaults, "--allocation-timeout"), flag(ext_defaults, "--stale-after")) == ("300", "0")
    assert "--no-fail-open" in agent_defaults and flag(agent_defaults, "--oom-policy") == "return"
    dep = one(objs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"kube-scheduler", "extender", "webhook"}
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    assert "--config=/config/config.yaml" in containers["kube-scheduler"]["command"]
    ext_args, hook_args = args_of(objs, "Deployment", "extender"), args_of(objs, "Deployment", "webhook")
    assert ext_args[0] == hook_args[0] == "scheduler"
    assert (flag(ext_args, "--host"), flag(ext_args, "--port"), flag(ext_args, "--webhook-port")) == \
        ("127.0.0.1", "12345", "0")
    assert (flag(hook_args, "--port"), flag(hook_args, "--webhook-port")) == ("0", "9999")
    assert (flag(hook_args, "--tls-cert"), flag(hook_args, "--tls-key")) == ("/tls/tls.crt", "/tls/tls.key")
    assert containers["webhook"]["ports"][0]["containerPort"] == 9999
    # The webhook sends pods to the profile that calls the extender.
    assert flag(hook_args, "--scheduler-name") == "gs-sched"

    cfg = scheduler_config(objs)
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gs-sched"]
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:12345"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["ignorable"] is False
    # Names only, from the extender's own node watch: full Node objects cost seconds per pod at 5,000 nodes.
    assert ext["nodeCacheCapable"] is True
    assert "--no-node-cache" not in ext_args
    managed = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
    # Every name the extender reads, so a pod naming any of them reaches it.
    from gpuslice.kube.resources import ResourceNames

    assert set(managed) == set(ResourceNames().all()) and HAMI_NAMES <= set(managed)
    # Only the advertised count exists on nodes; kube-scheduler can judge nothing else.
    assert [k for k, v in managed.items() if not v] == ["nvidia.com/gpu"]


def test_every_knob_reaches_the_components(helm: Path) -> None:
    objs = render(helm, "sharing.splitCount=4", "json:sharing.memoryScaling=1.5", "defaults.memory=4096",
                  "defaults.cores=30", "defaults.gpuNum=2", "policies.node=spread", "policies.gpu=fgd",
                  "sharing.computeMode=soft", "sharing.engine=spatial", "sharing.colocation=shared",
                  "resourceName=gpuslice.io/gpu",
                  "agent.deviceNodes=none",
                  "agent.rediscoverInterval=120", "agent.healthRecovery=0", "agent.enforcer.oomPolicy=kill",
                  "agent.enforcer.failOpen=true", "agent.enforcer.logLevel=debug",
                  "scheduler.extender.allocationTimeout=120", "scheduler.extender.staleAfter=600")
    agent = args_of(objs, "DaemonSet", "agent")
    assert (flag(agent, "--oom-policy"), flag(agent, "--enforcer-log-level")) == ("kill", "debug")
    env = {e["name"]: e.get("value") for e in one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility,compute"  # the MPS binaries of spatial slices
    assert "--fail-open" in agent and "--no-fail-open" not in agent
    extender = args_of(objs, "Deployment", "extender")
    assert (flag(extender, "--allocation-timeout"), flag(extender, "--stale-after")) == ("120", "600")
    assert (flag(agent, "--split-count"), flag(agent, "--memory-scaling")) == ("4", "1.5")
    assert flag(agent, "--resource-name") == "gpuslice.io/gpu"
    assert flag(agent, "--device-nodes") == "none"
    assert (flag(agent, "--rediscover-interval"), flag(agent, "--health-recovery")) == ("120", "0")
    for container in ("extender", "webhook"):
        args = args_of(objs, "Deployment", container)
        assert flag(args, "--policy") == "node=spread,gpu=fgd"
        assert (flag(args, "--default-mem"), flag(args, "--default-cores"), flag(args, "--default-gpu-num")) == \
            ("4096", "30", "2")
        assert flag(args, "--mode") == "soft" and flag(args, "--default-engine") == "spatial"
        assert flag(args, "--default-colocation") == "shared"
        assert flag(args, "--resource-name") == "gpuslice.io/gpu"
    # The advertised name is the one kube-scheduler checks against node capacity.
    managed = {m["name"]: m["ignoredByScheduler"] for m in scheduler_config(objs)["extenders"][0]["managedResources"]}
    assert [k for k, v in managed.items() if not v] == ["gpuslice.io/gpu"]
    # kube-scheduler restarts when its extender wiring changes.
    before = render(helm)
    a = one(objs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = one(before, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert a != b


def test_high_priority_namespaces_reach_the_webhook_the_extender_and_the_dra_agent(helm: Path) -> None:
    """Issue 15: the namespaces that may ask for high priority are one value, read by every part that decides
    a priority; [] means none (one empty flag, which the command reads as no namespace); the default is every
    namespace (HAMi's behaviour)."""
    from gpuslice.kube.commands import _config

    def values(args: list[str]) -> list[str]:
        return [a.split("=", 1)[1] for a in args if a.startswith("--high-priority-namespace=")]

    listed = render(helm, 'json:sharing.highPriorityNamespaces=["online","ops"]')
    for container in ("extender", "webhook"):
        assert values(args_of(listed, "Deployment", container)) == ["online", "ops"]
    dra = render(helm, "mode=dra", 'json:sharing.highPriorityNamespaces=["online"]')
    assert values(args_of(dra, "DaemonSet", "agent")) == ["online"]
    assert values(args_of(render(helm), "Deployment", "webhook")) == ["*"]
    none = values(args_of(render(helm, "json:sharing.highPriorityNamespaces=[]"), "Deployment", "webhook"))
    assert none == [""]
    cfg = _config("binpack", 0, 0, 1, "gpuslice-scheduler", "hard", high_priority=tuple(n for n in none if n))
    assert not cfg.high_priority.allows("default") and cfg.high_priority.describe() == "no namespace"


RENAMED = {"resourceName": "example.com/vgpu", "resourceMem": "example.com/vgpu-memory",
           "resourceMemPercentage": "example.com/vgpu-memory-percentage", "resourceCores": "example.com/vgpu-cores",
           "resourcePriority": "example.com/vgpu-priority"}
FLAGS = {"resourceName": "--resource-name", "resourceMem": "--resource-mem",
         "resourceMemPercentage": "--resource-mem-percentage", "resourceCores": "--resource-cores",
         "resourcePriority": "--resource-priority"}


def test_resource_names_reach_agent_extender_webhook_scheduler_and_guard(helm: Path) -> None:
    """All five names are configurable (HAMi's chart keys); each reaches every component that reads it,
    and the codec built from the extender's flags reads exactly what kube-scheduler routes to it."""
    from gpuslice.kube.resources import ResourceNames

    objs = render(helm, *(f"{k}={v}" for k, v in RENAMED.items()))
    assert flag(args_of(objs, "DaemonSet", "agent"), "--resource-name") == "example.com/vgpu"
    for container in ("extender", "webhook"):
        args = args_of(objs, "Deployment", container)
        for key, name in RENAMED.items():
            assert flag(args, FLAGS[key]) == name, (container, key)
    names = ResourceNames.configured(count=RENAMED["resourceName"], memory=RENAMED["resourceMem"],
                                     memory_percentage=RENAMED["resourceMemPercentage"],
                                     cores=RENAMED["resourceCores"], priority=RENAMED["resourcePriority"])
    managed = {m["name"]: m["ignoredByScheduler"] for m in scheduler_config(objs)["extenders"][0]["managedResources"]}
    assert set(managed) == set(names.all())
    assert [k for k, v in managed.items() if not v] == ["example.com/vgpu"]
    assert not HAMI_NAMES & set(managed)
    guard = by_kind(objs, "ValidatingAdmissionPolicy")["gs-gpuslice-guard"]
    assert "'example.com/vgpu' in c.resources.limits" in guard["spec"]["variables"][0]["expression"]


def test_two_kinds_cannot_share_a_resource_name(helm: Path) -> None:
    proc = run_helm(helm, "template", "gs", str(CHART), "--set", "resourceCores=nvidia.com/gpumem")
    assert proc.returncode != 0 and "must differ" in proc.stderr, proc.stderr


def test_guard_refuses_gpu_pods_that_bypass_the_gpuslice_scheduler(helm: Path) -> None:
    """The ValidatingAdmissionPolicy that backs failurePolicy Ignore: its CEL names the advertised
    resource and the scheduler, applies to pod CREATE, denies; scheduler.guard.enabled=false drops it.
    (The API server compiles and enforces it in tests/e2e/test_kube_helm_apply.py.)"""
    objs = render(helm, "scheduler.name=gs-sched")
    vap = by_kind(objs, "ValidatingAdmissionPolicy")["gs-gpuslice-guard"]
    binding = by_kind(objs, "ValidatingAdmissionPolicyBinding")["gs-gpuslice-guard"]
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    (rule,) = vap["spec"]["validations"]
    assert "object.spec.schedulerName == 'gs-sched'" in rule["expression"]
    assert "!has(object.spec.nodeName)" in rule["expression"]
    assert "'nvidia.com/gpu' in c.resources.limits" in vap["spec"]["variables"][0]["expression"]
    off = render(helm, "scheduler.guard.enabled=false")
    assert "gs-gpuslice-guard" not in {o["metadata"]["name"] for o in off if o["kind"].startswith("ValidatingAdmission")}


def test_migration_knobs_reach_the_webhook_the_guard_and_the_extender(helm: Path) -> None:
    """HAMi side by side: pods naming hami-scheduler pass the guard (scheduler.guard.allowSchedulers), the
    webhook sees only labelled namespaces (namespaceSelector), and once HAMi is gone its scheduler name is
    adopted (adoptSchedulers → --adopt-scheduler in both containers). Quotas on by default (--quotas)."""
    objs = render(helm, "json:scheduler.guard.allowSchedulers=[\"hami-scheduler\"]",
                  "json:scheduler.webhook.namespaceSelector={\"matchLabels\": {\"gpuslice.io/scheduler\": \"on\"}}")
    (rule,) = by_kind(objs, "ValidatingAdmissionPolicy")["gs-gpuslice-guard"]["spec"]["validations"]
    assert rule["expression"].endswith("|| object.spec.schedulerName == 'hami-scheduler'")
    (hook,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"]["matchLabels"] == {"gpuslice.io/scheduler": "on"}
    assert hook["namespaceSelector"]["matchExpressions"][0]["operator"] == "NotIn"  # still skips its own namespace
    for container in ("extender", "webhook"):
        args = args_of(objs, "Deployment", container)
        assert [a for a in args if a.startswith("--adopt-scheduler")] == ["--adopt-scheduler=default-scheduler"]
        assert "--quotas" in args
    adopted = render(helm, "json:scheduler.adoptSchedulers=[\"default-scheduler\", \"hami-scheduler\"]", "quotas.enabled=false")
    args = args_of(adopted, "Deployment", "webhook")
    assert [a for a in args if a.startswith("--adopt-")] == ["--adopt-scheduler=default-scheduler",
                                                             "--adopt-scheduler=hami-scheduler"]
    assert "--no-quotas" in args
    guard = by_kind(adopted, "ValidatingAdmissionPolicy")["gs-gpuslice-guard"]["spec"]["validations"][0]
    assert "hami-scheduler" not in guard["expression"]


def test_webhook_failure_policy_defaults_to_ignore_and_the_docs_agree(helm: Path) -> None:
    """One decision, written once in the chart and once in the adapters' README: Ignore + the guard."""
    (hook,) = one(render(helm), "MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    readme = (ROOT / "src" / "gpuslice" / "kube" / "README.md").read_text()
    assert "`failurePolicy: Ignore`" in readme and "with `failurePolicy: Fail`" not in readme


def test_webhook_points_at_its_service_and_skips_own_namespace(helm: Path) -> None:
    objs = render(helm, "scheduler.webhook.failurePolicy=Fail")
    mwc = one(objs, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Fail"
    assert hook["rules"][0]["resources"] == ["pods"] and hook["rules"][0]["operations"] == ["CREATE"]
    # kubectl debug's ephemeral containers are reviewed too (tests/security/test_webhook_escapes.py)
    assert hook["rules"][1] == {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"}
    svc = hook["clientConfig"]["service"]
    assert svc["path"] == "/mutate" and svc["namespace"] == "gpuslice-system"
    service = by_kind(objs, "Service")[svc["name"]]
    assert service["spec"]["ports"][0]["port"] == svc["port"]
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and {"gpuslice-system", "kube-system"} <= set(expr["values"])
    dep_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= dep_labels.items()


def test_self_signed_certificates_by_hook_jobs(helm: Path) -> None:
    objs = render(helm)
    jobs = by_kind(objs, "Job")
    assert set(jobs) == {"gs-gpuslice-certgen-create", "gs-gpuslice-certgen-patch"}
    create, patch = jobs["gs-gpuslice-certgen-create"], jobs["gs-gpuslice-certgen-patch"]
    assert create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert patch["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    args = create["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--secret-name=gs-gpuslice-webhook-tls" in args
    assert any(a.startswith("--host=") and "gs-gpuslice-webhook.gpuslice-system.svc" in a for a in args)
    assert "--webhook-name=gs-gpuslice-webhook" in patch["spec"]["template"]["spec"]["containers"][0]["args"]
    tls = [v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
    assert tls["secret"]["secretName"] == "gs-gpuslice-webhook-tls"
    assert {i["path"] for i in tls["secret"]["items"]} == {"tls.crt", "tls.key"}


def test_cert_manager_option_replaces_the_jobs(helm: Path) -> None:
    objs = render(helm, "certificates.certManager.enabled=true")
    assert "Job" not in {o["kind"] for o in objs}
    cert = one(objs, "Certificate")
    assert cert["spec"]["secretName"] == "gs-gpuslice-webhook-tls"
    assert "gs-gpuslice-webhook.gpuslice-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"]["name"] == one(objs, "Issuer")["metadata"]["name"]
    mwc = one(objs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpuslice-system/gs-gpuslice-webhook"
    tls = [v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
    assert "items" not in tls["secret"]  # cert-manager writes tls.crt / tls.key itself
    external = render(helm, "certificates.certManager.enabled=true", "certificates.certManager.issuerRef.name=corp-ca",
                      "certificates.certManager.issuerRef.kind=ClusterIssuer")
    assert "Issuer" not in {o["kind"] for o in external}
    assert one(external, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_service_monitor_option(helm: Path) -> None:
    objs = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
    monitors = by_kind(objs, "ServiceMonitor")
    assert set(monitors) == {"gs-gpuslice", "gs-gpuslice-scheduler"}  # the agents', the extender's (quotas)
    for sm_name, svc_name in (("gs-gpuslice", "gs-gpuslice-metrics"), ("gs-gpuslice-scheduler", "gs-gpuslice-scheduler-metrics")):
        sm = monitors[sm_name]
        assert sm["metadata"]["labels"]["release"] == "prom"
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"
        metrics_svc = by_kind(objs, "Service")[svc_name]
        assert sm["spec"]["selector"]["matchLabels"] == metrics_svc["spec"]["selector"]
        assert metrics_svc["spec"]["clusterIP"] == "None"
    extender = next(c for c in one(objs, "Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    assert "--metrics-port=9401" in extender["args"] and extender["ports"] == [
        {"name": "metrics", "containerPort": 9401, "protocol": "TCP"}]
    assert "gs-gpuslice-scheduler" not in by_kind(render(helm, "metrics.serviceMonitor.enabled=true",
                                                         "metrics.schedulerPort=0"), "ServiceMonitor")


# ------------------------------------------------------------------------------------------- RBAC
def _rules(objs: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str, str]]:
    """Flatten a role into (apiGroup, resource, verb, resourceName or '') tuples."""
    out = set()
    for r in by_kind(objs, kind)[name]["rules"]:
        for g in r.get("apiGroups", [""]):
            for res in r["resources"]:
                for v in r["verbs"]:
                    for n in r.get("resourceNames") or [""]:
                        out.add((g, res, v, n))
    return out


def test_rbac_is_least_privilege(helm: Path) -> None:
    objs = render(helm)
    for kind in ("ClusterRole", "Role"):
        for name, role in by_kind(objs, kind).items():
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], (name, rule)
                assert "*" not in rule.get("apiGroups", []), (name, rule)
                assert "secrets" not in rule["resources"] or name.endswith("-certgen"), (name, rule)

    # What gpuslice.kube.{agent,plugin,labels,resize} call: get/patch its Node, list/watch/patch pods (the
    # watch: live resizes of its pods).
    agent = _rules(objs, "ClusterRole", "gs-gpuslice-agent")
    assert agent == {("", "nodes", v, "") for v in ("get", "patch")} | {("", "pods", v, "") for v in ("list", "watch",
                                                                                                     "patch")}

    # What gpuslice.kube.extender calls: watch nodes, patch the ledger, read/patch/bind pods, watch pods' usage;
    # with namespace quotas (the default) list ResourceQuotas (the webhook, on the same account, lists a
    # namespace's pods).
    extender = _rules(objs, "ClusterRole", "gs-gpuslice-extender")
    base = ({("", "nodes", v, "") for v in ("get", "list", "watch", "patch")}
            | {("", "pods", v, "") for v in ("get", "list", "watch", "patch")}
            | {("", "pods/binding", "create", "")})
    assert extender == base | {("", "resourcequotas", "list", "")}
    assert _rules(render(helm, "quotas.enabled=false"), "ClusterRole", "gs-gpuslice-extender") == base

    lease = _rules(objs, "Role", "gs-gpuslice-scheduler-lease")
    assert lease == {("coordination.k8s.io", "leases", "create", ""),
                     ("coordination.k8s.io", "leases", "get", "gs-gpuslice-scheduler"),
                     ("coordination.k8s.io", "leases", "update", "gs-gpuslice-scheduler")}
    assert scheduler_config(objs)["leaderElection"]["resourceName"] == "gs-gpuslice-scheduler"

    # The certgen hook may read only its own secret and update only our webhook.
    certgen_ns = _rules(objs, "Role", "gs-gpuslice-certgen")
    assert certgen_ns == {("", "secrets", "get", "gs-gpuslice-webhook-tls"), ("", "secrets", "create", "")}
    certgen_cluster = _rules(objs, "ClusterRole", "gs-gpuslice-certgen")
    assert certgen_cluster == {("admissionregistration.k8s.io", "mutatingwebhookconfigurations", v, "gs-gpuslice-webhook")
                               for v in ("get", "update")}

    # Every binding points at a role that exists (rendered or upstream bootstrap) and a rendered SA.
    sas = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "ServiceAccount"}
    roles = set(by_kind(objs, "ClusterRole")) | {"system:kube-scheduler", "system:volume-scheduler"}
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for name, b in by_kind(objs, kind).items():
            ref = b["roleRef"]
            if ref["kind"] == "ClusterRole":
                assert ref["name"] in roles, (name, ref)
            else:
                assert ref["name"] in set(by_kind(objs, "Role")) | {"extension-apiserver-authentication-reader"}
            for s in b["subjects"]:
                assert (s["namespace"], s["name"]) in sas, (name, s)

    # Each workload runs as its own account, and the webhook-bearing scheduler pod cannot touch secrets.
    ds_sa = one(objs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    dep_sa = one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert ds_sa != dep_sa


def test_write_policies_narrow_the_roles_to_gpuslice_annotations(helm: Path) -> None:
    """RBAC lets the agent patch any Node and Pod and the extender any Node and Pod (the roles cannot name an
    annotation or "my node"); the chart's ValidatingAdmissionPolicies narrow that. Their behaviour is
    tested live in tests/e2e/test_kube_helm_apply.py; here: the wiring."""
    objs = render(helm)
    vaps = by_kind(objs, "ValidatingAdmissionPolicy")
    bindings = by_kind(objs, "ValidatingAdmissionPolicyBinding")
    want = {"gs-gpuslice-agent-nodes": ("gs-gpuslice-agent", "nodes", ["gpuslice.io/devices", "gpuslice.io/allocating"]),
            "gs-gpuslice-agent-pods": ("gs-gpuslice-agent", "pods", ["gpuslice.io/allocated", "gpuslice.io/resize-status"]),
            "gs-gpuslice-extender-nodes": ("gs-gpuslice-scheduler", "nodes", ["gpuslice.io/ledger", "gpuslice.io/allocating"]),
            "gs-gpuslice-extender-pods": ("gs-gpuslice-scheduler", "pods", ["gpuslice.io/grant", "gpuslice.io/allocated",
                                                                            "gpuslice.io/resize-status"])}
    assert set(want) <= set(vaps)
    for name, (sa, resource, allowed) in want.items():
        spec = vaps[name]["spec"]
        assert spec["failurePolicy"] == "Fail"
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert rule["resources"] == [resource] and rule["operations"] == ["UPDATE"]
        (cond,) = spec["matchConditions"]
        assert cond["expression"] == f"request.userInfo.username == 'system:serviceaccount:gpuslice-system:{sa}'"
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert json.loads(variables["allowed"]) == allowed
        exprs = [v["expression"] for v in spec["validations"]]
        assert any("object.spec == oldObject.spec" in e for e in exprs)
        if sa.endswith("agent"):  # the node comes from the pod-bound token, which nobody can forge
            assert "authentication.kubernetes.io/node-name" in variables["node"]
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    # The annotation keys are the codec's.
    from gpuslice.kube import formats

    keys = {k for _, _, allowed in want.values() for k in allowed}
    assert keys == {formats.NODE_DEVICES, formats.NODE_ALLOCATING, formats.POD_ALLOCATED, formats.NODE_LEDGER, formats.POD_GRANT,
                    formats.POD_RESIZE_STATUS}
    off = {o["metadata"]["name"] for o in render(helm, "rbac.writePolicies=false") if o["kind"] == "ValidatingAdmissionPolicy"}
    assert off == {"gs-gpuslice-guard"}


def test_rbac_create_false_renders_no_roles(helm: Path) -> None:
    objs = render(helm, "rbac.create=false")
    assert not {"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"} & {
        o["kind"] for o in objs if "helm.sh/hook" not in o["metadata"].get("annotations", {})}


# ------------------------------------------------------------------------------------------ schema
@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("sharing.splitCount=-1", "splitCount"),
        ("sharing.splitCount=0", "splitCount"),
        ("sharing.splitCount=ten", "splitCount"),
        ("sharing.splitCount=65", "splitCount"),  # a pacer lists at most 64 grants of a device
        ("sharing.memoryScaling=0", "memoryScaling"),
        ("defaults.cores=101", "cores"),
        ("defaults.memory=lots", "memory"),
        ("defaults.memory=-1", "memory"),
        ("defaults.gpuNum=65", "gpuNum"),
        ("sharing.computeMode=fast", "computeMode"),
        ("sharing.engine=mig", "engine"),
        ("sharing.colocation=polite", "colocation"),
        ("sharing.highPriorityNamespaces=online", "highPriorityNamespaces"),
        ('json:sharing.highPriorityNamespaces=["Online"]', "highPriorityNamespaces"),
        ("policies.node=worst", "node"),
        ("policies.gpu=topologyy", "gpu"),
        ("metrics.port=70000", "port"),
        ("scheduler.webhook.failurePolicy=Sometimes", "failurePolicy"),
        ("resourceName=gpu", "resourceName"),
        ("resourceName=kubernetes.io/gpu", "resourceName"),
        ("resourceMem=Nvidia.com/gpumem", "resourceMem"),
        ("resourceCores=", "resourceCores"),
        ("scheduler.guard.enabled=maybe", "enabled"),
        ("rbac.writePolicies=sometimes", "writePolicies"),
        ("agent.hostPaths.state=relative/dir", "state"),
        ("sharing.splitcount=4", "splitcount"),  # a typo must not be silently ignored
        ("shareing.splitCount=4", "shareing"),    # ... at the top level either
        ("scheduler.extender.allocationTimeout=-1", "allocationTimeout"),
        ("scheduler.extender.staleAfter=-5", "staleAfter"),
        ("agent.enforcer.oomPolicy=explode", "oomPolicy"),
        ("agent.enforcer.failOpen=maybe", "failOpen"),
        ("agent.enforcer.logLevel=loud", "logLevel"),
        ("scheduler.extender.httpTimeout=30", "httpTimeout"),
    ],
)
def test_schema_rejects_bad_values(helm: Path, setting: str, field: str) -> None:
    how = ["--set-json", setting[5:]] if setting.startswith("json:") else ["--set", setting]
    proc = run_helm(helm, "template", "gs", str(CHART), *how)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert field in proc.stderr, proc.stderr


def test_schema_accepts_documented_forms(helm: Path) -> None:
    for setting in ("defaults.memory=3000", "sharing.memoryScaling=2", "policies.node=fgd",
                    "resourceName=gpuslice.io/gpu", "resourceName=example.com/gpu", "resourcePriority=example.com/p",
                    "defaults.gpuNum=0", "sharing.computeMode=off", "agent.healthRecovery=0",
                    "scheduler.extender.allocationTimeout=0", "agent.enforcer.logLevel=debug"):
        proc = run_helm(helm, "template", "gs", str(CHART), "--set", setting)
        assert proc.returncode == 0, (setting, proc.stderr)


def test_schema_is_valid_json_and_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v: Any, s: dict[str, Any], path: str) -> None:
        if isinstance(v, dict) and s.get("type") == "object" and "properties" in s:
            for k, sub in v.items():
                assert k in s["properties"], f"values.yaml key {path}{k} has no schema"
                walk(sub, s["properties"][k], f"{path}{k}.")

    walk(values, schema, "")
