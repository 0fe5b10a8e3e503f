"""Device discovery: what GPUs this node has, through NVML (``nvidia-ml-py``) or a JSON snapshot.

``discover()`` is what every part calls. It reads NVML unless ``GPUSLICE_DEVICE_SNAPSHOT`` names a
snapshot file (or a bundled snapshot name such as ``h100-80gb``): tests, the simulator and machines
without a GPU describe fleets of real card models that way.

Snapshot format (``format: gpuslice.devices/v1``)::

    {"format": "gpuslice.devices/v1", "source": "where the numbers come from",
     "devices": [{"uuid": "GPU-…", "index": 0, "name": "NVIDIA H100 80GB HBM3", "model": "H100-80GB-HBM3",
                  "memory_total": 85520809984, "sm_count": 132, "numa_node": 0,
                  "nvlink_peers": ["GPU-…"], "mig_enabled": false, "mig_instances": [],
                  "compute_mode": "Default", "pci_bus_id": "00000000:18:00.0"}]}
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from gpuslice.errors import NoGpuError, SnapshotError
from gpuslice.spec import Device, MigInstance, SpecError

SNAPSHOT_FORMAT = "gpuslice.devices/v1"
SNAPSHOT_ENV = "GPUSLICE_DEVICE_SNAPSHOT"
_COMPUTE_MODES = {0: "Default", 1: "ExclusiveThread", 2: "Prohibited", 3: "ExclusiveProcess"}
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_NVLINK_MAX_LINKS = 18


def discover() -> list[Device]:
    """The devices of this node: the snapshot named by ``GPUSLICE_DEVICE_SNAPSHOT``, else NVML."""
    snapshot = os.environ.get(SNAPSHOT_ENV)
    if snapshot:
        return load_snapshot(snapshot)
    return discover_nvml()


# --------------------------------------------------------------------------------------------- NVML
def discover_nvml() -> list[Device]:
    """Read every GPU through NVML. Raises :class:`NoGpuError` with the reason when that is impossible."""
    try:
        import pynvml
    except ImportError as exc:  # a packaging error, but say it plainly
        raise NoGpuError(f"nvidia-ml-py is not installed: {exc}") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpuError(f"no NVIDIA driver found (NVML could not start: {exc})") from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise NoGpuError("the NVIDIA driver is loaded but reports no GPU")
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_to_uuid = {_bus_id(pynvml, h): _text(pynvml.nvmlDeviceGetUUID(h)) for h in handles}
        return [_read_device(pynvml, i, h, bus_to_uuid) for i, h in enumerate(handles)]
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus_id(pynvml: Any, handle: Any) -> str:
    return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId).upper()


def _optional(call, *args, default=None):
    """NVML answers NOT_SUPPORTED for many queries on some cards (or in VMs): treat those as unknown."""
    import pynvml

    try:
        return call(*args)
    except (pynvml.NVMLError, AttributeError):
        return default


def _read_device(pynvml: Any, index: int, handle: Any, bus_to_uuid: dict[str, str]) -> Device:
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    name = _text(pynvml.nvmlDeviceGetName(handle))
    bus_id = _bus_id(pynvml, handle)
    mig_mode = _optional(pynvml.nvmlDeviceGetMigMode, handle, default=(0, 0))
    mig_enabled = bool(mig_mode and mig_mode[0])
    return Device(
        uuid=uuid,
        index=index,
        name=name,
        model=model_of(name),
        memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        sm_count=_sm_count(pynvml, handle, index),
        numa_node=_numa_node(pynvml, handle, bus_id),
        nvlink_peers=_nvlink_peers(pynvml, handle, uuid, bus_to_uuid),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(pynvml, handle) if mig_enabled else (),
        compute_mode=_COMPUTE_MODES.get(_optional(pynvml.nvmlDeviceGetComputeMode, handle, default=0), "Unknown"),
        pci_bus_id=bus_id,
    )


def model_of(name: str) -> str:
    """A short model key from the marketing name: 'NVIDIA H100 80GB HBM3' → 'H100-80GB-HBM3'."""
    short = re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())
    short = re.sub(r"^(Tesla)\s+", "", short)
    return re.sub(r"\s+", "-", short)


def _sm_count(pynvml: Any, handle: Any, index: int) -> int:
    """NVML reports the SM count only for MIG handles on most drivers; ask the CUDA driver otherwise."""
    attrs = _optional(pynvml.nvmlDeviceGetAttributes_v2, handle)
    if attrs is not None and getattr(attrs, "multiprocessorCount", 0):
        return int(attrs.multiprocessorCount)
    return _cuda_sm_count(index)


def _cuda_sm_count(index: int) -> int:
    """SM count from libcuda via ctypes; 0 (unknown) when the driver library is absent or refuses."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    device = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
        return 0
    # NVML and CUDA order devices alike only under CUDA_DEVICE_ORDER=PCI_BUS_ID; SM counts on one node
    # are almost always equal, so a mismatch would at worst swap equal numbers.
    rc = cuda.cuDeviceGetAttribute(ctypes.byref(count), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
    return count.value if rc == 0 else 0


def _numa_node(pynvml: Any, handle: Any, bus_id: str) -> int | None:
    node = _optional(getattr(pynvml, "nvmlDeviceGetNumaNodeId", None) or (lambda h: None), handle)
    if isinstance(node, int) and node >= 0:
        return node
    # sysfs spells the bus id with a 4-digit domain, lower case.
    sysfs = Path("/sys/bus/pci/devices") / bus_id.lower()[-12:] / "numa_node"
    try:
        value = int(sysfs.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _nvlink_peers(pynvml: Any, handle: Any, own_uuid: str, bus_to_uuid: dict[str, str]) -> tuple[str, ...]:
    """GPUs reachable over an active NVLink: direct links, or every GPU when a link goes to an NVSwitch."""
    peers: set[str] = set()
    via_switch = False
    for link in range(_NVLINK_MAX_LINKS):
        if _optional(pynvml.nvmlDeviceGetNvLinkState, handle, link) != 1:
            continue
        remote = _optional(pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2, handle, link)
        if remote is None:
            continue
        remote_bus = _text(remote.busId).upper()
        if remote_bus in bus_to_uuid:
            peers.add(bus_to_uuid[remote_bus])
        else:
            via_switch = True
    if via_switch:
        peers.update(bus_to_uuid.values())
    peers.discard(own_uuid)
    return tuple(sorted(peers))


def _mig_instances(pynvml: Any, handle: Any) -> tuple[MigInstance, ...]:
    found = []
    for slot in range(_optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0):
        mig = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue
        attrs = _optional(pynvml.nvmlDeviceGetAttributes_v2, mig)
        found.append(
            MigInstance(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                profile=_text(pynvml.nvmlDeviceGetName(mig)),
                memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total),
                sm_count=int(getattr(attrs, "multiprocessorCount", 0) or 0),
            )
        )
    return tuple(found)


# --------------------------------------------------------------------------------------------- snapshots
def bundled_snapshots() -> list[str]:
    """Names of the snapshots shipped with gpuslice (real card models)."""
    folder = resources.files("gpuslice.node") / "snapshots"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_snapshot(path_or_name: str | os.PathLike[str]) -> list[Device]:
    """Load devices from a snapshot file, or from a bundled snapshot by name (see bundled_snapshots)."""
    text, where = _read_snapshot_text(str(path_or_name))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{where}: not valid JSON ({exc})") from None
    return parse_snapshot(data, where)


def _read_snapshot_text(path_or_name: str) -> tuple[str, str]:
    path = Path(path_or_name)
    if path.is_file():
        return path.read_text(), str(path)
    if re.fullmatch(r"[a-z0-9-]+", path_or_name) and path_or_name in bundled_snapshots():
        resource = resources.files("gpuslice.node") / "snapshots" / f"{path_or_name}.json"
        return resource.read_text(), f"bundled snapshot {path_or_name}"
    raise SnapshotError(
        f"snapshot {path_or_name!r}: no such file and no bundled snapshot of that name "
        f"(bundled: {', '.join(bundled_snapshots())})"
    )


def parse_snapshot(data: Any, where: str = "snapshot") -> list[Device]:
    """Validate a decoded snapshot; every error names the device and field."""
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{where}: field 'format' must be {SNAPSHOT_FORMAT!r}")
    entries = data.get("devices")
    if not isinstance(entries, list) or not entries:
        raise SnapshotError(f"{where}: field 'devices' must be a non-empty list")
    devices = [_device_from_json(entry, f"{where}: devices[{i}]") for i, entry in enumerate(entries)]
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise SnapshotError(f"{where}: device UUIDs must be unique")
    return devices


def _device_from_json(entry: Any, where: str) -> Device:
    if not isinstance(entry, dict):
        raise SnapshotError(f"{where}: must be an object")
    required = ("uuid", "index", "name", "memory_total", "sm_count")
    missing = [k for k in required if k not in entry]
    if missing:
        raise SnapshotError(f"{where}: missing field(s) {', '.join(missing)}")
    try:
        migs = tuple(MigInstance(**m) for m in entry.get("mig_instances", []))
        return Device(
            uuid=entry["uuid"],
            index=entry["index"],
            name=entry["name"],
            model=entry.get("model") or model_of(entry["name"]),
            memory_total=entry["memory_total"],
            sm_count=entry["sm_count"],
            numa_node=entry.get("numa_node"),
            nvlink_peers=tuple(entry.get("nvlink_peers", ())),
            mig_enabled=bool(entry.get("mig_enabled", False)),
            mig_instances=migs,
            compute_mode=entry.get("compute_mode", "Default"),
            pci_bus_id=entry.get("pci_bus_id", ""),
        )
    except SpecError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def device_to_json(device: Device) -> dict[str, Any]:
    """The snapshot form of one device."""
    return {
        "uuid": device.uuid,
        "index": device.index,
        "name": device.name,
        "model": device.model,
        "memory_total": device.memory_total,
        "sm_count": device.sm_count,
        "numa_node": device.numa_node,
        "nvlink_peers": list(device.nvlink_peers),
        "mig_enabled": device.mig_enabled,
        "mig_instances": [m.__dict__ for m in device.mig_instances],
        "compute_mode": device.compute_mode,
        "pci_bus_id": device.pci_bus_id,
    }


def snapshot_json(devices: Iterable[Device], source: str) -> dict[str, Any]:
    """A snapshot document for ``devices``, loadable by :func:`load_snapshot`."""
    return {"format": SNAPSHOT_FORMAT, "source": source, "devices": [device_to_json(d) for d in devices]}
