"""The DRA kubelet plugin over its real gRPC sockets, called the way the kubelet calls it (stubs from the kubelet's
own protos): registration info, prepare / unprepare answers per claim, and the sockets coming back when removed.
Also: the committed protos are the kubelet's, byte for byte."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from fakedra import allocated_claim
from gpuslice.kube.dra.kubeletapi import HERE, load
from gpuslice.kube.dra.plugin import DraPlugin
from gpuslice.kube.dra.resourceslice import device_name
from test_dra import H100, NODE, GiB, make_driver

ROOT = Path(__file__).resolve().parents[2]
KUBELET_MODULE = "k8s.io/kubelet@v0.37.2"
UPSTREAM = {"dra_v1.proto": "pkg/apis/dra/v1/api.proto",
            "pluginregistration_v1.proto": "pkg/apis/pluginregistration/v1/api.proto"}


def wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def served(tmp_path: Path):
    api, driver = make_driver(tmp_path, plugin_dir=tmp_path / "plugins" / "gpuslice.io",
                              registry_dir=tmp_path / "registry", watch_interval=0.05)
    plugin = DraPlugin(driver)
    thread = plugin.start()
    wait_for(lambda: driver.cfg.registration_path.is_socket() and driver.cfg.socket_path.is_socket(), what="sockets")
    yield api, driver, plugin
    plugin.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_registration_names_the_driver_its_socket_and_the_v1_service(served) -> None:
    api, driver, plugin = served
    k = load()
    with grpc.insecure_channel(f"unix://{driver.cfg.registration_path}") as ch:
        stub = k.reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(k.reg.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == \
            ("DRAPlugin", "gpuslice.io", str(driver.cfg.socket_path), ["v1.DRAPlugin"])
        stub.NotifyRegistrationStatus(k.reg.RegistrationStatus(plugin_registered=False, error="version"), timeout=5)
        assert plugin.registered is False and plugin.registration_error == "version"
        stub.NotifyRegistrationStatus(k.reg.RegistrationStatus(plugin_registered=True), timeout=5)
        assert plugin.registered is True


def test_prepare_and_unprepare_over_grpc_answer_every_claim(served, tmp_path: Path) -> None:
    api, driver, plugin = served
    k = load()
    api.add_claim(allocated_claim("c1", "one", NODE, [{"device": device_name(H100[1].uuid), "memory": 4 * GiB,
                                                       "compute": 30, "shareID": "s-1"}]))
    with grpc.insecure_channel(f"unix://{driver.cfg.socket_path}") as ch:
        stub = k.dra_grpc.DRAPluginStub(ch)
        req = k.dra.NodePrepareResourcesRequest(claims=[k.dra.Claim(namespace="ml", uid="c1", name="one"),
                                                        k.dra.Claim(namespace="ml", uid="c2", name="absent")])
        out = stub.NodePrepareResources(req, timeout=10)
        assert set(out.claims) == {"c1", "c2"}
        assert out.claims["c1"].error == "" and out.claims["c2"].error
        (dev,) = out.claims["c1"].devices
        assert (list(dev.request_names), dev.pool_name, dev.device_name, dev.share_id, list(dev.cdi_device_ids)) == \
            (["gpu"], NODE, device_name(H100[1].uuid), "s-1", [f"gpuslice.io/claim=c1-{device_name(H100[1].uuid)}"])
        assert stub.NodePrepareResources(req, timeout=10).claims["c1"] == out.claims["c1"]
        undo = stub.NodeUnprepareResources(k.dra.NodeUnprepareResourcesRequest(claims=list(req.claims)), timeout=10)
        assert {u: c.error for u, c in undo.claims.items()} == {"c1": "", "c2": ""}
    assert not (tmp_path / "cdi" / "gpuslice.io-claim_c1.json").exists()
    assert driver.checkpoint.claims() == {}


def test_removed_sockets_are_served_again(served) -> None:
    api, driver, plugin = served
    driver.cfg.registration_path.unlink()
    wait_for(driver.cfg.registration_path.is_socket, what="the registration socket to come back")
    k = load()
    with grpc.insecure_channel(f"unix://{driver.cfg.registration_path}") as ch:
        assert k.reg_grpc.RegistrationStub(ch).GetInfo(k.reg.InfoRequest(), timeout=5).name == "gpuslice.io"


def test_stopping_removes_the_sockets(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path, plugin_dir=tmp_path / "p", registry_dir=tmp_path / "r", watch_interval=0.05)
    plugin = DraPlugin(driver)
    thread = plugin.start()
    wait_for(driver.cfg.registration_path.is_socket, what="the registration socket")
    plugin.stop()
    thread.join(10)
    assert not driver.cfg.registration_path.exists() and not driver.cfg.socket_path.exists()


def _module_cache() -> Path | None:
    found = os.environ.get("GOMODCACHE")
    if not found:
        for go in (ROOT / "hack" / ".go" / "bin" / "go", Path("/usr/local/go/bin/go")):
            if go.exists():
                found = subprocess.run([str(go), "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
                break
    return Path(found) if found else None


def test_the_committed_protos_are_the_kubelets_own() -> None:
    """`make -C hack` fetches k8s.io/kubelet (a dependency of the control plane it builds): compare with it."""
    cache = _module_cache()
    if cache is None or not (cache / KUBELET_MODULE).is_dir():
        message = f"{KUBELET_MODULE} is not in the Go module cache; `make -C hack` downloads it"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    for ours, theirs in UPSTREAM.items():
        lines = (HERE / ours).read_text().splitlines(keepends=True)
        copied = "".join(lines[3:])  # our three header lines name the source
        assert "".join(lines[:3]).count(KUBELET_MODULE.replace("@", " ")) == 1, ours
        assert copied == (cache / KUBELET_MODULE / theirs).read_text(), f"{ours} differs from {theirs}"
