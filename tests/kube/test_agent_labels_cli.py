"""Node registration, the metrics label bridge, and the CLI entry points (as separate processes)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")  # pinned in pyproject; absent only on bare GPU images
pytest.importorskip("cryptography")
from fakeapi import FakeAPI
from kubefixtures import devices, node, pod
from prometheus_client import CollectorRegistry, generate_latest

from gpuslice.kube import formats
from gpuslice.kube.agent import NodePublisher, unique_devices
from gpuslice.kube.certs import write_self_signed
from gpuslice.kube.extender import Extender
from gpuslice.kube.labels import KubeLabelCollector, LedgerLabels, grant_labels, watched_grants
from gpuslice.host.devices import load_snapshot
from gpuslice.host.metrics import ViewCollector
from gpuslice.host.monitor import Monitor



def _wait_healthy(proc: Any, url: str, what: str, **httpx_args: Any) -> None:
    """Poll ``url`` until it answers "ok"; fail with the process's stderr if it exits, after 20 s if not."""
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url, timeout=1, **httpx_args).text == "ok":
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.1)

def test_unique_devices_rename_consistently_per_node():
    base = load_snapshot("h100-80gb")
    a, b = unique_devices(base, "fake-1"), unique_devices(base, "fake-2")
    assert {d.uuid for d in a}.isdisjoint({d.uuid for d in b})
    assert unique_devices(base, "fake-1") == a  # deterministic
    uuids = {d.uuid for d in a}
    assert all(p in uuids for d in a for p in d.nvlink_peers)
    assert all(d.uuid.startswith("GPU-") for d in a)


def test_publisher_writes_devices_and_keeps_the_ledger():
    api = FakeAPI()
    api.add_node("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}))})
    devs = devices("n0", 2)
    pub = NodePublisher(api, "n0", devs, split_count=7, memory_scaling=1.2, interval=0.05)
    pub.start()
    try:
        deadline = time.monotonic() + 5
        while pub.published < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pub.health_changed({devs[1].uuid: formats.UNHEALTHY})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            anns = api.get_node("n0")["metadata"]["annotations"]
            nd = formats.decode_node_devices(anns[formats.NODE_DEVICES])
            if not nd.healthy(devs[1].uuid):
                break
            time.sleep(0.01)
    finally:
        pub.stop()
    assert [d.uuid for d in nd.devices] == [d.uuid for d in devs] and nd.split_count == 7
    assert nd.memory_scaling == 1.2 and not nd.healthy(devs[1].uuid) and nd.healthy(devs[0].uuid)
    assert formats.NODE_LEDGER in anns  # a merge patch of one key


def test_metrics_get_namespace_pod_container_from_the_ledger(tmp_path):
    api = FakeAPI()
    api.add_node("n0", node("n0", 2)["metadata"]["annotations"])
    p = api.add_pod(pod("train", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}, namespace="ml"))
    assert Extender(api).bind({"PodName": "train", "PodNamespace": "ml", "PodUID": p["metadata"]["uid"],
                               "Node": "n0"})["Error"] == ""
    labels = LedgerLabels(api, "n0", ttl=0)
    ledger = labels.ledger()
    (gid, found), = grant_labels(ledger).items()
    assert found.namespace == "ml" and found.pod == "train" and found.container == "main"
    records = watched_grants(ledger, tmp_path)
    assert records[0].region_file == str(tmp_path / "kube" / "regions" / gid / "region")
    monitor = Monitor(devices("n0", 2), "n0")
    registry = CollectorRegistry()
    registry.register(KubeLabelCollector(ViewCollector(lambda: monitor.sample(records)), labels))
    text = generate_latest(registry).decode()
    line = next(l for l in text.splitlines() if l.startswith("gpuslice_slice_memory_limit_bytes{"))
    assert f'grant="{gid}"' in line and 'namespace="ml"' in line and 'pod="train"' in line
    assert 'container="main"' in line and float(line.rsplit(" ", 1)[1]) == 4096 * 1024**2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scheduler_verb_serves_extender_and_tls_webhook(tmp_path):
    tls = write_self_signed(tmp_path / "tls")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n"
        "    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        "current-context: c\nusers:\n- name: u\n  user:\n    token: t\n")
    port, wport = _free_port(), _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "scheduler", "--kubeconfig", str(kubeconfig),
                             "--port", str(port), "--webhook-host", "127.0.0.1", "--webhook-port", str(wport),
                             "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--policy", "spread",
                             "--log-level", "error"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/healthz", "scheduler")
        body = {"Pod": pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
                "Nodes": {"items": [node("a"), node("b", memory=512 * 1024**2)]}}
        out = httpx.post(f"http://127.0.0.1:{port}/filter", json=body, timeout=10).json()
        assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["a"] and "b" in out["FailedNodes"]
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "operation": "CREATE", "object": pod("q", {"nvidia.com/gpumem": "1000"})}}
        ctx = ssl.create_default_context(cafile=str(tls.ca))
        r = httpx.post(f"https://127.0.0.1:{wport}/mutate", json=review, verify=ctx, timeout=10)
        assert r.status_code == 200 and r.json()["response"]["allowed"] is True
    finally:
        proc.terminate()
        proc.wait(10)


def plain(text: str) -> str:
    from clitext import plain as unboxed  # tests/support: sentences out of rich's error box

    return unboxed(text)


def _scheduler(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuslice.cli", "scheduler", *args],
                          capture_output=True, text=True, timeout=60)


def test_scheduler_verb_refuses_webhook_without_tls_and_nothing_to_serve(tmp_path):
    """Command lines that cannot work are usage errors (exit 2, the contract of every verb) naming what to
    change; credentials that exist but do not load are gpuslice's failure (exit 1)."""
    none = str(tmp_path / "none")
    r = _scheduler("--kubeconfig", none)
    assert r.returncode == 2 and "needs --tls-cert and --tls-key" in r.stderr, r.stderr
    r = _scheduler("--kubeconfig", none, "--port", "0", "--webhook-port", "0")
    assert r.returncode == 2 and "nothing to serve" in r.stderr, r.stderr
    r = _scheduler("--kubeconfig", none, "--webhook-port", "0", "--allocation-timeout", "-1")
    assert r.returncode == 2 and "--allocation-timeout" in r.stderr, r.stderr
    r = _scheduler("--kubeconfig", none, "--webhook-port", "0", "--port", "70000")
    assert r.returncode == 2 and "--port" in r.stderr, r.stderr
    # The extender alone still needs credentials (it is the part that talks to the API server).
    r = _scheduler("--kubeconfig", none, "--webhook-port", "0")
    assert r.returncode == 2 and "not found" in plain(r.stderr) and "--kubeconfig" in r.stderr, r.stderr
    (tmp_path / "empty").write_text("")
    r = _scheduler("--kubeconfig", str(tmp_path / "empty"), "--webhook-port", "0")
    assert r.returncode == 1 and "Kubernetes credentials" in r.stderr, r.stderr


def test_scheduler_port_0_serves_the_webhook_only(tmp_path):
    """The chart's webhook container runs `scheduler --port 0`: no extender, no API connection (its
    credentials here do not even exist), just /mutate over TLS."""
    tls = write_self_signed(tmp_path / "tls")
    wport = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuslice.cli", "scheduler", "--kubeconfig", str(tmp_path / "none"),
                             "--host", "127.0.0.1", "--port", "0", "--webhook-host", "127.0.0.1",
                             "--webhook-port", str(wport), "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
                             "--log-level", "error"], env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            stderr=subprocess.PIPE, text=True)
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    try:
        _wait_healthy(proc, f"https://127.0.0.1:{wport}/healthz", "webhook", verify=ctx)
        assert httpx.post(f"https://127.0.0.1:{wport}/filter", json={}, verify=ctx, timeout=5).status_code == 404
        with socket.create_connection(("127.0.0.1", wport)):
            pass
        # nothing else listens: the extender's default port is not taken, port 0 bound nothing either
        assert proc.poll() is None
        conns = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        mine = [line for line in conns.splitlines() if f"pid={proc.pid}," in line]
        if mine:  # ss names owners only when allowed to; then it is exactly the webhook's socket
            assert len(mine) == 1 and f":{wport} " in mine[0], mine
    finally:
        proc.terminate()
        proc.wait(10)


def test_agent_kubernetes_is_the_kube_agent_verb(tmp_path, capsys):
    """`gpuslice agent --kubernetes` (the issue's spelling) runs kube-agent with kube-agent's options, wherever
    the flag stands; without it `agent` stays the local agent."""
    from gpuslice.cli import main

    assert main(["agent", "--kubernetes", "--help"]) == 0
    assert "gpuslice kube-agent" in capsys.readouterr().out
    assert main(["agent", "--split-count", "4", "--kubernetes", "--help"]) == 0  # kube-agent's option parses
    assert "gpuslice kube-agent" in capsys.readouterr().out
    assert main(["agent", "--split-count", "4"]) == 2  # the local agent has no such option
    (tmp_path / "empty").write_text("")
    r = subprocess.run([sys.executable, "-m", "gpuslice.cli", "agent", "--kubernetes", "--node", "n1",
                        "--snapshot", "h100-80gb", "--kubeconfig", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Kubernetes credentials" in r.stderr, r.stderr  # kube-agent's own error


def test_kube_agent_enforcer_flags_reach_the_slice_files(monkeypatch, tmp_path, capsys):
    """--oom-policy, --fail-open and --enforcer-log-level become the PluginConfig every slice file is
    written from; bad values are refused naming the flag before any discovery or API call."""
    import gpuslice.kube.api as kube_api
    import gpuslice.kube.plugin as kube_plugin
    from fakeapi import FakeAPI

    from gpuslice.cli import main

    seen = {}

    class Captured(SystemExit):
        pass

    def capture(cfg, devices, api, **kw):
        seen["cfg"] = cfg
        raise Captured(0)

    monkeypatch.setattr(kube_api, "connect", lambda kubeconfig=None: FakeAPI())
    monkeypatch.setattr(kube_plugin, "DevicePlugin", capture)
    base = ["kube-agent", "--node", "n1", "--snapshot", "h100-80gb", "--plugin-dir", str(tmp_path),
            "--host-state-dir", str(tmp_path / "state"), "--rediscover-interval", "0"]
    assert main(base + ["--oom-policy", "kill", "--fail-open", "--enforcer-log-level", "debug"]) == 0
    cfg = seen.pop("cfg")
    assert (cfg.oom_policy, cfg.fail_open, cfg.log_level) == ("kill", True, "debug")
    assert main(base) == 0
    cfg = seen.pop("cfg")
    assert (cfg.oom_policy, cfg.fail_open, cfg.log_level) == ("return", False, "warn")  # the safe defaults
    capsys.readouterr()
    for bad, flag in ((["--oom-policy", "explode"], "--oom-policy"), (["--enforcer-log-level", "loud"],
                                                                        "--enforcer-log-level")):
        monkeypatch.setattr(kube_api, "connect", lambda kubeconfig=None: pytest.fail("connected before checking"))
        assert main(base + bad) == 2  # a value the flag does not take: a usage error
        err = capsys.readouterr().err
        assert flag in err and bad[1] in err, err
    assert "cfg" not in seen
