"""Device discovery: what GPUs this node has, through NVML (``nvidia-ml-py``) or a JSON snapshot.

``discover()`` is what every part calls. It reads NVML unless ``GPUSLICE_DEVICE_SNAPSHOT`` names a
snapshot file (or a bundled snapshot name such as ``h100-80gb``): tests, the simulator and machines
without a GPU describe fleets of real card models that way. ``discover_report()`` gives the same
devices with where they came from (NVML on which host and driver, or which snapshot) and the GPUs
that could not be read.

A GPU that NVML cannot read (lost, no permission, …) is left out of the device list, logged, and
listed in ``Discovery.unreadable``; the other GPUs are still found. When no GPU can be read at all,
or NVML cannot even count them, discovery raises :class:`NvmlError` (one line: the GPU index, the
NVML call and NVML's error), never a traceback.

Snapshot format ``gpuslice.devices/v1`` (fields after ``source`` are optional; older documents
without them load unchanged, and readers ignore what they do not know)::

    {"format": "gpuslice.devices/v1",
     "source": "where the numbers come from (free text)",
     "captured": "2026-11-22T10:00:00Z",      # when NVML was read (UTC, ISO 8601)
     "host": "gpu-node-3",                     # the machine it was read on
     "driver_version": "580.159",              # NVML: nvmlSystemGetDriverVersion
     "cuda_driver_version": "13.0",            # NVML: nvmlSystemGetCudaDriverVersion_v2
     "nvml_version": "13.580.159",             # NVML: nvmlSystemGetNVMLVersion
     "gpuslice_version": "0.1.0",              # the gpuslice that wrote it
     "unreadable": [{"index": 3, "error": "nvmlDeviceGetMemoryInfo: GPU is lost",
                     "uuid": "GPU-…", "pci_bus_id": "00000000:9A:00.0"}],
     "devices": [{"uuid": "GPU-…", "index": 0, "name": "NVIDIA H100 80GB HBM3", "model": "H100-80GB-HBM3",
                  "memory_total": 85520809984, "sm_count": 132, "numa_node": 0,
                  "nvlink_peers": ["GPU-…"], "mig_enabled": false,
                  "mig_instances": [{"uuid": "MIG-…", "profile": "3g.40gb", "memory_total": 42144366592,
                                     "sm_count": 42}],
                  "compute_mode": "Default", "pci_bus_id": "00000000:18:00.0"}]}

Where the numbers come from on a live node: memory, names, UUIDs, MIG instances (their memory and SM
count: ``nvmlDeviceGetAttributes``), NUMA node, compute mode and NVLink from NVML. NVML has no SM count
for a full GPU, so that one comes from the CUDA driver (``libcuda`` through ctypes), looked up by the
GPU's PCI bus id — not by index, since CUDA's order differs from NVML's under ``CUDA_VISIBLE_DEVICES``
or ``CUDA_DEVICE_ORDER=FASTEST_FIRST``. A GPU hidden from this process by ``CUDA_VISIBLE_DEVICES``, and a
MIG-enabled card itself (CUDA sees only its instances), get ``sm_count`` 0 (unknown).

NVLink: a link whose far end NVML reports as a GPU of this node makes that GPU a peer; a link to an
NVSwitch joins the switch fabric, and every GPU on the fabric is a peer of every other. A far end of
unknown type that is not one of this node's GPUs is not counted.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from gpuslice.host.errors import NoGpuError, SnapshotError, SnapshotNotFound
from gpuslice.spec import Device, MigInstance, SpecError

log = logging.getLogger("gpuslice.devices")

SNAPSHOT_FORMAT = "gpuslice.devices/v1"
SNAPSHOT_ENV = "GPUSLICE_DEVICE_SNAPSHOT"
_COMPUTE_MODES = {0: "Default", 1: "ExclusiveThread", 2: "Prohibited", 3: "ExclusiveProcess"}
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_METADATA = ("captured", "host", "driver_version", "cuda_driver_version", "nvml_version", "gpuslice_version")


class NvmlError(NoGpuError):
    """NVML started but could not give a usable GPU: it could not count them, or no GPU could be read.

    A :class:`NoGpuError`, so callers that fall back when there is no GPU (the demo) still do."""


@dataclass(frozen=True)
class Unreadable:
    """A GPU that NVML counted but could not read: its index, the NVML call and error, what is known."""

    index: int
    error: str
    uuid: str = ""
    pci_bus_id: str = ""

    def line(self) -> str:
        known = ", ".join(x for x in (self.uuid, self.pci_bus_id) if x)
        return f"GPU {self.index}{f' ({known})' if known else ''}: {self.error}"


@dataclass(frozen=True)
class Discovery:
    """Devices and where they came from. ``origin``: how this listing was obtained now (``NVML``,
    ``bundled snapshot t4``); ``source``: the document's own note on where the numbers come from;
    the metadata fields are empty when unknown."""

    devices: tuple[Device, ...]
    origin: str
    source: str = ""
    unreadable: tuple[Unreadable, ...] = ()
    captured: str = ""
    host: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    nvml_version: str = ""
    gpuslice_version: str = ""

    def metadata(self) -> dict[str, str]:
        """The metadata fields that are known, by snapshot field name."""
        return {k: getattr(self, k) for k in _METADATA if getattr(self, k)}


def discover() -> list[Device]:
    """The devices of this node: the snapshot named by ``GPUSLICE_DEVICE_SNAPSHOT``, else NVML.

    GPUs that cannot be read are left out and logged (see :func:`discover_report` to list them)."""
    return list(discover_report().devices)


def discover_report() -> Discovery:
    """Like :func:`discover`, with the origin, metadata and unreadable GPUs."""
    snapshot = os.environ.get(SNAPSHOT_ENV)
    if snapshot:
        report = load_snapshot_report(snapshot)
        return replace(report, origin=f"{report.origin}, named by {SNAPSHOT_ENV}")
    return discover_nvml_report()


# --------------------------------------------------------------------------------------------- NVML
class _CallFailed(Exception):
    """An NVML call a device cannot do without failed; carries the call's name and NVML's message."""

    def __init__(self, call: str, error: Exception):
        super().__init__(f"{call}: {error}")


def discover_nvml() -> list[Device]:
    """Read every GPU through NVML. Raises :class:`NoGpuError` (or :class:`NvmlError`) with the reason
    when no GPU can be read; GPUs that cannot be read among others are logged and left out."""
    return list(discover_nvml_report().devices)


def discover_nvml_report() -> Discovery:
    """Read every GPU through NVML, with driver versions, host, time and the GPUs that could not be read."""
    try:
        import pynvml
    except ImportError as exc:  # a packaging error, but say it plainly
        raise NoGpuError(f"nvidia-ml-py is not installed: {exc}") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpuError(f"no NVIDIA driver found (NVML could not start: {exc})") from None
    try:
        return _read_node(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _read_node(pynvml: Any) -> Discovery:
    captured = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        raise NvmlError(f"NVML started but could not count the GPUs (nvmlDeviceGetCount: {exc})") from None
    if count == 0:
        raise NoGpuError("the NVIDIA driver is loaded but reports no GPU")
    cards: list[_Card] = []
    unreadable: list[Unreadable] = []
    for index in range(count):
        partial: dict[str, str] = {}
        try:
            cards.append(_read_card(pynvml, index, partial))
        except _CallFailed as exc:
            unreadable.append(Unreadable(index, str(exc), partial.get("uuid", ""), partial.get("bus", "")))
    if not cards:
        raise NvmlError("no GPU could be read through NVML: " + "; ".join(u.line() for u in unreadable))
    for u in unreadable:
        log.warning("GPU left out, NVML cannot read it: %s", u.line())
    peers = _nvlink_peers(cards)
    cuda = _CudaSms()
    devices = tuple(
        replace(c.device, nvlink_peers=peers.get(c.device.uuid, ()),
                sm_count=c.device.sm_count or (0 if c.device.mig_enabled else cuda.by_bus_id(c.device.pci_bus_id)))
        for c in cards
    )
    cuda_version = _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion_v2)
    return Discovery(
        devices=devices,
        origin="NVML",
        source="NVML",
        unreadable=tuple(unreadable),
        captured=captured,
        host=socket.gethostname(),
        driver_version=_text(_optional(pynvml, pynvml.nvmlSystemGetDriverVersion, default="")),
        cuda_driver_version=f"{cuda_version // 1000}.{cuda_version % 1000 // 10}" if cuda_version else "",
        nvml_version=_text(_optional(pynvml, pynvml.nvmlSystemGetNVMLVersion, default="")),
        gpuslice_version=_gpuslice_version(),
    )


def _gpuslice_version() -> str:
    from gpuslice import __version__

    return __version__


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _norm_bus_id(value: str | bytes) -> str:
    """NVML's 8-hex-digit domain form, upper case: '0000:18:00.0' and '00000000:18:00.0' compare equal."""
    text = _text(value).strip().upper()
    m = re.fullmatch(r"([0-9A-F]+):([0-9A-F]{2}):([0-9A-F]{2})\.([0-9A-F])", text)
    return f"{int(m[1], 16):08X}:{m[2]}:{m[3]}.{m[4]}" if m else text


def _required(pynvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """An NVML call the device cannot be described without: its failure makes the device unreadable."""
    try:
        return call(*args)
    except pynvml.NVMLError as exc:
        raise _CallFailed(call.__name__, exc) from None


def _optional(pynvml: Any, call: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """A query NVML may not answer (NOT_SUPPORTED on some cards, in VMs, an older driver): unknown then.
    A lost GPU is not 'unknown': that error makes the device unreadable."""
    try:
        return call(*args)
    except pynvml.NVMLError as exc:
        if getattr(exc, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _CallFailed(call.__name__, exc) from None
        return default


@dataclass
class _Card:
    device: Device
    gpu_links: set[str] = field(default_factory=set)  # bus ids of GPUs at the far end of active links
    unknown_links: set[str] = field(default_factory=set)  # far ends of unknown type
    on_switch: bool = False


def _read_card(pynvml: Any, index: int, partial: dict[str, str]) -> _Card:
    handle = _required(pynvml, pynvml.nvmlDeviceGetHandleByIndex, index)
    uuid = _text(_required(pynvml, pynvml.nvmlDeviceGetUUID, handle))
    partial["uuid"] = uuid
    pci = _optional(pynvml, pynvml.nvmlDeviceGetPciInfo, handle)
    bus_id = _norm_bus_id(pci.busId) if pci is not None else ""
    partial["bus"] = bus_id
    name = _text(_required(pynvml, pynvml.nvmlDeviceGetName, handle))
    memory_total = int(_required(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle).total)
    mig_mode = _optional(pynvml, pynvml.nvmlDeviceGetMigMode, handle, default=(0, 0))
    mig_enabled = bool(mig_mode and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
    compute_mode = _optional(pynvml, pynvml.nvmlDeviceGetComputeMode, handle, default=None)
    card = _Card(Device(
        uuid=uuid,
        index=index,
        name=name,
        model=model_of(name),
        memory_total=memory_total,
        sm_count=_nvml_sm_count(pynvml, handle),
        numa_node=_numa_node(pynvml, handle, bus_id),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(pynvml, handle) if mig_enabled else (),
        compute_mode="Unknown" if compute_mode is None else _COMPUTE_MODES.get(compute_mode, "Unknown"),
        pci_bus_id=bus_id,
        compute_capability=_compute_capability(pynvml, handle),
    ))
    _read_links(pynvml, handle, card)
    return card


def _compute_capability(pynvml: Any, handle: Any) -> str:
    """``"9.0"`` from ``nvmlDeviceGetCudaComputeCapability``; "" when NVML does not say (an older binding)."""
    call = getattr(pynvml, "nvmlDeviceGetCudaComputeCapability", None)
    found = _optional(pynvml, call, handle) if call is not None else None
    return f"{int(found[0])}.{int(found[1])}" if found else ""


def model_of(name: str) -> str:
    """A short model key from the marketing name: 'NVIDIA H100 80GB HBM3' → 'H100-80GB-HBM3'."""
    short = re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())
    short = re.sub(r"^(Tesla)\s+", "", short)
    return re.sub(r"\s+", "-", short)


def mig_profile_of(name: str) -> str:
    """The profile from a MIG device's NVML name: 'NVIDIA A100-SXM4-80GB MIG 3g.40gb' → '3g.40gb'."""
    m = re.search(r"\bMIG\s+(\S+)\s*$", name)
    return m[1] if m else name.strip()


def _nvml_sm_count(pynvml: Any, handle: Any) -> int:
    """NVML's SM count (``nvmlDeviceGetAttributes``): given for MIG devices; most drivers refuse it for a
    full GPU (0 then, and the CUDA driver is asked by PCI bus id)."""
    attrs = _optional(pynvml, pynvml.nvmlDeviceGetAttributes_v2, handle)
    return int(getattr(attrs, "multiprocessorCount", 0) or 0) if attrs is not None else 0


class _CudaSms:
    """SM counts from libcuda (ctypes), by PCI bus id; 0 (unknown) when the library is absent or refuses."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._tried = False

    def _load(self) -> Any:
        if not self._tried:
            self._tried = True
            lib = _load_cuda()
            if lib is not None and lib.cuInit(0) == 0:
                self._lib = lib
        return self._lib

    def by_bus_id(self, bus_id: str) -> int:
        m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])", bus_id or "")
        lib = self._load() if m else None
        if lib is None:
            return 0
        assert m is not None
        cuda_bus_id = f"{int(m[1], 16):04x}:{m[2].lower()}".encode()  # CUDA's form: 0000:18:00.0
        device = ctypes.c_int(0)
        if lib.cuDeviceGetByPCIBusId(ctypes.byref(device), cuda_bus_id) != 0:
            return 0  # e.g. hidden from this process by CUDA_VISIBLE_DEVICES
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetAttribute(ctypes.byref(count), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
        return count.value if rc == 0 and count.value > 0 else 0


def _load_cuda() -> Any:
    """The CUDA driver library, or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def _numa_node(pynvml: Any, handle: Any, bus_id: str) -> int | None:
    node = _optional(pynvml, pynvml.nvmlDeviceGetNumaNodeId, handle)
    if isinstance(node, int) and node >= 0:
        return node
    if not bus_id:
        return None
    # sysfs spells the bus id with a 4-digit domain, lower case.
    sysfs = Path("/sys/bus/pci/devices") / bus_id.lower()[-12:] / "numa_node"
    try:
        value = int(sysfs.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _read_links(pynvml: Any, handle: Any, card: _Card) -> None:
    """Record where each active NVLink goes: a GPU (by bus id), an NVSwitch, or a far end of unknown type."""
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _optional(pynvml, pynvml.nvmlDeviceGetNvLinkState, handle, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        kind = _optional(pynvml, pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            card.on_switch = True
            continue
        if kind not in (None, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
            continue  # e.g. an IBM NPU: a CPU, not a peer
        remote = _optional(pynvml, pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if remote is None:
            continue
        target = card.gpu_links if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU else card.unknown_links
        target.add(_norm_bus_id(remote.busId))


def _nvlink_peers(cards: list[_Card]) -> dict[str, tuple[str, ...]]:
    """Peers of each GPU: direct GPU links (either direction), plus every other GPU of the NVSwitch fabric."""
    by_bus = {c.device.pci_bus_id: c.device.uuid for c in cards if c.device.pci_bus_id}
    fabric = {c.device.uuid for c in cards if c.on_switch}
    peers: dict[str, set[str]] = {c.device.uuid: set() for c in cards}
    for c in cards:
        for bus in c.gpu_links | c.unknown_links:
            other = by_bus.get(bus)
            if other is not None:
                peers[c.device.uuid].add(other)
                peers[other].add(c.device.uuid)
        if c.device.uuid in fabric:
            peers[c.device.uuid] |= fabric
    return {uuid: tuple(sorted(p - {uuid})) for uuid, p in peers.items()}


def _mig_instances(pynvml: Any, handle: Any) -> tuple[MigInstance, ...]:
    found = []
    for slot in range(_optional(pynvml, pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue  # an empty slot
            raise _CallFailed(f"MIG slot {slot}: nvmlDeviceGetMigDeviceHandleByIndex", exc) from None
        try:
            found.append(MigInstance(
                uuid=_text(_required(pynvml, pynvml.nvmlDeviceGetUUID, mig)),
                profile=mig_profile_of(_text(_required(pynvml, pynvml.nvmlDeviceGetName, mig))),
                memory_total=int(_required(pynvml, pynvml.nvmlDeviceGetMemoryInfo, mig).total),
                sm_count=_nvml_sm_count(pynvml, mig),
            ))
        except _CallFailed as exc:
            raise _CallFailed(f"MIG slot {slot}", exc) from None  # type: ignore[arg-type]
    return tuple(found)


# --------------------------------------------------------------------------------------------- snapshots
def bundled_snapshots() -> list[str]:
    """Names of the snapshots shipped with gpuslice (real card models)."""
    folder = resources.files("gpuslice.host") / "snapshots"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_snapshot(path_or_name: str | os.PathLike[str]) -> list[Device]:
    """Load devices from a snapshot file, or from a bundled snapshot by name (see bundled_snapshots)."""
    return list(load_snapshot_report(path_or_name).devices)


def load_snapshot_report(path_or_name: str | os.PathLike[str]) -> Discovery:
    """Load a snapshot with its metadata; ``origin`` says which file or bundled name it was."""
    text, where = _read_snapshot_text(str(path_or_name))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{where}: not valid JSON ({exc})") from None
    return parse_snapshot_report(data, where)


def _read_snapshot_text(path_or_name: str) -> tuple[str, str]:
    path = Path(path_or_name)
    if path.is_file():
        return path.read_text(), f"snapshot {path}"
    if re.fullmatch(r"[a-z0-9-]+", path_or_name) and path_or_name in bundled_snapshots():
        resource = resources.files("gpuslice.host") / "snapshots" / f"{path_or_name}.json"
        return resource.read_text(), f"bundled snapshot {path_or_name}"
    raise SnapshotNotFound(
        f"snapshot {path_or_name!r} not found: no such file and no bundled snapshot of that name "
        f"(bundled: {', '.join(bundled_snapshots())})"
    )


def parse_snapshot(data: Any, where: str = "snapshot") -> list[Device]:
    """Validate a decoded snapshot; every error names the device and field."""
    return list(parse_snapshot_report(data, where).devices)


def parse_snapshot_report(data: Any, where: str = "snapshot") -> Discovery:
    """Validate a decoded snapshot with its optional metadata; every error names the field."""
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{where}: field 'format' must be {SNAPSHOT_FORMAT!r}")
    entries = data.get("devices")
    if not isinstance(entries, list) or not entries:
        raise SnapshotError(f"{where}: field 'devices' must be a non-empty list")
    devices = [_device_from_json(entry, f"{where}: devices[{i}]") for i, entry in enumerate(entries)]
    for key in ("uuid", "index"):
        values = [getattr(d, key) for d in devices]
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            raise SnapshotError(f"{where}: devices: {key} {', '.join(map(str, repeated))} appears more than once; "
                                f"each device needs its own {key}")
    meta = {}
    for key in ("source", *_METADATA):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise SnapshotError(f"{where}: field {key!r} must be a string")
        meta[key] = value or ""
    return Discovery(devices=tuple(devices), origin=where, unreadable=_unreadable_from_json(data, where), **meta)


def _unreadable_from_json(data: dict[str, Any], where: str) -> tuple[Unreadable, ...]:
    entries = data.get("unreadable", [])
    if not isinstance(entries, list):
        raise SnapshotError(f"{where}: field 'unreadable' must be a list")
    found = []
    for i, entry in enumerate(entries):
        ok = (isinstance(entry, dict) and isinstance(entry.get("index"), int) and not isinstance(entry["index"], bool)
              and isinstance(entry.get("error"), str)
              and all(isinstance(entry.get(k, ""), str) for k in ("uuid", "pci_bus_id")))
        if not ok:
            raise SnapshotError(f"{where}: unreadable[{i}]: must be an object with index (number), error, "
                                "and optionally uuid and pci_bus_id (strings)")
        found.append(Unreadable(entry["index"], entry["error"], entry.get("uuid", ""), entry.get("pci_bus_id", "")))
    return tuple(found)


def _device_from_json(entry: Any, where: str) -> Device:
    """One device of a snapshot. Unknown keys are ignored (forward compatibility); known ones are checked
    strictly — ``"false"`` is not a boolean, ``"abc"`` is not a list of peers — by :class:`Device`."""
    if not isinstance(entry, dict):
        raise SnapshotError(f"{where}: must be an object")
    required = ("uuid", "index", "name", "memory_total", "sm_count")
    missing = [k for k in required if k not in entry]
    if missing:
        raise SnapshotError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(entry["name"], str):
        raise SnapshotError(f"{where}: name: {entry['name']!r} is not allowed; expected a string")
    peers = entry.get("nvlink_peers", [])
    if not isinstance(peers, list):
        raise SnapshotError(f"{where}: nvlink_peers: {peers!r} is not allowed; expected a list of device UUIDs")
    try:
        return Device(
            uuid=entry["uuid"],
            index=entry["index"],
            name=entry["name"],
            model=entry.get("model") or model_of(entry["name"]),
            memory_total=entry["memory_total"],
            sm_count=entry["sm_count"],
            numa_node=entry.get("numa_node"),
            nvlink_peers=tuple(peers),
            mig_enabled=entry.get("mig_enabled", False),
            mig_instances=_migs_from_json(entry.get("mig_instances", []), where),
            compute_mode=entry.get("compute_mode", "Default"),
            pci_bus_id=entry.get("pci_bus_id", ""),
            compute_capability=entry.get("compute_capability", ""),
        )
    except SpecError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _migs_from_json(raw: Any, where: str) -> tuple[MigInstance, ...]:
    """MIG instances: the four known keys of each (unknown ones ignored, missing ones named)."""
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise SnapshotError(f"{where}: mig_instances must be a list of objects")
    keys = ("uuid", "profile", "memory_total", "sm_count")
    found = []
    for i, m in enumerate(raw):
        missing = [k for k in keys if k not in m]
        if missing:
            raise SnapshotError(f"{where}: mig_instances[{i}]: missing field(s) {', '.join(missing)}")
        found.append(MigInstance(**{k: m[k] for k in keys}))
    return tuple(found)


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
        "compute_capability": device.compute_capability,
    }


def snapshot_json(devices: Iterable[Device], source: str, *, unreadable: Iterable[Unreadable] = (),
                  **metadata: str) -> dict[str, Any]:
    """A snapshot document for ``devices``, loadable by :func:`load_snapshot`. ``metadata``: any of
    captured, host, driver_version, cuda_driver_version, nvml_version, gpuslice_version (empty ones are left out)."""
    unknown = sorted(set(metadata) - set(_METADATA))
    if unknown:
        raise TypeError(f"snapshot_json: unknown metadata {', '.join(unknown)}")
    doc: dict[str, Any] = {"format": SNAPSHOT_FORMAT, "source": source}
    doc.update({k: metadata[k] for k in _METADATA if metadata.get(k)})
    lost = [{k: v for k, v in u.__dict__.items() if v != ""} for u in unreadable]
    if lost:
        doc["unreadable"] = lost
    doc["devices"] = [device_to_json(d) for d in devices]
    return doc


def report_json(report: Discovery) -> dict[str, Any]:
    """The snapshot document of a discovery: devices, unreadable GPUs and every known metadata field."""
    return snapshot_json(report.devices, report.source or report.origin, unreadable=report.unreadable,
                         **report.metadata())
