"""Fixtures that start a real Kubernetes control plane for the end-to-end tests.

The control plane is hack/bin/controlplane (etcd + kube-apiserver + kube-scheduler built from
the published Go modules of one Kubernetes release by ``make -C hack``). It is started once per
test session, on loopback, with a KubeSchedulerConfiguration that sends GPU pods to our extender.

When the binary is missing the e2e tests *fail* under CI (env CI=true): a CI run that cannot test
against the real API server must not look green. Outside CI they skip with the command to run.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "hack" / "bin" / "controlplane"
# kubectl of the harness's own release (a link to the harness binary, made by `make -C hack`): the
# tests need no kubectl installed and never drive the API server with a skewed client.
KUBECTL = ROOT / "hack" / "bin" / "kubectl"
READY_PREFIX = "GPUSLICE_CONTROLPLANE_READY "
SCHEDULER_NAME = "gpuslice-scheduler"
START_TIMEOUT_S = 150


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kube_e2e: end to end against the real kube-apiserver and kube-scheduler built in hack/"
    )


def require_harness() -> Path:
    if HARNESS.exists():
        return HARNESS
    message = f"{HARNESS} is missing; build it with `make -C hack` (Go >= 1.26)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " — CI must test against the real control plane", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ControlPlane:
    """A running control plane: where it is and how to talk to it."""

    info: dict[str, Any]
    process: subprocess.Popen[str]
    extender_port: int

    @property
    def kubeconfig(self) -> str:
        return self.info["kubeconfig"]

    @property
    def server(self) -> str:
        return self.info["server"]

    @property
    def token(self) -> str:
        return self.info["token"]

    @property
    def ca_file(self) -> str:
        return self.info["ca_file"]

    def logs(self, which: str = "scheduler", tail: int = 4000) -> str:
        path = Path(self.info[f"{which}_log"])
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def api(self) -> Any:
        """A kubernetes-client ApiClient with a pool wide enough for hundreds of parallel calls."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 128
        return client.ApiClient(cfg)


def scheduler_config_yaml(extender_port: int, chart_config: str) -> str:
    """The chart's KubeSchedulerConfiguration (deploy/helm/gpuslice/templates/configmap.yaml, as rendered), pointed
    at the extender on ``extender_port``, leader election off (one scheduler, restarted by tests), and a
    ``default-scheduler`` profile beside the gpuslice one (for pods the tests send to it: DRA, CPU-only)."""
    import yaml

    cfg = yaml.safe_load(chart_config)
    cfg["leaderElection"] = {"leaderElect": False}
    (ext,) = cfg["extenders"]
    ext["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    names = [p["schedulerName"] for p in cfg["profiles"]]
    assert names == [SCHEDULER_NAME], names
    cfg["profiles"].append({"schedulerName": "default-scheduler"})
    return yaml.safe_dump(cfg)


def _read_ready(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    lines: "queue.Queue[str | None]" = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith(READY_PREFIX):
            return json.loads(line[len(READY_PREFIX):])
    proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    raise RuntimeError(f"control plane did not report ready within {timeout}s (rc={proc.poll()}):\n{err[-4000:]}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, chart_docs: list[dict[str, Any]]) -> Iterator[ControlPlane]:
    harness = require_harness()
    workdir = tmp_path_factory.mktemp("controlplane")
    extender_port = free_port()
    sched_cfg = workdir / "scheduler-config.yaml"
    (configmap,) = [d for d in chart_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler-config")]
    sched_cfg.write_text(scheduler_config_yaml(extender_port, configmap["data"]["config.yaml"]))
    proc = subprocess.Popen(
        # resourceclaim-controller: pods naming a ResourceClaimTemplate get their claims (the DRA tests).
        [str(harness), "--dir", str(workdir / "state"), "--scheduler-config", str(sched_cfg),
         "--controllers=resourceclaim-controller"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        info = _read_ready(proc, START_TIMEOUT_S)
    except Exception as exc:
        pytest.fail(f"could not start the control plane: {exc}", pytrace=False)
    cp = ControlPlane(info=info, process=proc, extender_port=extender_port)
    try:
        yield cp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------ TLS for webhooks
@dataclass
class ServingCert:
    """A throwaway CA and a serving cert for 127.0.0.1, as the API server must verify the webhook."""

    ca_pem: bytes
    cert_file: str
    key_file: str


@pytest.fixture(scope="session")
def serving_cert(tmp_path_factory: pytest.TempPathFactory) -> ServingCert:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = tmp_path_factory.mktemp("webhook-tls")
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuslice-e2e-webhook-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuslice-webhook")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return ServingCert(ca_pem=ca.public_bytes(serialization.Encoding.PEM), cert_file=str(d / "tls.crt"),
                       key_file=str(d / "tls.key"))


# ------------------------------------------------------------- the kubelet's side of the device plugin
@pytest.fixture(scope="session")
def kubelet_api(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with Python stubs (package ``kubeletdp``) generated from the kubelet's own api.proto
    (hack/kubelet-api, copied verbatim from k8s.io/kubelet), so the tests speak the kubelet's wire
    format, not gpuslice's copy of it. Not imported here: the proto package (v1beta1) is the same as
    gpuslice's, and one process's default protobuf pool cannot hold both; tests load it in a subprocess."""
    from grpc_tools import protoc

    src = ROOT / "hack" / "kubelet-api"
    out = tmp_path_factory.mktemp("kubelet-api")
    pkg = out / "kubeletdp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    proto = pkg / "api.proto"
    proto.write_text((src / "deviceplugin-v1beta1.proto").read_text())
    rc = protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", str(proto)])
    assert rc == 0, "protoc failed on the kubelet's api.proto"
    return out


# ------------------------------------------------------------------- the chart's RBAC, enforced
CHART = ROOT / "deploy" / "helm" / "gpuslice"
HELM = ROOT / "hack" / "bin" / "helm"
CHART_NAMESPACE = "gpuslice-system"


@pytest.fixture(scope="session")
def chart_docs() -> list[dict[str, Any]]:
    """The chart rendered with its default values (namespace gpuslice-system)."""
    return render_chart()


def render_chart(*set_json: str) -> list[dict[str, Any]]:
    """The chart's documents, rendered by helm with ``--set-json`` for each of ``set_json`` (``key=json``)."""
    import yaml

    if not HELM.exists():
        proc = subprocess.run(["make", "-C", str(ROOT / "hack"), "helm"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"`make -C hack helm` failed:\n{proc.stdout}\n{proc.stderr}")
    sets = [a for v in set_json for a in ("--set-json", v)]
    rendered = subprocess.run([str(HELM), "template", "gs", str(CHART), "--namespace", CHART_NAMESPACE, *sets],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


@pytest.fixture(scope="session")
def chart_args(chart_docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The gpuslice command lines of the chart's containers (extender, webhook, agent), so the e2e
    suite runs exactly what the chart runs; tests append only what differs on loopback (ports,
    paths, credentials) — for a click option given twice, the last one counts."""
    return container_args(chart_docs)


def container_args(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The command lines of the extender, webhook and agent containers of rendered chart documents."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["name"] in ("extender", "webhook", "agent"):
                    out[c["name"]] = list(c["args"])
    assert set(out) == {"extender", "webhook", "agent"}, out
    return out


@pytest.fixture(scope="session")
def chart_identities(control_plane: ControlPlane, chart_docs: list[dict[str, Any]],
                     tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Kubeconfigs for the chart's ServiceAccounts, bound by the chart's own (Cluster)Roles and narrowed by
    its write policies (ValidatingAdmissionPolicies), applied to the real API server (RBAC authorization
    is on). The extender and the agent run the e2e tests under these, so RBAC or a policy that misses
    something the code writes fails the tests, not a user's cluster. The "agent" token here is bound to
    no pod, so the policies let it write nothing: agents run with :func:`agent_identity` tokens."""
    from kubernetes import client

    import yaml

    policies = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    wanted = [d for d in chart_docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                "RoleBinding", *policies)
              and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
              # the guard is test_kube_helm_apply's own business (it applies and deletes it)
              and not (d["kind"] in policies and d["metadata"]["name"].endswith("-guard"))]
    assert {d["metadata"]["name"] for d in wanted if d["kind"] == "ValidatingAdmissionPolicy"} == {
        "gs-gpuslice-agent-nodes", "gs-gpuslice-agent-pods", "gs-gpuslice-extender-nodes", "gs-gpuslice-extender-pods"}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHART_NAMESPACE}}
    manifest = yaml.safe_dump_all([ns, *wanted])
    if not KUBECTL.exists():
        pytest.fail(f"{KUBECTL} is missing; `make -C hack` links it")
    applied = subprocess.run([str(KUBECTL), "--kubeconfig", control_plane.kubeconfig, "apply", "-f", "-"],
                             input=manifest, capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    core = client.CoreV1Api(control_plane.api())
    out = {}
    folder = tmp_path_factory.mktemp("identities")
    for role, sa in (("scheduler", "gs-gpuslice-scheduler"), ("agent", "gs-gpuslice-agent")):
        tok = core.create_namespaced_service_account_token(
            sa, CHART_NAMESPACE, {"spec": {"expirationSeconds": 3 * 3600}}).status.token
        out[role] = write_kubeconfig(control_plane, folder / f"{role}.kubeconfig", sa, tok)
    # The API server compiles new policies asynchronously: wait until the agent-nodes one refuses.
    from gpuslice.kube.api import KubeError, connect

    probe = "gpuslice-e2e-policy-probe"
    core.create_node({"metadata": {"name": probe}})
    deadline = time.monotonic() + 30
    while True:
        try:
            connect(out["agent"]).patch_node_annotations(probe, {"gpuslice.io/devices": "probe"})
        except KubeError as exc:
            if exc.status == 403:
                break
        assert time.monotonic() < deadline, "the chart's write policies never refused an unbound agent token"
        time.sleep(0.5)
    core.delete_node(probe)
    return out


def write_kubeconfig(cp: ControlPlane, path: Path, user: str, token: str) -> str:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {{server: "{cp.server}", certificate-authority: "{cp.ca_file}"}}
users:
- name: {user}
  user: {{token: "{token}"}}
contexts:
- name: {user}
  context: {{cluster: e2e, user: {user}}}
current-context: {user}
""")
    return str(path)


@pytest.fixture(scope="session")
def agent_identity(control_plane: ControlPlane, chart_identities: dict[str, str],
                   tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``agent_identity(node)``: a kubeconfig for the chart's agent ServiceAccount as the DaemonSet pod on
    ``node`` holds it — a token bound to a pod of that account bound to that node, so the API server names
    the node in the token's user (``authentication.kubernetes.io/node-name``), which the chart's agent
    policies check. The pod itself never runs (there is no kubelet). ``account``: another release's agent
    account (the DRA tests install the chart's mode: dra objects as release "gd")."""
    from kubernetes import client

    core = client.CoreV1Api(control_plane.api())
    folder = tmp_path_factory.mktemp("agent-identities")
    made: dict[tuple[str, str], str] = {}
    lock = threading.Lock()

    def identity(node: str, account: str = "gs-gpuslice-agent") -> str:
        with lock:
            if (node, account) in made:
                return made[(node, account)]
        prefix = "agent" if account == "gs-gpuslice-agent" else account
        pod = core.create_namespaced_pod(CHART_NAMESPACE, {
            "metadata": {"name": f"{prefix}-{node}"},
            "spec": {"nodeName": node, "serviceAccountName": account,
                     "containers": [{"name": "agent", "image": "gpuslice"}]}})
        tok = core.create_namespaced_service_account_token(account, CHART_NAMESPACE, {"spec": {
            "expirationSeconds": 3 * 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                               "uid": pod.metadata.uid}}}).status.token
        path = write_kubeconfig(control_plane, folder / f"{prefix}-{node}.kubeconfig", account, tok)
        with lock:
            made[(node, account)] = path
        return path

    return identity


# --------------------------------------------------------------------------------- gpuslice parts
E2E_NAMESPACE = "gpuslice-e2e"
NODE_COUNT = 50
DEVICES_PER_NODE = 4
DEVICE_MEMORY = 80 * 1024**3
DEVICE_SMS = 132
SPLIT_COUNT = 10

# The extender runs as its own process, started the way the chart starts it (`gpuslice scheduler`),
# so the tests can kill it (SIGKILL, mid-bind) and start a fresh one that has nothing but what the
# API server holds.
def gpuslice_cli() -> str:
    import sys

    exe = Path(sys.executable).parent / "gpuslice"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: install gpuslice into this environment (make test does)")
    return str(exe)


class ExtenderProcess:
    """Our scheduler extender on the loopback port the scheduler config names; restartable."""

    def __init__(self, args: list[str], kubeconfig: str, port: int, log_dir: Path):
        self.args, self.kubeconfig, self.port, self.log_dir = args, kubeconfig, port, log_dir
        # The chart's fixed metrics port (9401) on loopback would meet another test run's extender on the same
        # machine ("Address already in use"): a free one of this run's own, kept across restarts.
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        import httpx

        self.starts += 1
        log_path = self.log_dir / f"extender-{self.starts}.log"
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [gpuslice_cli(), *self.args, "--kubeconfig", self.kubeconfig, "--host", "127.0.0.1",
                 "--port", str(self.port), "--metrics-port", str(self.metrics_port)],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"extender did not start (rc={self.proc.poll()}); {log_path}:\n"
                           + log_path.read_text()[-3000:])

    def kill(self) -> None:
        """SIGKILL: no chance to finish in-flight binds or clean anything up."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        # The port is fixed by the scheduler config; wait until the kernel lets it go.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    time.sleep(0.1)
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="session")
def extender(control_plane: ControlPlane, chart_identities: dict[str, str], chart_args: dict[str, list[str]],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderProcess]:
    # The chart's extender container, as the chart's scheduler ServiceAccount: the chart's flags
    # and RBAC must be enough for every test below.
    ext = ExtenderProcess(chart_args["extender"], chart_identities["scheduler"], control_plane.extender_port,
                          tmp_path_factory.mktemp("extender"))
    ext.start()
    yield ext
    ext.kill()


@dataclass
class WebhookProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_webhook(args: list[str], kubeconfig: str, cert: ServingCert, log_path: Path) -> WebhookProcess:
    """A webhook container's command line (`gpuslice scheduler` with ``args``) over TLS on loopback, up and
    answering /healthz."""
    import ssl

    import httpx

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [gpuslice_cli(), *args, "--kubeconfig", kubeconfig,
             "--webhook-host", "127.0.0.1", "--webhook-port", str(port),
             "--tls-cert", cert.cert_file, "--tls-key", cert.key_file],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cadata=cert.ca_pem.decode())
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/healthz", verify=ctx, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"webhook did not start (rc={proc.poll()}):\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    return WebhookProcess(url, proc, log_path)


def stop_webhook(hook: WebhookProcess) -> None:
    hook.proc.terminate()
    try:
        hook.proc.wait(10)
    except subprocess.TimeoutExpired:
        hook.proc.kill()


def register_webhook(cp: ControlPlane, name: str, url: str, cert: ServingCert, label: str) -> None:
    """A MutatingWebhookConfiguration ``name`` sending pod CREATEs of namespaces labelled ``label=true`` to ``url``."""
    import base64

    from kubernetes import client

    mwc = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "pods.gpuslice.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            # Fail, not Ignore: a pod that slipped through unmutated must show up as an error here.
            "failurePolicy": "Fail", "timeoutSeconds": 10,
            "clientConfig": {"url": f"{url}/mutate", "caBundle": base64.b64encode(cert.ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {label: "true"}},
        }],
    }
    client.AdmissionregistrationV1Api(cp.api()).create_mutating_webhook_configuration(mwc)


def unregister_webhook(cp: ControlPlane, name: str) -> None:
    from kubernetes import client

    client.AdmissionregistrationV1Api(cp.api()).delete_mutating_webhook_configuration(name)


@pytest.fixture(scope="session")
def webhook(control_plane: ControlPlane, serving_cert: ServingCert, chart_args: dict[str, list[str]],
            chart_identities: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    """The chart's webhook container (`gpuslice scheduler` with the chart's flags) over TLS, registered
    with the real API server through a MutatingWebhookConfiguration whose caBundle is the test CA,
    for the e2e namespace only."""
    from kubernetes import client

    hook = start_webhook(chart_args["webhook"], chart_identities["scheduler"], serving_cert,
                         tmp_path_factory.mktemp("webhook") / "webhook.log")
    core = client.CoreV1Api(control_plane.api())
    core.create_namespace({"metadata": {"name": E2E_NAMESPACE, "labels": {"gpuslice-e2e": "true"}}})
    register_webhook(control_plane, "gpuslice-e2e", hook.url, serving_cert, "gpuslice-e2e")
    yield hook
    unregister_webhook(control_plane, "gpuslice-e2e")
    stop_webhook(hook)


PRIORITY_NAMESPACES = ("gs-prio-online", "gs-prio-batch")  # the first may ask for high priority, the second not


@pytest.fixture(scope="module")
def priority_webhook(control_plane: ControlPlane, serving_cert: ServingCert, chart_identities: dict[str, str],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    """The webhook as the chart runs it with ``sharing.highPriorityNamespaces=["gs-prio-online"]``, registered for
    the two PRIORITY_NAMESPACES (created here, labelled for it alone: the session's webhook does not see them)."""
    from kubernetes import client

    args = container_args(render_chart(f'sharing.highPriorityNamespaces=["{PRIORITY_NAMESPACES[0]}"]'))["webhook"]
    assert f"--high-priority-namespace={PRIORITY_NAMESPACES[0]}" in args, args
    hook = start_webhook(args, chart_identities["scheduler"], serving_cert,
                         tmp_path_factory.mktemp("priority-webhook") / "webhook.log")
    core = client.CoreV1Api(control_plane.api())
    for ns in PRIORITY_NAMESPACES:
        core.create_namespace({"metadata": {"name": ns, "labels": {"gpuslice-prio-e2e": "true"}}})
    register_webhook(control_plane, "gpuslice-prio-e2e", hook.url, serving_cert, "gpuslice-prio-e2e")
    yield hook
    unregister_webhook(control_plane, "gpuslice-prio-e2e")
    stop_webhook(hook)


def device_uuid(node: str, index: int) -> str:
    return f"GPU-e2e-{node}-{index}"


def fake_devices(node: str) -> list[Any]:
    """4 × H100 80GB, NVLinked, two per NUMA node, with UUIDs unique to ``node``."""
    from gpuslice.spec import Device

    uuids = [device_uuid(node, k) for k in range(DEVICES_PER_NODE)]
    return [Device(uuid=u, index=k, name="NVIDIA H100 80GB HBM3", memory_total=DEVICE_MEMORY, sm_count=DEVICE_SMS,
                   model="H100", numa_node=k // 2, nvlink_peers=tuple(p for p in uuids if p != u))
            for k, u in enumerate(uuids)]


def create_fake_node(core: Any, name: str, labels: dict[str, str] | None = None) -> None:
    """A plain Node object (no kubelet) with our devices annotation, published the way our agent
    publishes it, and nvidia.com/gpu = devices × split count in its status."""
    from gpuslice.kube import formats

    ann = formats.encode_node_devices(fake_devices(name), split_count=SPLIT_COUNT)
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(DEVICES_PER_NODE * SPLIT_COUNT)}
    core.create_node({"metadata": {"name": name, "labels": {"gpu": "on", "kubernetes.io/hostname": name, **(labels or {})},
                                   "annotations": {formats.NODE_DEVICES: ann}}})
    # Status is its own subresource: capacity and a Ready condition, as a kubelet would report.
    core.patch_node_status(name, {"status": {
        "capacity": capacity, "allocatable": capacity,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node"}]}})
    # The API server's TaintNodesByCondition admission gives every new Node the not-ready
    # taint; the node-lifecycle controller (not run here) would lift it once Ready.
    core.patch_node(name, {"spec": {"taints": None}})


@pytest.fixture(scope="session")
def fake_nodes(control_plane: ControlPlane) -> list[str]:
    """The 50 fake GPU nodes the scheduling tests share."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    core = client.CoreV1Api(control_plane.api())
    names = [f"gpu-node-{i:02d}" for i in range(NODE_COUNT)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: create_fake_node(core, n), names))
    return names


@pytest.fixture(scope="session")
def node_maker(control_plane: ControlPlane) -> Any:
    """create_fake_node, for tests that need a node of their own."""
    from kubernetes import client

    core = client.CoreV1Api(control_plane.api())
    return lambda name, labels=None: create_fake_node(core, name, labels)


@pytest.fixture(scope="session")
def devices_of() -> Any:
    """fake_devices: the devices a fake node publishes, for an agent that must serve the same ones."""
    return fake_devices
