"""node/devices.py: discovery through NVML and from snapshots.

The NVML double below is small on purpose: it answers only the calls discovery makes, with the shapes
nvidia-ml-py returns. The real path runs on the GPU machine (bench/results/*-devices.txt).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from gpuslice.errors import NoGpuError, SnapshotError
from gpuslice.node import devices as discovery
from gpuslice.spec import GiB


class _NVMLError(Exception):
    pass


def _fake_pynvml(cards: list[dict], fail_init: bool = False) -> types.ModuleType:
    """An NVML double: ``cards`` hold uuid/name/mem/bus/links (remote bus per active link)/mig."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")

    def unsupported(*_a):
        raise _NVMLError("Not Supported")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(cards)
    m.nvmlDeviceGetHandleByIndex = lambda i: cards[i]
    m.nvmlDeviceGetUUID = lambda h: h["uuid"].encode()
    m.nvmlDeviceGetName = lambda h: h["name"]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h["mem"])
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["bus"].lower().encode())
    m.nvmlDeviceGetMigMode = lambda h: (1, 1) if h.get("mig") else (0, 0)
    m.nvmlDeviceGetAttributes_v2 = lambda h: types.SimpleNamespace(multiprocessorCount=h.get("sms", 0))
    m.nvmlDeviceGetNumaNodeId = lambda h: h.get("numa", -1)
    m.nvmlDeviceGetComputeMode = lambda h: h.get("cmode", 0)
    m.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < len(h.get("links", [])) else unsupported()
    m.nvmlDeviceGetNvLinkRemotePciInfo_v2 = lambda h, link: types.SimpleNamespace(busId=h["links"][link])
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: len(h.get("mig", []))
    m.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: h["mig"][i]
    return m


def _card(n: int, **extra) -> dict:
    return {"uuid": f"GPU-{n}", "name": "NVIDIA A100-SXM4-40GB", "mem": 40 * GiB, "bus": f"00000000:0{n}:00.0",
            "sms": 108, "numa": n // 2, **extra}


def test_nvml_discovery_reads_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    mig = {"uuid": "MIG-a", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "mem": 20 * GiB, "bus": "", "sms": 42}
    cards = [_card(0, links=["00000000:01:00.0"]), _card(1, links=["00000000:00:00.0"], mig=[mig], cmode=3)]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(cards))
    found = discovery.discover_nvml()
    assert [d.uuid for d in found] == ["GPU-0", "GPU-1"]
    assert found[0].model == "A100-SXM4-40GB" and found[0].sm_count == 108 and found[0].memory_total == 40 * GiB
    assert found[0].nvlink_peers == ("GPU-1",) and found[1].nvlink_peers == ("GPU-0",)
    assert found[1].mig_enabled and found[1].mig_instances[0].profile.endswith("3g.20gb")
    assert found[1].mig_instances[0].sm_count == 42 and found[1].compute_mode == "ExclusiveProcess"
    assert found[1].numa_node == 0 and found[0].pci_bus_id == "00000000:00:00.0"


def test_links_to_an_nvswitch_make_every_gpu_a_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    switch = "00000000:F0:00.0"
    cards = [_card(i, links=[switch, switch]) for i in range(3)]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(cards))
    assert discovery.discover_nvml()[0].nvlink_peers == ("GPU-1", "GPU-2")


def test_no_driver_is_a_clear_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([], fail_init=True))
    with pytest.raises(NoGpuError, match="no NVIDIA driver found"):
        discovery.discover_nvml()


def test_driver_without_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([]))
    with pytest.raises(NoGpuError, match="reports no GPU"):
        discovery.discover_nvml()


@pytest.mark.parametrize("name, sms, gib", [("h100-80gb", 132, 79.6), ("a100-80gb", 108, 80), ("a100-40gb", 108, 40),
                                             ("t4", 40, 15), ("l4", 58, 22.5)])
def test_bundled_snapshots_hold_real_card_numbers(name: str, sms: int, gib: float) -> None:
    found = discovery.load_snapshot(name)
    assert all(d.sm_count == sms for d in found)
    assert abs(found[0].memory_total / GiB - gib) < 0.1


def test_snapshot_round_trips_through_json(tmp_path) -> None:
    found = discovery.load_snapshot("a100-80gb")
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(discovery.snapshot_json(found, "test")))
    assert discovery.load_snapshot(path) == found


def test_env_snapshot_replaces_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(discovery.SNAPSHOT_ENV, "t4")
    assert len(discovery.discover()) == 4


@pytest.mark.parametrize(
    "doc, message",
    [({"format": "other"}, "field 'format'"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": []}, "non-empty list"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": [{"uuid": "GPU-1"}]}, r"devices\[0\]: missing field"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": [{"uuid": "GPU-1", "index": 0, "name": "x",
                                                         "memory_total": -1, "sm_count": 1}]}, "memory_total")],
)
def test_bad_snapshots_name_the_field(tmp_path, doc: dict, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match=message):
        discovery.load_snapshot(path)


def test_unknown_snapshot_lists_the_bundled_ones() -> None:
    with pytest.raises(SnapshotError, match="bundled: a100-40gb"):
        discovery.load_snapshot("no-such-card")


@pytest.mark.gpu
def test_real_gpu_discovery_reports_memory_and_sms() -> None:
    found = discovery.discover_nvml()
    assert found and all(d.memory_total > GiB and d.sm_count > 0 and d.uuid.startswith("GPU-") for d in found)
