"""A small NVML double for the health tests: the few ``pynvml`` names :class:`NvmlHealth` calls.

* ``nvmlEventSetWait_v2(set, ms)`` hands out the events queued with :meth:`NvmlDouble.xid` (an object
  with ``eventData`` = the XID and ``device`` = the handle, like pynvml's ``c_nvmlEventData_t``), or
  raises ``NVMLError_Timeout`` after ``ms``.
* ``nvmlDeviceGetHandleByUUID`` / ``nvmlDeviceGetMemoryInfo`` fail with ``NVMLError`` for the UUIDs in
  :attr:`NvmlDouble.broken` (a card that fell off the bus), else answer.
* ``nvmlDeviceGetRemappedRows`` answers ``(0, 0, pending, failure)`` from :attr:`NvmlDouble.remap_pending`,
  or raises ``NVMLError`` (NOT_SUPPORTED) for UUIDs not listed there.
Everything it is asked is recorded in :attr:`NvmlDouble.calls`.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801  (pynvml's name)
    pass


@dataclass(frozen=True)
class Handle:
    uuid: str


@dataclass(frozen=True)
class EventData:
    device: Handle
    eventData: int  # noqa: N815  (pynvml's field name)
    eventType: int = 8  # noqa: N815


class NvmlDouble:
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self) -> None:
        self.events: "queue.Queue[EventData]" = queue.Queue()
        self.broken: set[str] = set()
        self.remap_pending: dict[str, bool] = {}
        self.registered: set[str] = set()
        self.calls: list[str] = []
        self.initialised = threading.Event()
        self.lock = threading.Lock()

    # ---- what tests do
    def xid(self, uuid: str, xid: int) -> None:
        """Deliver an XID event for ``uuid`` at the next nvmlEventSetWait."""
        self.events.put(EventData(Handle(uuid), xid))

    # ---- pynvml's names
    def nvmlInit(self) -> None:
        self.calls.append("init")
        self.initialised.set()

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        with self.lock:
            if uuid in self.broken:
                raise NVMLError("GPU is lost")
        return Handle(uuid)

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, events: Any) -> None:
        assert types == self.nvmlEventTypeXidCriticalError
        self.registered.add(handle.uuid)

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> EventData:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> Any:
        with self.lock:
            if handle.uuid in self.broken:
                raise NVMLError("GPU is lost")
        return (80 << 30, 0, 80 << 30)

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        with self.lock:
            if handle.uuid not in self.remap_pending:
                raise NVMLError("Not Supported")
            return (0, 0, int(self.remap_pending[handle.uuid]), 0)
