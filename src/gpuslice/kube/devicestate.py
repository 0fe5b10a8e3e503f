"""What a node agent knows about its devices: the list (vanished ones kept as Unhealthy) and their health.

Shared by the device plugin (:class:`gpuslice.kube.plugin.DevicePlugin`) and the DRA driver
(:class:`gpuslice.kube.dra.plugin.DraPlugin`): both advertise the same devices, take health reports from the
same :class:`HealthSource` (:class:`~gpuslice.kube.health.NvmlHealth` on real nodes) and new device lists from
:class:`~gpuslice.kube.agent.Rediscovery`, and tell their publisher when something changed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol, Sequence

from gpuslice.kube import formats
from gpuslice.spec import Device

log = logging.getLogger("gpuslice.devices")


# ---------------------------------------------------------------------------------------- health
class HealthSource(Protocol):
    """Reports device health changes: call ``report(uuid, healthy, reason)``; return when ``stop`` is set.
    ``devices`` is a callable returning the plugin's current devices (or, for callers outside the plugin,
    a plain list: :func:`gpuslice.kube.health.current_devices` reads both)."""

    def run(self, devices: Any, report: Callable[[str, bool, str], None],
            stop: threading.Event) -> None: ...


class StaticHealth:
    """No events: every device stays as it is (tests change health with :meth:`DeviceTracker.set_health`)."""

    def run(self, devices, report, stop) -> None:
        stop.wait()


class DeviceTracker:
    """The devices an agent serves and their health. ``on_health(health)`` hears of every health change,
    ``on_devices(devices, health)`` of every change of the list; :meth:`start_health` runs the health source."""

    def __init__(self, devices: Sequence[Device], *, health: HealthSource | None = None,
                 on_health: Callable[[dict[str, str]], None] | None = None,
                 on_devices: Callable[[list[Device], dict[str, str]], None] | None = None):
        self._devices = list(devices)
        self.health_source = health or StaticHealth()
        self.on_health = on_health
        self.on_devices = on_devices  # called with (devices, health) after a discovery changed the list
        self._vanished: set[str] = set()  # listed devices the last discovery did not find
        self._faulty: set[str] = set()    # devices the health source reported unhealthy
        self._health = {d.uuid: formats.HEALTHY for d in devices}
        self._cond = threading.Condition()
        self._version = 0
        self._stop = threading.Event()
        self._health_thread: threading.Thread | None = None

    @property
    def health(self) -> dict[str, str]:
        with self._cond:
            return dict(self._health)

    def _state(self, uuid: str) -> str:
        return formats.UNHEALTHY if uuid in self._faulty or uuid in self._vanished else formats.HEALTHY

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
                        sorted(u for u, h in snapshot[1].items() if h != formats.HEALTHY) or "none")
            if self.on_devices:
                self.on_devices(*snapshot)
        return changed

    def start_health(self) -> threading.Thread:
        """Run the health source in a thread until :meth:`stop` (it sees the current device list)."""
        if self._health_thread is None:
            self._health_thread = threading.Thread(target=self.health_source.run,
                                                   args=(self.devices, self.set_health, self._stop),
                                                   name="gpuslice-health", daemon=True)
            self._health_thread.start()
        return self._health_thread

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
