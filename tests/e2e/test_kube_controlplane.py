"""The harness itself (hack/bin/controlplane): it reports ready with working credentials, serves the
Kubernetes release it was built from, stops cleanly on SIGTERM, and fails loudly (exit 1, a message)
instead of hanging when a component cannot start.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # conftest is loaded by pytest, not imported (tests/e2e is not a package)
    from conftest import ControlPlane

pytestmark = pytest.mark.kube_e2e

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "hack" / "bin" / "controlplane"


def _k8s_version() -> str:
    for line in (ROOT / "hack" / "controlplane" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "k8s.io/kubernetes":
            return parts[1]
    raise AssertionError("k8s.io/kubernetes is not required in hack/controlplane/go.mod")


def test_session_control_plane_serves_its_release_with_webhooks_and_rbac(control_plane: "ControlPlane") -> None:
    import re
    import ssl

    import httpx

    ctx = ssl.create_default_context(cafile=control_plane.ca_file)  # the server cert chains to the harness CA
    v = httpx.get(control_plane.server + "/version", verify=ctx,
                  headers={"Authorization": f"Bearer {control_plane.token}"}, timeout=10).json()
    assert v["gitVersion"] == _k8s_version()
    # The API server verifies clients: no credentials, no access.
    anon = httpx.get(control_plane.server + "/api/v1/nodes", verify=ctx, timeout=10)
    assert anon.status_code in (401, 403)
    # The admission chain the suite relies on, as the API server reports it when it starts.
    log = Path(control_plane.info["apiserver_log"]).read_text()
    mutating = re.search(r"Loaded \d+ mutating admission controller\(s\) successfully in the following order: (\S+)", log)
    assert mutating, "the API server did not report its mutating admission chain"
    chain = mutating.group(1).rstrip(".").split(",")
    assert "MutatingAdmissionWebhook" in chain and "TaintNodesByCondition" in chain
    assert "ServiceAccount" not in chain  # off: no controller-manager makes default ServiceAccounts here


def _start(args: list[str]) -> subprocess.Popen[str]:
    if not HARNESS.exists():
        pytest.fail(f"{HARNESS} is missing; `make -C hack`")
    return subprocess.Popen([str(HARNESS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_stops_everything_and_exits_zero(control_plane: "ControlPlane", tmp_path: Path) -> None:
    """A second, throwaway control plane (the session's one stays up): SIGTERM -> exit 0, every port freed."""
    proc = _start(["--dir", str(tmp_path / "cp")])
    try:
        _check_and_stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def _check_and_stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("GPUSLICE_CONTROLPLANE_READY "), (line, proc.stderr.read() if proc.stderr else "")
    info: dict[str, Any] = json.loads(line.split(" ", 1)[1])
    assert Path(info["kubeconfig"]).exists()
    kubectl = subprocess.run([str(HARNESS.parent / "kubectl"), "--kubeconfig", info["kubeconfig"], "get", "namespace", "default", "-o",
                              "name"], capture_output=True, text=True, timeout=30)
    assert kubectl.stdout.strip() == "namespace/default", kubectl.stderr
    api_port = int(info["server"].rsplit(":", 1)[1])
    etcd_port = int(info["etcd"].rsplit(":", 1)[1])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 0, proc.stderr.read() if proc.stderr else ""
    for port in (api_port, etcd_port):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers after shutdown"


def test_a_component_that_cannot_start_fails_loudly(tmp_path: Path) -> None:
    bad = tmp_path / "sched.yaml"
    # A profile naming a plugin kube-scheduler does not have: it refuses to start.
    bad.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                   "profiles: [{schedulerName: x, plugins: {filter: {enabled: [{name: NoSuchPlugin}]}}}]\n")
    started = time.monotonic()
    proc = _start(["--dir", str(tmp_path / "cp"), "--scheduler-config", str(bad)])
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:  # it hung instead of failing: do not leave it running
            proc.kill()
    assert proc.returncode == 1
    assert "GPUSLICE_CONTROLPLANE_READY" not in out
    assert "kube-scheduler" in err and "NoSuchPlugin" in err, err[-2000:]
    assert time.monotonic() - started < 150
