"""Device health for the device plugin: critical XID events, devices NVML can no longer reach, and
recovery once NVML says a device is fine again.

Kept apart from the gRPC code so it can be used (and tested on a GPU machine) without grpcio.

The rule (documented in ``src/gpuslice/kube/README.md``):

* **Unhealthy** on a critical XID event (``nvmlEventSetWait``; XIDs caused by applications —
  :data:`APPLICATION_XIDS` — are ignored, as NVIDIA's device plugin does) or when a poll (every
  ``poll_seconds``) cannot query the device (handle by UUID + memory info).
* **Healthy again** when ``recover_seconds`` have passed since the device's last fault *and* a poll then
  queries it successfully *and* NVML reports no row remapping pending a reset (``nvmlDeviceGetRemappedRows``;
  cards without row remapping skip that check). A new fault restarts the wait. ``recover_seconds = 0``
  turns recovery off (a device stays Unhealthy until the agent restarts, like NVIDIA's device plugin).
  Only devices this source marked are recovered.

``nvml`` is the NVML binding (``pynvml`` by default): tests pass a double with the same names
(``tests/kube/nvmldouble.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence, Union

from gpuslice.spec import Device

log = logging.getLogger("gpuslice.deviceplugin")

# XIDs caused by applications, not by the device (the NVIDIA device plugin skips the same ones).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVER_SECONDS = 300.0

Devices = Union[Sequence[Device], Callable[[], Sequence[Device]]]


def current_devices(devices: Devices) -> list[Device]:
    """A health source's devices: a fixed list, or a callable returning the plugin's current list (so
    devices found by a later discovery are watched too)."""
    return list(devices() if callable(devices) else devices)


class NvmlHealth:
    """Critical XID events through ``nvmlEventSetWait``, a poll that marks devices NVML cannot reach, and
    recovery after ``recover_seconds`` without faults (see the module docstring)."""

    def __init__(self, poll_seconds: float = 5.0, recover_seconds: float = DEFAULT_RECOVER_SECONDS, *,
                 nvml: Any = None, clock: Callable[[], float] = time.monotonic, wait_ms: int = 1000):
        if poll_seconds <= 0:
            raise ValueError("poll_seconds must be above 0")
        if recover_seconds < 0:
            raise ValueError("recover_seconds must be 0 (never) or more")
        self.poll_seconds = poll_seconds
        self.recover_seconds = recover_seconds
        self.nvml = nvml
        self.clock = clock
        self.wait_ms = wait_ms
        self.faults: dict[str, float] = {}  # uuid -> clock() of its last fault (devices this source marked)

    def _fault(self, report: Callable[[str, bool, str], None], uuid: str, reason: str) -> None:
        self.faults[uuid] = self.clock()
        report(uuid, False, reason)

    def _reset_pending(self, nvml: Any, handle: Any) -> bool:
        try:
            rows = nvml.nvmlDeviceGetRemappedRows(handle)
        except (nvml.NVMLError, AttributeError):  # NOT_SUPPORTED (no row remapping) or an old binding
            return False
        # (corrected rows, uncorrected rows, isPending, failureOccurred)
        return bool(rows[2]) or bool(rows[3])

    def poll(self, nvml: Any, devices: Sequence[Device], report: Callable[[str, bool, str], None]) -> None:
        """Query every device once: mark the unreachable, bring back the recovered."""
        for d in devices:
            try:
                h = nvml.nvmlDeviceGetHandleByUUID(d.uuid)
                nvml.nvmlDeviceGetMemoryInfo(h)
            except nvml.NVMLError as exc:
                self._fault(report, d.uuid, f"NVML: {exc}")
                continue
            since = self.faults.get(d.uuid)
            if since is None or not self.recover_seconds:
                continue
            if self.clock() - since < self.recover_seconds:
                continue
            if self._reset_pending(nvml, h):
                log.info("device %s answers NVML but a row remapping waits for a reset; stays Unhealthy", d.uuid)
                continue
            del self.faults[d.uuid]
            report(d.uuid, True, f"NVML answers and no fault for {self.recover_seconds:g} s")

    def run(self, devices: Devices, report: Callable[[str, bool, str], None], stop: threading.Event) -> None:
        nvml = self.nvml
        if nvml is None:
            import pynvml as nvml  # noqa: N813

        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.error("NVML unavailable, health checks are off: %s", exc)
            stop.wait()
            return
        try:
            events = nvml.nvmlEventSetCreate()
            registered: set[str] = set()

            def register(devs: Sequence[Device]) -> None:
                for d in devs:
                    if d.uuid in registered:
                        continue
                    registered.add(d.uuid)
                    try:
                        h = nvml.nvmlDeviceGetHandleByUUID(d.uuid)
                        nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
                    except nvml.NVMLError as exc:  # NOT_SUPPORTED on some cards / VMs: the poll still runs
                        log.warning("no XID events for %s: %s", d.uuid, exc)

            register(current_devices(devices))
            last_poll = float("-inf")
            while not stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(events, self.wait_ms)
                    xid = int(data.eventData)
                    uuid = nvml.nvmlDeviceGetUUID(data.device)
                    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                    if xid not in APPLICATION_XIDS:
                        self._fault(report, uuid, f"XID {xid}")
                except nvml.NVMLError_Timeout:
                    pass
                except nvml.NVMLError as exc:
                    log.debug("event wait: %s", exc)
                    stop.wait(1.0)
                if self.clock() - last_poll >= self.poll_seconds:
                    last_poll = self.clock()
                    devs = current_devices(devices)
                    register(devs)
                    self.poll(nvml, devs, report)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
