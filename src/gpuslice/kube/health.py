"""Device health for the device plugin: critical XID events and devices NVML can no longer reach.

Kept apart from the gRPC code so it can be used (and tested on a GPU machine) without grpcio.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

from gpuslice.spec import Device

log = logging.getLogger("gpuslice.deviceplugin")

# XIDs caused by applications, not by the device (the NVIDIA device plugin skips the same ones).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class NvmlHealth:
    """Critical XID events through ``nvmlEventSetWait`` and a poll that marks devices NVML cannot reach."""

    def __init__(self, poll_seconds: float = 5.0):
        self.poll_seconds = poll_seconds

    def run(self, devices: Sequence[Device], report: Callable[[str, bool, str], None],
            stop: threading.Event) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.error("NVML unavailable, health checks are off: %s", exc)
            stop.wait()
            return
        try:
            events = pynvml.nvmlEventSetCreate()
            handles = {}
            for d in devices:
                try:
                    h = pynvml.nvmlDeviceGetHandleByUUID(d.uuid)
                    handles[d.uuid] = h
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
                except pynvml.NVMLError as exc:  # NOT_SUPPORTED on some cards / VMs: the poll still runs
                    log.warning("no XID events for %s: %s", d.uuid, exc)
            last_poll = 0.0
            while not stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, 1000)
                    xid = int(data.eventData)
                    uuid = pynvml.nvmlDeviceGetUUID(data.device)
                    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                    if xid not in APPLICATION_XIDS:
                        report(uuid, False, f"XID {xid}")
                except pynvml.NVMLError_Timeout:
                    pass
                except pynvml.NVMLError as exc:
                    log.debug("event wait: %s", exc)
                    stop.wait(1.0)
                if time.monotonic() - last_poll >= self.poll_seconds:
                    last_poll = time.monotonic()
                    for d in devices:
                        try:
                            h = pynvml.nvmlDeviceGetHandleByUUID(d.uuid)
                            pynvml.nvmlDeviceGetMemoryInfo(h)
                        except pynvml.NVMLError as exc:
                            report(d.uuid, False, f"NVML: {exc}")
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


