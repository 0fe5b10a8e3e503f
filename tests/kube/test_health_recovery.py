"""Device health without a GPU: NvmlHealth driven by an NVML double (tests/kube/nvmldouble.py) — a
critical XID reaches the kubelet through ListAndWatch, a device comes back after the recovery rule —
and rediscovery: new or vanished GPUs reach ListAndWatch and the node's gpuslice.io/devices."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")  # pinned in pyproject; absent only on bare GPU images
from fakeapi import FakeAPI
from kubefixtures import devices
from nvmldouble import NvmlDouble

from gpuslice.kube import formats
from gpuslice.kube.agent import NodePublisher, Rediscovery
from gpuslice.kube.deviceplugin import load
from gpuslice.kube.health import APPLICATION_XIDS, NvmlHealth
from gpuslice.kube.allocator import PluginConfig, device_id
from gpuslice.kube.plugin import DevicePlugin

pb, pb_grpc = load()


@pytest.fixture
def folder():
    path = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))  # short: Unix socket paths max 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------------------ the rule, step by step
def test_recovery_rule_needs_quiet_time_a_good_query_and_no_pending_reset():
    nvml, clock, reports = NvmlDouble(), Clock(), []
    devs = devices("n0", 2)
    u0, u1 = devs[0].uuid, devs[1].uuid
    health = NvmlHealth(poll_seconds=1, recover_seconds=60, nvml=nvml, clock=clock)
    report = lambda *a: reports.append(a[:2])  # noqa: E731
    health.poll(nvml, devs, report)
    assert reports == []                                   # both answer, nothing was wrong
    nvml.broken.add(u1)                                    # the card stops answering NVML
    health.poll(nvml, devs, report)
    assert reports == [(u1, False)]
    nvml.broken.clear()
    clock.t += 59
    health.poll(nvml, devs, report)
    assert reports == [(u1, False)]                        # answers again, but not quiet for 60 s yet
    clock.t += 1
    nvml.remap_pending[u1] = True                          # a row remapping waits for a GPU reset
    health.poll(nvml, devs, report)
    assert reports == [(u1, False)]
    nvml.remap_pending[u1] = False
    health.poll(nvml, devs, report)
    assert reports == [(u1, False), (u1, True)]            # quiet 60 s, answers, nothing pending
    health.poll(nvml, devs, report)
    assert reports == [(u1, False), (u1, True)]            # reported once
    # recover_seconds=0: a fault is for good (NVIDIA's device plugin behaves so)
    never = NvmlHealth(poll_seconds=1, recover_seconds=0, nvml=nvml, clock=clock)
    nvml.broken.add(u0)
    never.poll(nvml, devs, report)
    nvml.broken.clear()
    clock.t += 10**6
    never.poll(nvml, devs, report)
    assert reports[-1] == (u0, False)


def test_application_xids_are_ignored_and_critical_ones_reported():
    nvml, reports, stop = NvmlDouble(), [], threading.Event()
    devs = devices("n0", 2)
    health = NvmlHealth(poll_seconds=30, recover_seconds=0, nvml=nvml, wait_ms=20)
    t = threading.Thread(target=health.run, args=(devs, lambda *a: reports.append(a), stop))
    t.start()
    try:
        assert wait_for(lambda: nvml.registered == {d.uuid for d in devs})
        for xid in sorted(APPLICATION_XIDS):
            nvml.xid(devs[0].uuid, xid)           # a program's fault (e.g. 13: graphics engine exception)
        nvml.xid(devs[1].uuid, 48)                # double-bit ECC error: the device's fault
        assert wait_for(lambda: reports)
        time.sleep(0.1)
        assert reports == [(devs[1].uuid, False, "XID 48")]
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive() and nvml.calls[-1] == "shutdown"


# ------------------------------------------------------------------------------ through ListAndWatch
def make_plugin(folder: Path, health, api=None, **kw) -> DevicePlugin:
    cfg = PluginConfig(node="n0", plugin_dir=folder / "dp", host_state_dir=folder / "state", split_count=2,
                       watch_interval=0.05)
    (folder / "dp").mkdir(exist_ok=True)
    return DevicePlugin(cfg, devices("n0", 2), api, health=health, **kw)


def test_critical_xid_marks_the_device_unhealthy_in_list_and_watch_and_it_comes_back(folder):
    nvml = NvmlDouble()
    recover = 0.6
    plugin = make_plugin(folder, NvmlHealth(poll_seconds=0.05, recover_seconds=recover, nvml=nvml, wait_ms=20))
    uuids = [d.uuid for d in devices("n0", 2)]
    plugin.serve()
    plugin.start_health()
    try:
        channel = grpc.insecure_channel(f"unix://{plugin.cfg.socket_path}")
        with channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=30)
            first = {d.ID: d.health for d in next(stream).devices}
            assert set(first.values()) == {"Healthy"} and len(first) == 4
            assert wait_for(lambda: nvml.registered == set(uuids))
            nvml.xid(uuids[0], 79)  # GPU has fallen off the bus
            faulted = time.monotonic()
            second = {d.ID: d.health for d in next(stream).devices}
            assert second[device_id(uuids[0], 0)] == second[device_id(uuids[0], 1)] == "Unhealthy"
            assert second[device_id(uuids[1], 0)] == "Healthy"
            # NVML answers for it again: Healthy once it has been quiet for `recover` seconds
            third = {d.ID: d.health for d in next(stream).devices}
            assert time.monotonic() - faulted >= recover
            assert set(third.values()) == {"Healthy"}
            stream.cancel()
    finally:
        plugin.stop()
        plugin.shutdown()


# ------------------------------------------------------------------------------ rediscovery
def _annotation(api: FakeAPI) -> formats.NodeDevices:
    return formats.decode_node_devices(api.get_node("n0")["metadata"]["annotations"][formats.NODE_DEVICES])


def test_rediscovery_updates_list_and_watch_and_the_node_annotation(folder):
    api = FakeAPI()
    api.add_node("n0")
    found = {"devices": devices("n0", 2)}
    publisher = NodePublisher(api, "n0", found["devices"], interval=30)
    plugin = make_plugin(folder, None, api, on_health=publisher.health_changed, on_devices=publisher.devices_changed)
    publisher.start()

    def discover():
        if isinstance(found["devices"], Exception):
            raise found["devices"]
        return found["devices"]

    rediscovery = Rediscovery(discover, plugin.set_devices, interval=30)
    plugin.serve()
    try:
        assert wait_for(lambda: formats.NODE_DEVICES in api.get_node("n0")["metadata"]["annotations"])
        channel = grpc.insecure_channel(f"unix://{plugin.cfg.socket_path}")
        with channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=30)
            assert len(next(stream).devices) == 4
            # A third GPU appears (e.g. after a driver reload): advertised and published
            found["devices"] = devices("n0", 3)
            assert rediscovery.run_once()
            assert len(next(stream).devices) == 6
            assert wait_for(lambda: len(_annotation(api).devices) == 3)
            # GPU 0 vanishes: still listed (grants may name it), Unhealthy, in both places
            gone = found["devices"][0].uuid
            found["devices"] = found["devices"][1:]
            assert rediscovery.run_once()
            health = {d.ID: d.health for d in next(stream).devices}
            assert len(health) == 6 and health[device_id(gone, 0)] == "Unhealthy"
            assert wait_for(lambda: not _annotation(api).healthy(gone))
            assert len(_annotation(api).devices) == 3
            # A failed discovery changes nothing
            found["devices"] = RuntimeError("NVML: driver not loaded")
            assert rediscovery.run_once() is False
            assert len(plugin.devices()) == 3 and not plugin.health[gone] == "Healthy"
            stream.cancel()
    finally:
        publisher.stop()
        plugin.stop()
        plugin.shutdown()


def test_kube_agent_wires_rediscovery_and_health_recovery():
    """The CLI flags exist, with the documented defaults."""
    import inspect

    from gpuslice.kube.commands import kube_agent

    params = inspect.signature(kube_agent).parameters
    assert params["rediscover_interval"].default.default == 60.0
    assert params["health_recovery"].default.default == 300.0
