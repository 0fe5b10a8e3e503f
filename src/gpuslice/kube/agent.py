"""The node side in Kubernetes (``gpuslice kube-agent``): node registration and the device plugin.

Node registration publishes the node's devices (UUID, model, memory, SMs, NUMA, NVLink peers, MIG
instances, health) and its sharing knobs (split count, memory scaling) as the ``gpuslice.io/devices``
annotation, again whenever a device's health or the device list changes and every ``interval`` seconds
(the ``updated`` stamp says how fresh it is). A merge patch of that one key: it never touches the
extender's ledger.

:class:`Rediscovery` runs discovery again every ``interval`` seconds and hands the result to the device
plugin (:meth:`~gpuslice.kube.plugin.DevicePlugin.set_devices`), which tells the publisher when the list
changed: a GPU that vanished stays listed as Unhealthy, a new one is advertised and published.
"""

from __future__ import annotations

import logging
import threading
import uuid as uuidlib
from dataclasses import replace
from typing import Callable, Mapping, Sequence

from gpuslice.kube import formats
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.spec import Device

log = logging.getLogger("gpuslice.kube-agent")


def unique_devices(devices: Sequence[Device], node: str) -> list[Device]:
    """The same devices with UUIDs made unique per node (deterministic): for fake nodes built from one
    snapshot (tests, simulations). NVLink peers and MIG instances are renamed consistently."""

    def rename(old: str) -> str:
        prefix = old.split("-", 1)[0] if "-" in old else "GPU"
        return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpuslice:{node}/{old}')}"

    out = []
    for d in devices:
        migs = tuple(replace(m, uuid=rename(m.uuid)) for m in d.mig_instances)
        out.append(replace(d, uuid=rename(d.uuid), nvlink_peers=tuple(rename(p) for p in d.nvlink_peers),
                           mig_instances=migs))
    return out


class NodePublisher:
    """Keeps ``gpuslice.io/devices`` on the Node current."""

    def __init__(self, api: KubeAPI, node: str, devices: Sequence[Device], *, split_count: int = 10,
                 memory_scaling: float = 1.0, interval: float = 30.0):
        self.api = api
        self.node = node
        self.devices = list(devices)
        self.split_count = split_count
        self.memory_scaling = memory_scaling
        self.interval = interval
        self._health: dict[str, str] = {d.uuid: formats.HEALTHY for d in devices}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.published = 0

    def value(self) -> str:
        return formats.encode_node_devices(self.devices, health=self._health, split_count=self.split_count,
                                         memory_scaling=self.memory_scaling)

    def publish(self) -> None:
        self.api.patch_node_annotations(self.node, {formats.NODE_DEVICES: self.value()})
        self.published += 1

    def health_changed(self, health: Mapping[str, str]) -> None:
        self._health.update(health)
        self._wake.set()

    def devices_changed(self, devices: Sequence[Device], health: Mapping[str, str]) -> None:
        """A new device list (the plugin's: vanished devices still listed, as Unhealthy); published now."""
        self.devices = list(devices)
        self._health.update(health)
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish()
            except KubeError as exc:
                log.warning("publishing devices of node %s failed: %s", self.node, exc)
                self._stop.wait(2.0)
                continue
            self._wake.wait(self.interval)
            self._wake.clear()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="gpuslice-node-publisher", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()


class Rediscovery:
    """Runs ``discover`` every ``interval`` seconds and gives the result to ``apply`` (the device plugin's
    ``set_devices``). A failed discovery is logged and skipped: devices are never dropped on an error."""

    def __init__(self, discover: Callable[[], Sequence[Device]], apply: Callable[[Sequence[Device]], object],
                 interval: float = 60.0):
        if interval <= 0:
            raise ValueError("interval must be above 0")
        self.discover = discover
        self.apply = apply
        self.interval = interval
        self.runs = 0
        self._stop = threading.Event()

    def run_once(self) -> bool:
        try:
            devices = list(self.discover())
        except Exception as exc:  # NVML may be away for a moment (driver reload): try again later
            log.warning("device discovery failed: %s; keeping the current list", exc)
            return False
        finally:
            self.runs += 1
        self.apply(devices)
        return True

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="gpuslice-rediscovery", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
