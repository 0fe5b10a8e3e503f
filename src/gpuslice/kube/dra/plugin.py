"""The DRA kubelet plugin: gRPC services on Unix sockets, as the kubelet's plugin manager expects them.

* **Registration** (``pluginregistration.Registration``, k8s.io/kubelet ``pluginregistration/v1``) on
  ``/var/lib/kubelet/plugins_registry/gpuslice.io-reg.sock``: the kubelet's plugin watcher sees the socket appear,
  calls ``GetInfo`` — type ``DRAPlugin``, name ``gpuslice.io`` (the driver name in ResourceSlices and claims),
  endpoint = our service socket, supported versions ``["v1.DRAPlugin"]`` (DRA names the gRPC services it speaks
  there) — and reports the outcome with ``NotifyRegistrationStatus``. A restarted kubelet scans the folder again,
  so nothing needs re-registering; if the socket vanishes (someone cleaned the folder) it is created again.
* **DRAPlugin** (``k8s.io.kubelet.pkg.apis.dra.v1``) on ``/var/lib/kubelet/plugins/gpuslice.io/dra.sock``:
  ``NodePrepareResources`` / ``NodeUnprepareResources`` → :class:`~.driver.DraDriver`. Every claim of a call gets
  an entry in the answer, with an ``error`` string when it failed (the kubelet retries those).

The kubelet's gRPC definitions are the kubelet's own protos (:mod:`.kubeletapi`), compiled at build time.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import grpc

from gpuslice.kube.dra.driver import ClaimRef, DraDriver
from gpuslice.kube.dra.kubeletapi import load
from gpuslice.kube.dra.resourceslice import DRIVER
from gpuslice.kube.grpcserve import serve_unix, stop as stop_server

log = logging.getLogger("gpuslice.dra")

PLUGIN_TYPE = "DRAPlugin"            # k8s.io/kubelet pluginregistration/v1 DRAPlugin
SERVICES = ("v1.DRAPlugin",)         # k8s.io/kubelet dra/v1 DRAPluginService


class DraPlugin:
    """Serves the driver; :meth:`run` keeps both sockets in place until :meth:`stop`."""

    def __init__(self, driver: DraDriver):
        self.driver = driver
        self.cfg = driver.cfg
        self.api = load()
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self.registered: bool | None = None   # what the kubelet said in NotifyRegistrationStatus
        self.registration_error = ""
        self.info_calls = 0

    # ------------------------------------------------------------------------------------ servicers
    def _dra_servicer(self) -> Any:
        plugin, pb = self, self.api.dra

        class Servicer(self.api.dra_grpc.DRAPluginServicer):
            def NodePrepareResources(self, request, context):
                done = plugin.driver.prepare([ClaimRef(c.namespace, c.uid, c.name) for c in request.claims])
                out = pb.NodePrepareResourcesResponse()
                for uid, result in done.items():
                    entry = out.claims[uid]
                    entry.error = result.error
                    for d in result.devices:
                        dev = entry.devices.add(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                                                cdi_device_ids=list(d.cdi))
                        if d.share_id:
                            dev.share_id = d.share_id
                return out

            def NodeUnprepareResources(self, request, context):
                done = plugin.driver.unprepare([ClaimRef(c.namespace, c.uid, c.name) for c in request.claims])
                out = pb.NodeUnprepareResourcesResponse()
                for uid, error in done.items():
                    out.claims[uid].error = error
                return out

        return Servicer()

    def _registration_servicer(self) -> Any:
        plugin, pb = self, self.api.reg

        class Registration(self.api.reg_grpc.RegistrationServicer):
            def GetInfo(self, request, context):
                plugin.info_calls += 1
                return pb.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(plugin.cfg.socket_path),
                                     supported_versions=list(SERVICES))

            def NotifyRegistrationStatus(self, request, context):
                plugin.registered, plugin.registration_error = request.plugin_registered, request.error
                if request.plugin_registered:
                    log.info("the kubelet registered DRA driver %s (%s)", DRIVER, plugin.cfg.socket_path)
                else:
                    log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error)
                return pb.RegistrationStatusResponse()

        return Registration()

    # ------------------------------------------------------------------------------------ lifecycle
    def serve(self) -> None:
        """Listen on both sockets (stale files replaced): the DRA service, then the registration socket — the
        kubelet calls the service as soon as it sees the registration socket."""
        def services(server: grpc.Server) -> None:
            self.api.dra_grpc.add_DRAPluginServicer_to_server(self._dra_servicer(), server)
            self.api.reg_grpc.add_RegistrationServicer_to_server(self._registration_servicer(), server)

        self._server = serve_unix([self.cfg.socket_path, self.cfg.registration_path], services, workers=8,
                                  name="gpuslice-dra")

    def shutdown(self) -> None:
        self._close()
        for path in (self.cfg.registration_path, self.cfg.socket_path):
            path.unlink(missing_ok=True)  # the kubelet sees the plugin go (it would otherwise retry a dead socket)

    @staticmethod
    def _present(path: Path) -> bool:
        return path.is_socket()

    def run(self) -> None:
        """Serve until :meth:`stop`; serve again whenever one of the sockets vanishes."""
        while not self._stop.is_set():
            self.serve()
            while not self._stop.wait(self.cfg.watch_interval):
                if not (self._present(self.cfg.socket_path) and self._present(self.cfg.registration_path)):
                    log.warning("DRA plugin socket vanished (%s, %s); serving again", self.cfg.socket_path,
                                self.cfg.registration_path)
                    break
            self._close()
        self.shutdown()

    def _close(self) -> None:
        stop_server(self._server)
        self._server = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="gpuslice-dra-plugin", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
