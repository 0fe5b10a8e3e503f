"""The device plugin (kubelet device-plugin API v1beta1 over gRPC on a Unix socket).

* Advertises ``<resource>`` (``nvidia.com/gpu`` by default) as devices × split count: IDs ``<UUID>::<k>``,
  with each device's NUMA node and health. Health comes from an injectable :class:`HealthSource`
  (:class:`NvmlHealth` on real nodes: critical XID events and devices that stop answering NVML).
* ``GetPreferredAllocation`` steers the kubelet towards IDs on the UUIDs the scheduler granted.
* ``Allocate`` finds the container's grant (see :meth:`Allocator.find`), writes its slice file and returns:
  the slice file mounted read-only at ``/etc/gpuslice/slice``, this grant's region (its folder read-only, the
  region file read-write: the enforcer's shared memory accounting), a per-grant device-state folder
  (read-only) with, for the granted devices only, each device's slice records folder (``<stem>.slices``,
  read-only: the pacer reads its neighbours' records there) with the grant's own record file in it read-write,
  and the device's policy roster (read-only), the enforcer library and an ``/etc/ld.so.preload`` naming it (both
  read-only), ``NVIDIA_VISIBLE_DEVICES`` with the granted UUIDs, ``GPUSLICE_SLICE``/``GPUSLICE_GRANT``, and the
  device nodes. No process of the container can pass its limits: the enforcer holds every process to the
  read-only slice file's limit whatever the region says, and environment variables may only lower it. What a
  container can still disturb (its own region, its own slice's records) is listed under "Known limits" in
  ``src/gpuslice/kube/README.md``.
* ``PreStartContainer`` is not used: the plugin registers with ``pre_start_required: false`` (everything a
  container needs is in the Allocate answer), so the kubelet never calls it; it answers empty if called.
* Registers with the kubelet (``kubelet.sock``) and registers again when the kubelet restarts (it deletes
  every socket in the device-plugin folder, ours included, and recreates its own).

The allocation itself (finding the grant, its files, the answer) is :mod:`gpuslice.kube.allocator`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc

from gpuslice.enforcer.slicefile import SliceFileError
from gpuslice.kube import formats
from gpuslice.kube.allocator import API_VERSION, AllocateError, Allocator, PluginConfig, device_id, uuid_of
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.kube.deviceplugin import load
from gpuslice.kube.grpcserve import serve_unix, stop as stop_server
from gpuslice.kube.devicestate import DeviceTracker, HealthSource
from gpuslice.spec import Device, SpecError

log = logging.getLogger("gpuslice.deviceplugin")


# ---------------------------------------------------------------------------------------- gRPC
class DevicePlugin(DeviceTracker):
    """The plugin's state (devices and health: :class:`DeviceTracker`) and its gRPC server; :meth:`run` keeps it registered until ``stop()``."""

    def __init__(self, cfg: PluginConfig, devices: Sequence[Device], api: KubeAPI | None, *,
                 health: HealthSource | None = None, on_health: Callable[[dict[str, str]], None] | None = None,
                 on_devices: Callable[[list[Device], dict[str, str]], None] | None = None):
        super().__init__(devices, health=health, on_health=on_health, on_devices=on_devices)
        self.cfg = cfg
        self.api = api
        self._server: grpc.Server | None = None
        self.registrations = 0
        self.allocator = Allocator(api, cfg, self.devices) if api is not None else None
        self.pb2, self.pb2_grpc = load()

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
                    unhealthy = [i for i in ids if plugin.health.get(uuid_of(i)) != formats.HEALTHY]
                    if unhealthy:
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"gpuslice: devices {unhealthy} are unhealthy or unknown on {plugin.cfg.node}")
                    try:
                        match, resp = plugin.allocator.allocate(ids)
                    except (AllocateError, KubeError, SpecError, SliceFileError, OSError) as exc:
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
        self._server = serve_unix([self.cfg.socket_path],
                                  lambda server: self.pb2_grpc.add_DevicePluginServicer_to_server(self._servicer(), server),
                                  workers=16, name="gpuslice-dp")

    def shutdown(self) -> None:
        stop_server(self._server)
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

    @staticmethod
    def _ident(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
            return (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            return None

    def run(self) -> None:
        """Serve, register, and start over whenever our socket disappears or the kubelet's is recreated."""
        self.start_health()
        while not self._stop.is_set():
            self.serve()
            registered_with = None
            while not self._stop.is_set():
                # our own socket first: a restarting kubelet removes it and then makes its own again, and a
                # registration naming a socket that is gone sends the kubelet to nothing (CI, stop 31: the
                # kubelet stand-in dialled it in that gap)
                if self._ident(self.cfg.socket_path) is None:
                    log.warning("plugin socket %s vanished (kubelet restart); serving again", self.cfg.socket_path)
                    break
                kubelet = self._ident(self.cfg.kubelet_socket)
                if kubelet is not None and kubelet != registered_with:
                    try:
                        self.register()
                        registered_with = kubelet
                    except grpc.RpcError as exc:
                        log.warning("kubelet registration failed (%s); retrying", exc.code())
                self._stop.wait(self.cfg.watch_interval)
            self.shutdown()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="gpuslice-device-plugin", daemon=True)
        thread.start()
        return thread
