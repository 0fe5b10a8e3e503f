"""The device plugin (kubelet device-plugin API v1beta1 over gRPC on a Unix socket).

* Advertises ``<resource>`` (``nvidia.com/gpu`` by default) as devices × split count: IDs ``<UUID>::<k>``,
  with each device's NUMA node and health. Health comes from an injectable :class:`HealthSource`
  (:class:`NvmlHealth` on real nodes: critical XID events and devices that stop answering NVML).
* ``GetPreferredAllocation`` steers the kubelet towards IDs on the UUIDs the scheduler granted.
* ``Allocate`` finds the container's grant (see :meth:`Allocator.find`), writes its slice file and returns:
  the slice file mounted read-only at ``/etc/gpuslice/slice``, this grant's region folder (read-write: the
  enforcer's shared memory accounting), a per-grant device-state folder with the node-wide pacing files of
  the granted devices only (``<uuid>.dev``, read-write: the pacer coordinates through them), the enforcer
  library and an ``/etc/ld.so.preload`` naming it (both read-only), ``NVIDIA_VISIBLE_DEVICES`` with the
  granted UUIDs, ``GPUSLICE_SLICE``/``GPUSLICE_GRANT``, and the device nodes. No process of the container
  can pass its limits: the enforcer holds every process to the read-only slice file's limit whatever the
  region says, and environment variables may only lower it. What a container can still disturb (its own region, the pacing files of its devices) is listed
  under "Known limits" in ``src/gpuslice/kube/README.md``.
* ``PreStartContainer`` is not used: the plugin registers with ``pre_start_required: false`` (everything a
  container needs is in the Allocate answer), so the kubelet never calls it; it answers empty if called.
* Registers with the kubelet (``kubelet.sock``) and registers again when the kubelet restarts (it deletes
  every socket in the device-plugin folder, ours included, and recreates its own).

Finding the grant: the kubelet names device IDs only, never the pod. Candidates are the pending pods
bound to this node whose ledger entry (the Node's ``gpuslice.io/ledger``, written only by the extender)
has a container not yet marked in the pod's ``gpuslice.io/allocated``, whose device count equals the
number of IDs asked for. The candidates must all belong to **one** pod: the extender's allocation lock
(:mod:`gpuslice.kube.alloclock`) binds at most one pod per device count at a time on a node, and if two
pods wait anyway (the lock timed out or is off) Allocate refuses rather than guess — handing one pod
another's grant would over-commit the device once either ends. Within the pod, the kubelet allocates
containers in spec order: the container whose granted UUIDs equal the IDs' UUIDs (GetPreferredAllocation
steers to them), else the first in spec order. Once every container of the pod is allocated, the pod is
removed from the Node's ``gpuslice.io/allocating`` (the lock is released). The ledger is the truth; a
pod annotation that disagrees is ignored and logged.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import grpc

from gpuslice.atomicfile import write_atomic
from gpuslice.errors import GpusliceError
from gpuslice.kube import codec
from gpuslice.kube.api import Conflict, KubeAPI, KubeError, update_node_annotations
from gpuslice.kube.deviceplugin import load
from gpuslice.kube.health import APPLICATION_XIDS, NvmlHealth  # noqa: F401  (re-exported)
from gpuslice.node.slicefile import SliceConfig, SliceFileError, write_slice_file
from gpuslice.spec import Device

log = logging.getLogger("gpuslice.deviceplugin")

API_VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
ID_SEP = "::"

# Container-side paths (the slice file names them, so they are fixed for every pod).
CONTAINER_SLICE = "/etc/gpuslice/slice"
CONTAINER_REGION_DIR = "/var/run/gpuslice/region"
CONTAINER_DEVICE_STATE = "/var/run/gpuslice/devices"
CONTAINER_LIB = "/usr/local/gpuslice/lib/libgpuslice.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class AllocateError(GpusliceError):
    """Allocate cannot answer (no grant found, unreadable ledger); the kubelet fails the pod with this."""


# ---------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class PluginConfig:
    node: str
    resource_name: str = "nvidia.com/gpu"
    split_count: int = 10
    memory_scaling: float = 1.0
    plugin_dir: Path = DEVICE_PLUGIN_PATH
    socket_name: str = "gpuslice.sock"
    host_state_dir: Path = Path("/var/lib/gpuslice")  # as the host sees it (the kubelet mounts host paths)
    local_state_dir: Path | None = None               # where this process sees it (defaults to the same)
    host_library: Path = Path("/usr/local/gpuslice/lib/libgpuslice.so")
    device_nodes: str = "auto"                        # auto: the ones that exist; always; none
    dev_root: Path = Path("/")
    oom_policy: str = "return"
    log_level: str = "warn"                           # the enforcer's: error, warn, info, debug
    fail_open: bool = False
    watch_interval: float = 1.0                       # how often the kubelet socket is checked

    def __post_init__(self) -> None:
        if self.device_nodes not in ("auto", "always", "none"):
            raise codec.SpecError("device_nodes", self.device_nodes, "auto, always or none")
        if self.oom_policy not in ("return", "kill"):
            raise codec.SpecError("oom_policy", self.oom_policy, "return or kill")
        if self.log_level not in ("error", "warn", "info", "debug"):
            raise codec.SpecError("log_level", self.log_level, "error, warn, info or debug (the enforcer's)")
        if not isinstance(self.fail_open, bool):
            raise codec.SpecError("fail_open", self.fail_open, "true or false")
        if not 1 <= self.split_count <= 1000:
            raise codec.SpecError("split_count", self.split_count, "a whole number from 1 to 1000")

    @property
    def local_state(self) -> Path:
        return self.local_state_dir or self.host_state_dir

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET


def device_id(uuid: str, k: int) -> str:
    return f"{uuid}{ID_SEP}{k}"


def uuid_of(device_id_: str) -> str:
    return device_id_.split(ID_SEP, 1)[0]


# ---------------------------------------------------------------------------------------- health
class HealthSource(Protocol):
    """Reports device health changes: call ``report(uuid, healthy, reason)``; return when ``stop`` is set.
    ``devices`` is a callable returning the plugin's current devices (or, for callers outside the plugin,
    a plain list: :func:`gpuslice.kube.health.current_devices` reads both)."""

    def run(self, devices: Any, report: Callable[[str, bool, str], None],
            stop: threading.Event) -> None: ...


class StaticHealth:
    """No events: every device stays as it is (tests change health with :meth:`DevicePlugin.set_health`)."""

    def run(self, devices, report, stop) -> None:
        stop.wait()


# ---------------------------------------------------------------------------------------- allocation
@dataclass(frozen=True)
class Match:
    pod: dict[str, Any]
    entry: codec.PodGrant
    grant: codec.ContainerGrant


class Allocator:
    """Finds the grant behind an Allocate / GetPreferredAllocation call and prepares its files."""

    def __init__(self, api: KubeAPI, cfg: PluginConfig, devices: Callable[[], Sequence[Device]]):
        self.api = api
        self.cfg = cfg
        self.devices = devices
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ finding
    def candidates(self, count: int) -> list[Match]:
        node = self.api.get_node(self.cfg.node)
        anns = (node.get("metadata") or {}).get("annotations") or {}
        ledger = codec.decode_ledger(anns.get(codec.NODE_LEDGER), self.cfg.node)
        pods = self.api.list_pods(field_selector=f"spec.nodeName={self.cfg.node}")
        out = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            entry = ledger.entries.get(meta.get("uid", ""))
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if entry is None or phase not in ("Pending", "") or meta.get("deletionTimestamp"):
                continue
            pod_anns = meta.get("annotations") or {}
            try:
                done = codec.decode_allocated(pod_anns.get(codec.POD_ALLOCATED))
            except codec.SpecError as exc:
                log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
                done = set()
            if codec.POD_GRANT in pod_anns:
                try:
                    shown = codec.decode_pod_grant(pod_anns[codec.POD_GRANT])
                    if shown.containers != entry.containers:
                        log.warning("pod %s/%s: its %s differs from the node ledger; using the ledger",
                                    meta.get("namespace"), meta.get("name"), codec.POD_GRANT)
                except codec.SpecError as exc:
                    log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
            order = {c.get("name"): i for i, c in enumerate((pod.get("spec") or {}).get("containers") or [])}
            for g in sorted(entry.containers, key=lambda c: order.get(c.container, 1 << 30)):
                if g.container not in done and len(g.slices) == count:
                    out.append(Match(pod, entry, g))
        out.sort(key=lambda m: m.entry.bound_at)  # stable: container order within a pod
        return out

    def find(self, ids: Sequence[str]) -> Match:
        uuids = {uuid_of(i) for i in ids}
        found = self.one_pod(self.candidates(len(ids)), len(ids))
        for m in found:
            if set(m.grant.uuids) == uuids:
                return m
        if found:
            return found[0]
        raise AllocateError(
            f"no gpuslice grant on node {self.cfg.node} waits for a container with {len(ids)} device(s); pods asking "
            f"for {self.cfg.resource_name} must be scheduled by the gpuslice scheduler (check the pod's "
            f"spec.schedulerName and its {codec.POD_GRANT} annotation)")

    def one_pod(self, found: list[Match], count: int) -> list[Match]:
        """``found`` when every candidate belongs to one pod; else :class:`AllocateError` (ambiguous)."""
        pods = {m.entry.pod_uid: m.entry for m in found}
        if len(pods) <= 1:
            return found
        names = ", ".join(f"{e.namespace}/{e.pod}" for e in sorted(pods.values(), key=lambda e: e.bound_at))
        raise AllocateError(
            f"cannot tell which pod the kubelet is admitting: pods {names} on node {self.cfg.node} all wait for "
            f"a container of {count} device(s) (the kubelet names devices, not pods); refusing rather than "
            f"handing one pod another's grant. The scheduler's allocation lock ({codec.NODE_ALLOCATING}) "
            f"prevents this unless it timed out or is off (gpuslice scheduler --allocation-timeout)")

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        chosen: list[str] = list(must)[:size]
        try:
            found = self.one_pod(self.candidates(size), size)
        except (KubeError, codec.SpecError, AllocateError) as exc:
            log.warning("GetPreferredAllocation: %s", exc)
            found = []
        want = found[0].grant.uuids if found else ()
        for uuid in want:
            if len(chosen) >= size:
                break
            if any(uuid_of(c) == uuid for c in chosen):
                continue
            for i in available:
                if uuid_of(i) == uuid and i not in chosen:
                    chosen.append(i)
                    break
        for i in available:  # fill up (no grant known, or its IDs are taken): distinct devices first
            if len(chosen) >= size:
                break
            if i not in chosen and all(uuid_of(c) != uuid_of(i) for c in chosen):
                chosen.append(i)
        for i in available:
            if len(chosen) >= size:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen[:size]

    # ------------------------------------------------------------------------------------ files
    def slice_config(self, grant: codec.ContainerGrant) -> "SliceConfig":
        """The grant as the enforcer's slice file (paths as the container sees them)."""
        first = grant.slices[0]
        return SliceConfig(
            devices=grant.uuids, memory_limit=first.memory_limit,
            memory_limits={s.device_uuid: s.memory_limit for s in grant.slices}, grant=grant.grant_id,
            compute=first.compute, mode=first.mode.value, weight=first.weight, priority=int(first.priority),
            region=f"{CONTAINER_REGION_DIR}/region", device_state_dir=CONTAINER_DEVICE_STATE,
            oom_policy=self.cfg.oom_policy, log_level=self.cfg.log_level, fail_open=self.cfg.fail_open)

    def paths(self, grant_id: str, local: bool) -> dict[str, Path]:
        state = self.cfg.local_state if local else self.cfg.host_state_dir
        root = state / "kube"
        return {"slice": root / "grants" / grant_id / "slice", "region": root / "regions" / grant_id,
                "devstate": root / "grants" / grant_id / "devices", "devices": state / "devices",
                "preload": root / "ld.so.preload"}

    @staticmethod
    def state_files(grant: codec.ContainerGrant) -> list[str]:
        """Names of the pacing files (``<name>.dev`` in the device-state folder) the enforcer opens for the
        grant's devices: the pacer names them after ``cuDeviceGetUuid_v2`` printed as ``GPU-<hex>``, which
        for a MIG instance is its own UUID (``MIG-<hex>`` in NVML)."""
        out = []
        for uuid in grant.uuids:
            name = "GPU-" + uuid[4:] if re.fullmatch(r"MIG-[0-9a-fA-F-]{36}", uuid) else uuid
            if name not in out and "/" not in name:
                out.append(name)
        return out

    def write_files(self, grant: codec.ContainerGrant) -> None:
        local = self.paths(grant.grant_id, local=True)
        local["slice"].parent.mkdir(parents=True, exist_ok=True)
        write_slice_file(local["slice"], self.slice_config(grant))
        for folder in (local["region"], local["devstate"], local["devices"]):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o1777)  # the container's processes may run as any user
        for name in self.state_files(grant):
            # Shared by every slice on the device; the enforcer sizes and initialises an empty one. It
            # must exist before the kubelet bind-mounts it, and is never replaced (the mount holds the inode).
            path = local["devices"] / f"{name}.dev"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                os.fchmod(fd, 0o666)
            finally:
                os.close(fd)
        text = CONTAINER_LIB + "\n"
        if not local["preload"].exists() or local["preload"].read_text() != text:
            write_atomic(local["preload"], text, 0o644)

    def response(self, grant: codec.ContainerGrant) -> dict[str, Any]:
        """The ContainerAllocateResponse as plain data (envs, mounts, devices). Mounts, in order (the
        container runtime mounts parents before children):

        * the slice file, read-only — what configures the enforcer;
        * this grant's region folder, read-write — the enforcer's shared memory accounting of this slice;
        * this grant's own device-state folder, read-write (empty; the pacer checks it is writable), and in
          it the node-wide pacing file of each granted device, read-write — not the node's whole folder, so
          a container sees no other device's pacing state;
        * the enforcer library and ``/etc/ld.so.preload``, read-only.
        """
        host = self.paths(grant.grant_id, local=False)
        mounts = [
            (CONTAINER_SLICE, str(host["slice"]), True),
            (CONTAINER_REGION_DIR, str(host["region"]), False),
            (CONTAINER_DEVICE_STATE, str(host["devstate"]), False),
            *[(f"{CONTAINER_DEVICE_STATE}/{name}.dev", str(host["devices"] / f"{name}.dev"), False)
              for name in self.state_files(grant)],
            (CONTAINER_LIB, str(self.cfg.host_library), True),
            (CONTAINER_PRELOAD, str(host["preload"]), True),
        ]
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(grant.uuids), "GPUSLICE_SLICE": CONTAINER_SLICE,
                "GPUSLICE_GRANT": grant.grant_id}
        return {"envs": envs, "mounts": mounts, "devices": self.device_nodes(grant)}

    def device_nodes(self, grant: codec.ContainerGrant) -> list[str]:
        if self.cfg.device_nodes == "none":
            return []
        by_uuid: dict[str, Device] = {}
        for d in self.devices():
            by_uuid[d.uuid] = d
            for m in d.mig_instances:
                by_uuid[m.uuid] = d
        nodes = list(CONTROL_DEVICES)
        for uuid in grant.uuids:
            d = by_uuid.get(uuid)
            if d is not None:
                minor = d.extra.get("minor", d.index) if isinstance(d.extra, dict) else d.index
                nodes.append(f"/dev/nvidia{minor}")
        if self.cfg.device_nodes == "always":
            return nodes
        root = self.cfg.dev_root
        return [n for n in nodes if (root / n.lstrip("/")).exists()]

    def allocate(self, ids: Sequence[str]) -> tuple[Match, dict[str, Any]]:
        with self._lock:  # one Allocate at a time: the "allocated" marks must not interleave
            match = self.find(ids)
            self.write_files(match.grant)
            meta = match.pod["metadata"]
            done = codec.decode_allocated(((meta.get("annotations") or {}).get(codec.POD_ALLOCATED)))
            done.add(match.grant.container)
            self.api.patch_pod_annotations(meta["namespace"], meta["name"],
                                           {codec.POD_ALLOCATED: codec.encode_allocated(done)}, uid=meta["uid"])
            if {c.container for c in match.entry.containers} <= done:
                self.release_lock(match.entry.pod_uid)
            return match, self.response(match.grant)

    def release_lock(self, pod_uid: str, attempts: int = 8) -> bool:
        """Remove the pod from the Node's ``gpuslice.io/allocating`` (resourceVersion-conditioned, retried on
        conflicts). A failure is logged, not raised: the Allocate answer stands, and the extender drops
        holders whose pod is allocated (at its next bind on this node, or garbage collection)."""
        def drop(anns: Mapping[str, str]) -> dict[str, str | None]:
            holders = codec.decode_allocating(anns.get(codec.NODE_ALLOCATING))
            return {codec.NODE_ALLOCATING: codec.encode_allocating(holders - {pod_uid})} if pod_uid in holders else {}

        try:
            update_node_annotations(self.api, self.cfg.node, drop, attempts)
            return True
        except Conflict:
            log.warning("releasing the allocation lock of pod %s on %s: the node kept changing", pod_uid, self.cfg.node)
        except (KubeError, codec.SpecError) as exc:
            log.warning("releasing the allocation lock of pod %s on %s: %s", pod_uid, self.cfg.node, exc)
        return False


# ---------------------------------------------------------------------------------------- gRPC
class DevicePlugin:
    """The plugin's state and its gRPC server; :meth:`run` keeps it registered until ``stop()``."""

    def __init__(self, cfg: PluginConfig, devices: Sequence[Device], api: KubeAPI | None, *,
                 health: HealthSource | None = None, on_health: Callable[[dict[str, str]], None] | None = None,
                 on_devices: Callable[[list[Device], dict[str, str]], None] | None = None):
        self.cfg = cfg
        self._devices = list(devices)
        self.api = api
        self.health_source = health or StaticHealth()
        self.on_health = on_health
        self.on_devices = on_devices  # called with (devices, health) after a discovery changed the list
        self._vanished: set[str] = set()  # listed devices the last discovery did not find
        self._faulty: set[str] = set()    # devices the health source reported unhealthy
        self._health = {d.uuid: codec.HEALTHY for d in devices}
        self._cond = threading.Condition()
        self._version = 0
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self.registrations = 0
        self.allocator = Allocator(api, cfg, self.devices) if api is not None else None
        self._health_thread: threading.Thread | None = None
        self.pb2, self.pb2_grpc = load()

    # ------------------------------------------------------------------------------------ health
    @property
    def health(self) -> dict[str, str]:
        with self._cond:
            return dict(self._health)

    def _state(self, uuid: str) -> str:
        return codec.UNHEALTHY if uuid in self._faulty or uuid in self._vanished else codec.HEALTHY

    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> None:
        """What the health source says about a device. A device is Unhealthy while the health source says
        so *or* discovery no longer finds it; each reason clears on its own."""
        with self._cond:
            if uuid not in self._health:
                return
            (self._faulty.discard if healthy else self._faulty.add)(uuid)
            state = self._state(uuid)
            if self._health[uuid] == state:
                return
            self._health[uuid] = state
            self._version += 1
            self._cond.notify_all()
            snapshot = dict(self._health)
        log.warning("device %s is %s%s", uuid, state, f" ({reason})" if reason else "")
        if self.on_health:
            self.on_health(snapshot)

    def devices(self) -> list[Device]:
        """The devices served now (discovered ones, and vanished ones kept as Unhealthy)."""
        with self._cond:
            return list(self._devices)

    def set_devices(self, devices: Sequence[Device]) -> bool:
        """A new discovery. New devices are added Healthy; known ones take the new description (a MIG
        layout may have changed); devices that vanished stay listed as Unhealthy (the kubelet keeps their
        pods, the ledger may still name them) until a later discovery finds them again (then they are
        Healthy unless the health source still reports a fault).
        Returns whether anything changed; then ``on_devices`` hears of it (the node annotation)."""
        now = {d.uuid: d for d in devices}
        with self._cond:
            before = (list(self._devices), dict(self._health))
            listed = {d.uuid for d in self._devices}
            self._devices = [now.get(d.uuid, d) for d in self._devices] + [d for d in devices if d.uuid not in listed]
            self._vanished = {d.uuid for d in self._devices if d.uuid not in now}
            self._health = {d.uuid: self._state(d.uuid) for d in self._devices}
            changed = (self._devices, self._health) != before
            if changed:
                self._version += 1
                self._cond.notify_all()
            snapshot = (list(self._devices), dict(self._health))
        if changed:
            log.warning("devices changed: %d listed, unhealthy: %s", len(snapshot[0]),
                        sorted(u for u, h in snapshot[1].items() if h != codec.HEALTHY) or "none")
            if self.on_devices:
                self.on_devices(*snapshot)
        return changed

    def device_list(self) -> Any:
        pb = self.pb2
        with self._cond:
            items = []
            for d in self._devices:
                topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]) if d.numa_node is not None else None
                for k in range(self.cfg.split_count):
                    items.append(pb.Device(ID=device_id(d.uuid, k), health=self._health[d.uuid], topology=topo))
            return pb.ListAndWatchResponse(devices=items)

    # ------------------------------------------------------------------------------------ servicer
    def _servicer(self) -> Any:
        plugin = self
        pb = self.pb2

        class Servicer(self.pb2_grpc.DevicePluginServicer):
            def GetDevicePluginOptions(self, request, context):
                return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

            def ListAndWatch(self, request, context):
                seen = -1
                while context.is_active() and not plugin._stop.is_set():
                    with plugin._cond:
                        if seen == plugin._version:
                            plugin._cond.wait(timeout=1.0)
                            if seen == plugin._version:
                                continue
                        seen = plugin._version
                    yield plugin.device_list()

            def GetPreferredAllocation(self, request, context):
                out = []
                for c in request.container_requests:
                    ids = (plugin.allocator.preferred(list(c.available_deviceIDs), list(c.must_include_deviceIDs),
                                                      c.allocation_size) if plugin.allocator else
                           list(c.available_deviceIDs)[:c.allocation_size])
                    out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
                return pb.PreferredAllocationResponse(container_responses=out)

            def Allocate(self, request, context):
                if plugin.allocator is None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "gpuslice: no API-server connection")
                responses = []
                for c in request.container_requests:
                    ids = list(c.devices_ids)
                    unhealthy = [i for i in ids if plugin.health.get(uuid_of(i)) != codec.HEALTHY]
                    if unhealthy:
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"gpuslice: devices {unhealthy} are unhealthy or unknown on {plugin.cfg.node}")
                    try:
                        match, resp = plugin.allocator.allocate(ids)
                    except (AllocateError, KubeError, codec.SpecError, SliceFileError, OSError) as exc:
                        log.error("Allocate %s: %s", ids, exc)
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gpuslice: {exc}")
                    except Exception as exc:  # a bug must still answer the kubelet with a reason
                        log.exception("Allocate %s", ids)
                        context.abort(grpc.StatusCode.INTERNAL, f"gpuslice: {type(exc).__name__}: {exc}")
                    meta = match.pod["metadata"]
                    log.info("Allocate %s -> %s/%s container %s grant %s", ids, meta.get("namespace"),
                             meta.get("name"), match.grant.container, match.grant.grant_id)
                    responses.append(pb.ContainerAllocateResponse(
                        envs=resp["envs"],
                        mounts=[pb.Mount(container_path=c_, host_path=h, read_only=ro) for c_, h, ro in resp["mounts"]],
                        devices=[pb.DeviceSpec(container_path=n, host_path=n, permissions="rw") for n in resp["devices"]],
                        annotations={"gpuslice.io/grant-id": match.grant.grant_id}))
                return pb.AllocateResponse(container_responses=responses)

            def PreStartContainer(self, request, context):
                # Registered with pre_start_required=False: the kubelet does not call this. Nothing to do
                # before a container starts (the Allocate answer carries everything), so answer empty.
                return pb.PreStartContainerResponse()

        return Servicer()

    # ------------------------------------------------------------------------------------ lifecycle
    def serve(self) -> None:
        """Start the gRPC server on the plugin socket (replacing a stale file)."""
        path = self.cfg.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="gpuslice-dp"))
        self.pb2_grpc.add_DevicePluginServicer_to_server(self._servicer(), server)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise GpusliceError(f"cannot listen on {path}")
        server.start()
        self._server = server

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None

    def register(self, timeout: float = 5.0) -> None:
        """Call the kubelet's Registration.Register for our socket and resource name."""
        target = f"unix://{self.cfg.kubelet_socket}"
        with grpc.insecure_channel(target) as channel:
            stub = self.pb2_grpc.RegistrationStub(channel)
            stub.Register(self.pb2.RegisterRequest(
                version=API_VERSION, endpoint=self.cfg.socket_name, resource_name=self.cfg.resource_name,
                options=self.pb2.DevicePluginOptions(pre_start_required=False,
                                                     get_preferred_allocation_available=True)),
                timeout=timeout)
        self.registrations += 1
        log.info("registered %s at %s with the kubelet (%d)", self.cfg.resource_name, self.cfg.socket_path,
                 self.registrations)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    @staticmethod
    def _ident(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
            return (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            return None

    def start_health(self) -> threading.Thread:
        """Run the health source in a thread until :meth:`stop` (it sees the current device list)."""
        if self._health_thread is None:
            self._health_thread = threading.Thread(target=self.health_source.run,
                                                   args=(self.devices, self.set_health, self._stop),
                                                   name="gpuslice-health", daemon=True)
            self._health_thread.start()
        return self._health_thread

    def run(self) -> None:
        """Serve, register, and start over whenever our socket disappears or the kubelet's is recreated."""
        self.start_health()
        while not self._stop.is_set():
            self.serve()
            registered_with = None
            while not self._stop.is_set():
                kubelet = self._ident(self.cfg.kubelet_socket)
                if kubelet is not None and kubelet != registered_with:
                    try:
                        self.register()
                        registered_with = kubelet
                    except grpc.RpcError as exc:
                        log.warning("kubelet registration failed (%s); retrying", exc.code())
                if self._ident(self.cfg.socket_path) is None:
                    log.warning("plugin socket %s vanished (kubelet restart); serving again", self.cfg.socket_path)
                    break
                self._stop.wait(self.cfg.watch_interval)
            self.shutdown()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="gpuslice-device-plugin", daemon=True)
        thread.start()
        return thread
