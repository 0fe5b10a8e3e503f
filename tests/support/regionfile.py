"""Test helper: write region files in the layout of native/include/gpuslice/region.h (version 1).

The enforcer writes regions in production; tests that need "recorded" usage without a GPU write the same
bytes here so the monitor, metrics and dashboard read them through the real reader.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

HEADER, DEV, PROC, NDEV, NPROC = 128, 192, 800, 16, 128
SIZE = HEADER + NDEV * DEV + NPROC * PROC


@dataclass
class ProcRecord:
    pid: int
    start_time: int
    used: dict[int, int] = field(default_factory=dict)  # device record index -> bytes
    busy_ns: dict[int, int] = field(default_factory=dict)
    throttled_ns: dict[int, int] = field(default_factory=dict)
    launches: dict[int, int] = field(default_factory=dict)
    oom_waits: tuple[int, int, int, int] = (0, 0, 0, 0)  # spare[0..3]: waiting now, waits, timeouts, bytes waited for


@dataclass
class DeviceRecord:
    uuid: str
    limit: int
    used: int = 0
    peak: int = 0
    oom_refusals: int = 0
    compute: int = 0


def write_region(path: Path, devices: list[DeviceRecord], procs: list[ProcRecord], seq: int = 2) -> None:
    buf = bytearray(SIZE)
    struct.pack_into("<8sIIQIIIIQIIQ", buf, 0, b"GSREGION", 1, HEADER, SIZE, NDEV, NPROC, DEV, PROC, seq,
                     len(devices), 1, 0)
    for i, d in enumerate(devices):
        off = HEADER + i * DEV
        buf[off:off + 64] = d.uuid.encode().ljust(64, b"\0")
        struct.pack_into("<QQQQQII", buf, off + 64, d.limit, d.used, d.peak, d.oom_refusals, 0, d.compute, 0)
    base = HEADER + NDEV * DEV
    for i, p in enumerate(procs):
        off = base + i * PROC
        struct.pack_into("<iIQ", buf, off, p.pid, 1, p.start_time)
        for dev, value in p.used.items():
            struct.pack_into("<Q", buf, off + 32 + 8 * dev, value)
            struct.pack_into("<I", buf, off + 288 + 4 * dev, 1)
        for start, table in ((352, p.launches), (480, p.throttled_ns), (608, p.busy_ns)):
            for dev, value in table.items():
                struct.pack_into("<Q", buf, off + start + 8 * dev, value)
        struct.pack_into("<4Q", buf, off + 736, *p.oom_waits)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(bytes(buf))
    os.replace(tmp, path)
