"""node/devices.py: discovery through NVML and from snapshots.

The NVML double below answers only the calls discovery makes, but it is built from the real
``pynvml`` module (nvidia-ml-py, pinned in pyproject.toml): its constants and error classes are the
real ones, and each fake function exists in the real module under that name and accepts only the
arguments the real one accepts. A misspelt or non-existent NVML call fails these tests instead of
crashing on a GPU machine. The real path runs on the GPU machine (bench/results/*-devices.txt).
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable

import pynvml as real_nvml
import pytest

from gpuslice.cli import main
from gpuslice.host.errors import NoGpuError, SnapshotError
from gpuslice.host import devices as discovery
from gpuslice.spec import GiB, MiB

SWITCH = "switch"


def _nvml_error(code: int) -> real_nvml.NVMLError:
    return real_nvml.NVMLError(code)  # the real class picks the real subclass and message


def _mirror(name: str, fake: Callable[..., Any]) -> Callable[..., Any]:
    """``fake`` under the real function's name and signature: a call the real one would refuse fails."""
    real = getattr(real_nvml, name, None)
    assert callable(real), f"nvidia-ml-py {real_nvml.__name__} has no {name}: the double must mirror the real API"
    signature = inspect.signature(real)

    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        signature.bind(*args, **kwargs)
        return fake(*args, **kwargs)

    return call


def _fake_pynvml(cards: list[dict], fail_init: bool = False, count_error: int | None = None,
                 driver: str = "580.159") -> types.ModuleType:
    """An NVML double. ``cards`` hold uuid/name/mem/bus/sms/numa/cmode, ``links`` (per active link: the far
    end's bus id, or ``(SWITCH, bus)``, or ``(None, bus)`` for a far end of unknown type), ``mig`` (instances,
    same keys) and ``fail`` ({call name: NVML error code} for calls on that card's handle)."""
    m = types.ModuleType("pynvml")
    for name in dir(real_nvml):  # constants and error classes exactly as the real module has them
        value = getattr(real_nvml, name)
        if not name.startswith("__") and (isinstance(value, type) or not callable(value)):
            setattr(m, name, value)

    def on(name: str, body: Callable[..., Any]) -> Callable[..., Any]:
        def call(handle: dict, *rest: Any) -> Any:
            code = handle.get("fail", {}).get(name)
            if code is not None:
                raise _nvml_error(code)
            return body(handle, *rest)
        return call

    def init() -> None:
        if fail_init:
            raise _nvml_error(real_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def count() -> int:
        if count_error is not None:
            raise _nvml_error(count_error)
        return len(cards)

    def handle_by_index(i: int) -> dict:
        code = cards[i].get("fail", {}).get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            raise _nvml_error(code)
        return cards[i]

    def link_end(h: dict, link: int) -> tuple[str | None, str]:
        if link >= len(h.get("links", [])):
            raise _nvml_error(real_nvml.NVML_ERROR_INVALID_ARGUMENT)
        end = h["links"][link]
        return ("gpu", end) if isinstance(end, str) else end

    def remote_type(h: dict, link: int) -> int:
        kind = link_end(h, link)[0]
        if kind is None:
            raise _nvml_error(real_nvml.NVML_ERROR_NOT_SUPPORTED)
        return real_nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH if kind == SWITCH else real_nvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def attributes(h: dict) -> Any:
        if not h.get("is_mig"):  # as on real drivers: only MIG device handles have attributes
            raise _nvml_error(real_nvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(multiprocessorCount=h.get("sms", 0))

    def mig_handle(h: dict, i: int) -> dict:
        inst = h["mig"][i]
        if inst is None:  # an empty slot
            raise _nvml_error(real_nvml.NVML_ERROR_NOT_FOUND)
        return {**inst, "is_mig": True}

    impl: dict[str, Callable[..., Any]] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": count,
        "nvmlSystemGetDriverVersion": lambda: driver,
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
        "nvmlSystemGetNVMLVersion": lambda: f"13.{driver}",
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetUUID": on("nvmlDeviceGetUUID", lambda h: h["uuid"].encode()),
        "nvmlDeviceGetName": on("nvmlDeviceGetName", lambda h: h["name"]),
        "nvmlDeviceGetMemoryInfo": on("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(total=h["mem"])),
        "nvmlDeviceGetPciInfo": on("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=h["bus"].lower().encode())),
        "nvmlDeviceGetMigMode": on("nvmlDeviceGetMigMode", lambda h: [1, 1] if h.get("mig") else [0, 0]),
        "nvmlDeviceGetAttributes_v2": on("nvmlDeviceGetAttributes_v2", attributes),
        "nvmlDeviceGetNumaNodeId": on("nvmlDeviceGetNumaNodeId", lambda h: h.get("numa", -1)),
        "nvmlDeviceGetComputeMode": on("nvmlDeviceGetComputeMode", lambda h: h.get("cmode", 0)),
        "nvmlDeviceGetCudaComputeCapability": on("nvmlDeviceGetCudaComputeCapability", lambda h: h.get("cc", (9, 0))),
        "nvmlDeviceGetNvLinkState": on("nvmlDeviceGetNvLinkState", lambda h, link: int(bool(link_end(h, link)))),
        "nvmlDeviceGetNvLinkRemoteDeviceType": on("nvmlDeviceGetNvLinkRemoteDeviceType", remote_type),
        "nvmlDeviceGetNvLinkRemotePciInfo": on(
            "nvmlDeviceGetNvLinkRemotePciInfo",
            lambda h, link: types.SimpleNamespace(busId=link_end(h, link)[1].encode())),
        "nvmlDeviceGetMaxMigDeviceCount": on("nvmlDeviceGetMaxMigDeviceCount", lambda h: len(h.get("mig", []))),
        "nvmlDeviceGetMigDeviceHandleByIndex": on("nvmlDeviceGetMigDeviceHandleByIndex", mig_handle),
    }
    for name, fake in impl.items():
        setattr(m, name, _mirror(name, fake))
    return m


class _FakeCuda:
    """libcuda as ctypes sees it: ``order`` is CUDA's enumeration (bus ids), which need not be NVML's."""

    def __init__(self, sms_by_bus: dict[str, int], order: list[str]):
        self.sms = sms_by_bus
        self.order = [b.upper() for b in order]
        self.asked: list[str] = []

    def cuInit(self, flags: int) -> int:
        return 0

    def cuDeviceGet(self, ref: Any, ordinal: int) -> int:
        ref._obj.value = ordinal
        return 0

    def cuDeviceGetByPCIBusId(self, ref: Any, bus_id: bytes) -> int:
        text = bus_id.decode()
        self.asked.append(text)
        domain, rest = text.split(":", 1)
        wanted = f"{int(domain, 16):08X}:{rest.upper()}"
        if wanted not in self.order:
            return 101  # CUDA_ERROR_INVALID_DEVICE: e.g. hidden by CUDA_VISIBLE_DEVICES
        ref._obj.value = self.order.index(wanted)
        return 0

    def cuDeviceGetAttribute(self, ref: Any, attribute: int, device: Any) -> int:
        assert attribute == 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        ref._obj.value = self.sms[self.order[device.value]]
        return 0


def _card(n: int, **extra) -> dict:
    return {"uuid": f"GPU-{n}", "name": "NVIDIA A100-SXM4-40GB", "mem": 40 * GiB, "bus": f"00000000:0{n}:00.0",
            "numa": n // 2, **extra}


@pytest.fixture()
def cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[..., _FakeCuda]:
    def install(sms_by_bus: dict[str, int], order: list[str] | None = None) -> _FakeCuda:
        fake = _FakeCuda(sms_by_bus, order or list(sms_by_bus))
        monkeypatch.setattr(discovery, "_load_cuda", lambda: fake)
        return fake
    monkeypatch.setattr(discovery, "_load_cuda", lambda: None)
    return install


def _use(monkeypatch: pytest.MonkeyPatch, cards: list[dict], **kwargs: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(cards, **kwargs))


# --------------------------------------------------------------------------------------------- the NVML API itself
def test_every_nvml_name_discovery_uses_exists_in_nvidia_ml_py() -> None:
    """The crash this guards against: ``nvmlDeviceGetNvLinkRemotePciInfo_v2`` is not in nvidia-ml-py, and
    the attribute lookup escaped the error handling on every NVLink machine."""
    tree = ast.parse(Path(discovery.__file__).read_text())
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml"}
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in used and "NVML_NVLINK_MAX_LINKS" in used
    missing = sorted(name for name in used if not hasattr(real_nvml, name))
    assert not missing, f"not in nvidia-ml-py: {missing}"


def test_the_double_refuses_names_and_arguments_the_real_module_refuses() -> None:
    with pytest.raises(AssertionError, match="nvmlDeviceGetNvLinkRemotePciInfo_v2"):
        _mirror("nvmlDeviceGetNvLinkRemotePciInfo_v2", lambda h, link: None)
    fake = _fake_pynvml([_card(0)])
    with pytest.raises(TypeError):
        fake.nvmlDeviceGetNvLinkState(_card(0))  # the link argument is missing


# --------------------------------------------------------------------------------------------- reading cards
def test_nvml_discovery_reads_every_field(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    mig = {"uuid": "MIG-a", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "mem": 20 * GiB, "bus": "", "sms": 42}
    cards = [_card(0, links=["00000000:01:00.0"], cc=(8, 0)), _card(1, links=["00000000:00:00.0"], mig=[mig], cmode=3)]
    _use(monkeypatch, cards)
    cuda({"00000000:00:00.0": 108, "00000000:01:00.0": 108})
    found = discovery.discover_nvml()
    assert [d.uuid for d in found] == ["GPU-0", "GPU-1"]
    assert found[0].model == "A100-SXM4-40GB" and found[0].sm_count == 108 and found[0].memory_total == 40 * GiB
    assert found[0].nvlink_peers == ("GPU-1",) and found[1].nvlink_peers == ("GPU-0",)
    assert found[1].mig_enabled and found[1].mig_instances[0].profile == "3g.20gb"
    assert found[1].mig_instances[0].sm_count == 42 and found[1].compute_mode == "ExclusiveProcess"
    assert found[1].numa_node == 0 and found[0].pci_bus_id == "00000000:00:00.0"
    assert found[0].compute_capability == "8.0"


def test_report_carries_driver_host_and_time(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    _use(monkeypatch, [_card(0)], driver="580.159")
    report = discovery.discover_nvml_report()
    assert report.origin == "NVML" and report.driver_version == "580.159" and report.cuda_driver_version == "13.0"
    assert report.host and report.captured.endswith("Z") and report.gpuslice_version


def test_links_to_an_nvswitch_join_the_fabric(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    switch = (SWITCH, "00000000:F0:00.0")
    cards = [_card(i, links=[switch, switch]) for i in range(3)] + [_card(3)]  # GPU 3 has no NVLink
    _use(monkeypatch, cards)
    found = discovery.discover_nvml()
    assert found[0].nvlink_peers == ("GPU-1", "GPU-2") and found[2].nvlink_peers == ("GPU-0", "GPU-1")
    assert found[3].nvlink_peers == ()


def test_a_far_end_of_unknown_type_is_not_taken_for_a_switch(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    """Old code: any far end that is not one of our GPUs meant 'NVSwitch: everyone is a peer'."""
    cards = [_card(0, links=[(None, "00000000:F0:00.0"), (None, "00000000:01:00.0")]), _card(1), _card(2)]
    _use(monkeypatch, cards)
    found = discovery.discover_nvml()
    assert found[0].nvlink_peers == ("GPU-1",) and found[1].nvlink_peers == ("GPU-0",)
    assert found[2].nvlink_peers == ()


def test_sm_count_comes_from_cuda_by_pci_bus_id_not_by_index(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    """CUDA's order is not NVML's (CUDA_VISIBLE_DEVICES, FASTEST_FIRST): two different cards, CUDA lists
    them the other way round, and one card is hidden from CUDA altogether."""
    cards = [_card(0, name="NVIDIA H100 80GB HBM3"), _card(1), _card(2)]
    _use(monkeypatch, cards)
    fake = cuda({"00000000:00:00.0": 132, "00000000:01:00.0": 108}, order=["00000000:01:00.0", "00000000:00:00.0"])
    found = discovery.discover_nvml()
    assert [d.sm_count for d in found] == [132, 108, 0]  # 0: unknown, not a neighbour's number
    assert fake.asked[0] == "0000:00:00.0"  # CUDA's spelling of the bus id


def test_mig_cards_take_sm_counts_from_nvml_and_never_ask_cuda(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    inst = [{"uuid": f"MIG-{i}", "name": "NVIDIA A100 80GB PCIe MIG 1g.10gb", "mem": 9728 * MiB, "sms": 14}
            for i in range(2)]
    _use(monkeypatch, [_card(0, mig=[inst[0], None, inst[1]])])  # slot 1 is empty
    fake = cuda({"00000000:00:00.0": 98})
    (card,) = discovery.discover_nvml()
    assert [(m.uuid, m.profile, m.sm_count, m.memory_total) for m in card.mig_instances] == [
        ("MIG-0", "1g.10gb", 14, 9728 * MiB), ("MIG-1", "1g.10gb", 14, 9728 * MiB)]
    assert card.sm_count == 0 and fake.asked == []


# --------------------------------------------------------------------------------------------- NVML errors
def test_no_driver_is_a_clear_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, [], fail_init=True)
    with pytest.raises(NoGpuError, match="no NVIDIA driver found"):
        discovery.discover_nvml()


def test_driver_without_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, [])
    with pytest.raises(NoGpuError, match="reports no GPU"):
        discovery.discover_nvml()


def test_a_failed_count_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, [_card(0)], count_error=real_nvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(discovery.NvmlError, match=r"nvmlDeviceGetCount: Insufficient Permissions"):
        discovery.discover_nvml()


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
                                  "nvmlDeviceGetName", "nvmlDeviceGetMigMode", "nvmlDeviceGetNvLinkState"])
def test_a_lost_gpu_is_reported_and_the_others_still_found(monkeypatch: pytest.MonkeyPatch, cuda, call: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cards = [_card(0), _card(1, fail={call: real_nvml.NVML_ERROR_GPU_IS_LOST}), _card(2)]
    _use(monkeypatch, cards)
    report = discovery.discover_nvml_report()
    assert [d.uuid for d in report.devices] == ["GPU-0", "GPU-2"]
    (lost,) = report.unreadable
    assert lost.index == 1 and lost.error == f"{call}: GPU is lost"
    assert lost.line().startswith("GPU 1") and "GPU is lost" in caplog.text
    assert [d.uuid for d in discovery.discover_nvml()] == ["GPU-0", "GPU-2"]


def test_optional_queries_that_are_not_supported_leave_the_gpu_readable(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    no = real_nvml.NVML_ERROR_NOT_SUPPORTED
    _use(monkeypatch, [_card(0, fail={"nvmlDeviceGetComputeMode": no, "nvmlDeviceGetNumaNodeId": no,
                                      "nvmlDeviceGetMigMode": no, "nvmlDeviceGetPciInfo": no,
                                      "nvmlDeviceGetCudaComputeCapability": no})])
    (card,) = discovery.discover_nvml()
    assert card.compute_mode == "Unknown" and not card.mig_enabled and card.pci_bus_id == ""
    assert card.compute_capability == ""


def test_a_mig_instance_that_cannot_be_read_names_its_slot(monkeypatch: pytest.MonkeyPatch, cuda) -> None:
    bad = {"uuid": "MIG-x", "name": "NVIDIA A100 80GB PCIe MIG 1g.10gb", "mem": 1, "sms": 14,
           "fail": {"nvmlDeviceGetMemoryInfo": real_nvml.NVML_ERROR_NO_PERMISSION}}
    _use(monkeypatch, [_card(0), _card(1, mig=[bad])])
    report = discovery.discover_nvml_report()
    assert report.unreadable[0].error == "MIG slot 0: nvmlDeviceGetMemoryInfo: Insufficient Permissions"
    assert report.unreadable[0].uuid == "GPU-1"


def test_no_readable_gpu_at_all_is_one_line_naming_each(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = {"nvmlDeviceGetHandleByIndex": real_nvml.NVML_ERROR_GPU_IS_LOST}
    _use(monkeypatch, [_card(0, fail=lost), _card(1, fail=lost)])
    with pytest.raises(discovery.NvmlError) as info:
        discovery.discover_nvml()
    text = str(info.value)
    assert "\n" not in text and "GPU 0: nvmlDeviceGetHandleByIndex: GPU is lost" in text and "GPU 1:" in text
    assert isinstance(info.value, NoGpuError)  # callers that fall back without a GPU (the demo) still do


def test_cli_lists_healthy_gpus_marks_the_lost_one_and_warns(monkeypatch: pytest.MonkeyPatch, cuda,
                                                            capsys: pytest.CaptureFixture) -> None:
    cards = [_card(0), _card(1, fail={"nvmlDeviceGetMemoryInfo": real_nvml.NVML_ERROR_GPU_IS_LOST}), _card(2)]
    _use(monkeypatch, cards)
    assert main(["devices"]) == 0
    out, err = capsys.readouterr()
    assert "GPU-0" in out and "GPU-2" in out and "unreadable" in out and "GPU is lost" in out
    assert "warning: GPU 1 (GPU-1, 00000000:01:00.0): nvmlDeviceGetMemoryInfo: GPU is lost" in err
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["uuid"] for d in doc["devices"]] == ["GPU-0", "GPU-2"] and doc["unreadable"][0]["index"] == 1


def test_cli_nvml_failure_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    _use(monkeypatch, [_card(0)], count_error=real_nvml.NVML_ERROR_UNKNOWN)
    assert main(["devices"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and "Traceback" not in err


def test_cli_title_names_the_real_source(monkeypatch: pytest.MonkeyPatch, cuda, capsys: pytest.CaptureFixture) -> None:
    _use(monkeypatch, [_card(0)])
    assert main(["devices"]) == 0
    assert "GPUs (NVML on " in capsys.readouterr().out
    monkeypatch.setenv(discovery.SNAPSHOT_ENV, "t4")
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "GPUs (NVML" not in out and f"bundled snapshot t4, named by {discovery.SNAPSHOT_ENV}" in out


def test_json_of_nvml_documents_itself_and_loads_back(monkeypatch: pytest.MonkeyPatch, cuda, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    _use(monkeypatch, [_card(0), _card(1)], driver="580.159")
    cuda({"00000000:00:00.0": 108, "00000000:01:00.0": 108})
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == discovery.SNAPSHOT_FORMAT and doc["driver_version"] == "580.159"
    assert doc["host"] and doc["captured"] and doc["cuda_driver_version"] == "13.0"
    path = tmp_path / "node.json"
    path.write_text(json.dumps(doc))
    report = discovery.load_snapshot_report(path)
    assert report.driver_version == "580.159" and report.captured == doc["captured"] and len(report.devices) == 2
    # a snapshot re-exported keeps its own metadata (it still describes the card it was read from)
    assert main(["devices", "--snapshot", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: again[k] for k in ("captured", "host", "driver_version")} == {k: doc[k] for k in
                                                                             ("captured", "host", "driver_version")}
    assert main(["devices", "--snapshot", str(path)]) == 0
    assert "driver 580.159" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------- snapshots
@pytest.mark.parametrize("name, sms, gib", [("h100-80gb", 132, 79.6), ("a100-80gb", 108, 80), ("a100-40gb", 108, 40),
                                             ("t4", 40, 15), ("l4", 58, 22.5), ("a100-80gb-mig", 108, 80)])
def test_bundled_snapshots_hold_real_card_numbers(name: str, sms: int, gib: float) -> None:
    found = discovery.load_snapshot(name)
    assert all(d.sm_count == sms for d in found)
    assert abs(found[0].memory_total / GiB - gib) < 0.1


def test_mig_snapshot_holds_real_a100_80gb_profiles() -> None:
    """Instance sizes as NVML reports them on an A100 80GB PCIe (nvidia-smi's MIG devices table)."""
    real = {"1g.10gb": (9728 * MiB, 14), "2g.20gb": (19968 * MiB, 28), "3g.40gb": (40192 * MiB, 42)}
    cards = discovery.load_snapshot("a100-80gb-mig")
    assert all(c.mig_enabled and c.memory_total == 81920 * MiB for c in cards)
    assert [m.profile for m in cards[0].mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [m.profile for m in cards[1].mig_instances] == ["1g.10gb"] * 7
    for m in (m for c in cards for m in c.mig_instances):
        assert (m.memory_total, m.sm_count) == real[m.profile] and m.uuid.startswith("MIG-")


def test_mig_snapshot_gives_placement_one_device_per_instance() -> None:
    from gpuslice.placement import NodeState

    cards = discovery.load_snapshot("a100-80gb-mig")
    node = NodeState.from_devices("mig-node", cards)
    instances = {m.uuid: (c, m) for c in cards for m in c.mig_instances}
    assert {d.uuid for d in node.devices} == set(instances)  # the cards themselves are not placeable
    for d in node.devices:
        card, inst = instances[d.uuid]
        assert (d.memory_total, d.sm_count, d.profile, d.parent_uuid) == (inst.memory_total, inst.sm_count,
                                                                            inst.profile, card.uuid)
        assert d.model == "A100-80GB-PCIe" and d.numa_node == card.numa_node


def test_env_snapshot_exercises_mig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(discovery.SNAPSHOT_ENV, "a100-80gb-mig")
    assert sum(len(d.mig_instances) for d in discovery.discover()) == 11


def test_snapshot_round_trips_through_json(tmp_path) -> None:
    for name in ("a100-80gb", "a100-80gb-mig"):
        found = discovery.load_snapshot(name)
        path = tmp_path / "fleet.json"
        path.write_text(json.dumps(discovery.snapshot_json(found, "test", driver_version="580.159")))
        assert discovery.load_snapshot(path) == found
        assert discovery.load_snapshot_report(path).driver_version == "580.159"


def test_old_snapshots_without_metadata_still_load() -> None:
    report = discovery.load_snapshot_report("t4")
    assert report.source.startswith("4x T4") and report.captured == "" and report.origin == "bundled snapshot t4"


def test_env_snapshot_replaces_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(discovery.SNAPSHOT_ENV, "t4")
    assert len(discovery.discover()) == 4


@pytest.mark.parametrize(
    "doc, message",
    [({"format": "other"}, "field 'format'"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": []}, "non-empty list"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": [{"uuid": "GPU-1"}]}, r"devices\[0\]: missing field"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": [{"uuid": "GPU-1", "index": 0, "name": "x",
                                                         "memory_total": -1, "sm_count": 1}]}, "memory_total"),
     ({"format": discovery.SNAPSHOT_FORMAT, "driver_version": 580, "devices": [
         {"uuid": "GPU-1", "index": 0, "name": "x", "memory_total": 1, "sm_count": 1}]}, "'driver_version'"),
     ({"format": discovery.SNAPSHOT_FORMAT, "unreadable": [{"index": "1"}], "devices": [
         {"uuid": "GPU-1", "index": 0, "name": "x", "memory_total": 1, "sm_count": 1}]}, r"unreadable\[0\]"),
     ({"format": discovery.SNAPSHOT_FORMAT, "devices": [
         {"uuid": "GPU-1", "index": 0, "name": "x", "memory_total": GiB, "sm_count": 1, "mig_enabled": True,
          "mig_instances": [{"uuid": "MIG-1", "profile": "", "memory_total": 1, "sm_count": 1}]}]},
      r"devices\[0\]: mig_instances.profile")],
)
def test_bad_snapshots_name_the_field(tmp_path, doc: dict, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match=message):
        discovery.load_snapshot(path)


def _doc(*devices: dict, **top) -> dict:
    return {"format": discovery.SNAPSHOT_FORMAT, **top, "devices": list(devices)}


def _dev(index: int = 0, **fields) -> dict:
    return {"uuid": f"GPU-{index}", "index": index, "name": "NVIDIA H100 80GB HBM3", "memory_total": 80 * GiB,
            "sm_count": 132, **fields}


@pytest.mark.parametrize("fields, field", [
    ({"name": 7}, "name"),
    ({"name": None}, "name"),
    ({"mig_enabled": "false"}, "mig_enabled"),
    ({"mig_enabled": 0}, "mig_enabled"),
    ({"nvlink_peers": "abc"}, "nvlink_peers"),
    ({"nvlink_peers": [1, 2]}, "nvlink_peers"),
    ({"numa_node": "zero"}, "numa_node"),
    ({"numa_node": -1}, "numa_node"),
    ({"compute_mode": 7}, "compute_mode"),
    ({"compute_mode": "Sometimes"}, "compute_mode"),
    ({"model": 5}, "model"),
    ({"pci_bus_id": 18}, "pci_bus_id"),
    ({"uuid": 12}, "uuid"),
])
def test_snapshot_fields_are_checked_strictly_naming_the_field(fields: dict, field: str) -> None:
    with pytest.raises(SnapshotError, match=rf"devices\[0\]: {field}:") as err:
        discovery.parse_snapshot(_doc(_dev(**fields)))
    assert "expected" in str(err.value)


def test_duplicate_device_indexes_are_refused() -> None:
    with pytest.raises(SnapshotError, match="index 0 appears more than once"):
        discovery.parse_snapshot(_doc(_dev(0), {**_dev(1), "index": 0}))
    with pytest.raises(SnapshotError, match="uuid GPU-0 appears more than once"):
        discovery.parse_snapshot(_doc(_dev(0), {**_dev(1), "uuid": "GPU-0"}))


def test_unknown_keys_are_ignored_everywhere_missing_mig_keys_are_named() -> None:
    mig = {"uuid": "MIG-1", "profile": "3g.40gb", "memory_total": 40 * GiB, "sm_count": 42, "future_key": 1}
    doc = _doc(_dev(0, mig_enabled=True, mig_instances=[mig], later_field={"x": 1}), written_by_v2=True)
    (device,) = discovery.parse_snapshot(doc)
    assert device.mig_instances[0].profile == "3g.40gb" and device.mig_enabled is True
    del mig["sm_count"]
    with pytest.raises(SnapshotError, match=r"mig_instances\[0\]: missing field\(s\) sm_count"):
        discovery.parse_snapshot(doc)


def test_unknown_snapshot_lists_the_bundled_ones() -> None:
    with pytest.raises(SnapshotError, match="bundled: a100-40gb"):
        discovery.load_snapshot("no-such-card")


@pytest.mark.gpu
def test_real_gpu_discovery_reports_memory_and_sms() -> None:
    report = discovery.discover_nvml_report()
    found = report.devices
    assert found and all(d.memory_total > GiB and d.uuid.startswith("GPU-") for d in found)
    assert all(d.sm_count > 0 for d in found if not d.mig_enabled) and report.driver_version
