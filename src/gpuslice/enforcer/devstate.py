"""Reader of the enforcer's per-device compute state: set vs achieved share per slice.

The native pacer (``native/src/pacing/``, layout in ``native/include/gpuslice/devstate.h`` and
``native/README-compute.md``) keeps one file per device, ``<device_state_dir>/<GPU-uuid>.dev``,
mmap'd by every paced process on the node. This module reads it for ``gpuslice ps`` / the monitor
and refuses versions it does not know with :class:`UnknownDeviceStateVersion`.

Version 2 added to every process record its PID namespace (the inode of ``/proc/<pid>/ns/pid``) and a
heartbeat: pids are only meaningful inside their own namespace, so the enforcers of different pods on one
node judge each other's liveness by the heartbeat. The reader reports both; ``ProcessCompute.pid`` is the
pid *in that namespace*. Version 3 (this reader) keeps that layout and adds to each process record the path
its launches take through the pacer (``light``, ``free``, ``turns``, ``yield`` — ``priority`` before issue 13:
README-compute.md, "Paths") and its offered load (GPU time its launches ask for per second of its own CPU time); the writers
also changed how they share a slice's credit, so the enforcers of versions 2 and 3 refuse each other's
files. Issue 13 kept version 3 and used padding: each slice record's co-location mode (byte 232; older
enforcers wrote 0 there, which is ``preemptive``, what they did) and each process record's ``drain_seen_ns``
(96), ``drain_done_ns`` (104) and ``drain_backlog_ns`` (112) with process flag 16 (``GS_DS_PROC_DRAINS``: a
high-priority process publishing its drain looks; an enforcer without it is read by the old 200-us rule).
This reader does not need them.
Version 4 (issue 15) keeps version 3's layout; its writers lock with the kernel (an OFD lock on byte 128)
instead of a pthread mutex in the file that any tenant could overwrite, so the two refuse each other's files;
this reader reads both (:data:`READABLE`). Issue 15 also took every slice's policy (share, mode, weight,
priority, co-location) out of this file's trust: the pacers take it from root's roster beside it
(:mod:`gpuslice.enforcer.policy`), and nothing of root's writes this file any more (a live resize writes the
roster; ``set_live`` is gone). A slice record's policy fields say what its own processes obey.

Reads take no lock (the writers hold a lock Python does not take); the
header's ``updates`` counter is read before and after the copy and the copy is retried when it
moved, so a reader never reports half of one update.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.spec.errors import GpusliceError
from gpuslice.spec.files import open_regular

MAGIC = 0x0054535645445347  # "GSDEVST\0"
VERSION = 4
READABLE = (3, 4)  # the same layout: a node in the middle of an upgrade still shows both
HEADER_SIZE = 256
SLICE_SIZE = 256
PROC_SIZE = 128
MAX_SLICES = 32
MAX_PROCS = 128
SLICE_OFF = HEADER_SIZE
PROC_OFF = SLICE_OFF + MAX_SLICES * SLICE_SIZE
FILE_SIZE = PROC_OFF + MAX_PROCS * PROC_SIZE

_HEADER = struct.Struct("<QIIIIIIIIqqQ64s")  # up to the uuid; the lock byte and its "held" hint follow at 128
_SLICE = struct.Struct("<IIBBBBI128sqqqQQQqqqiiqB")  # + colocation at 232 (issue 13, in what was padding)
_PROC = struct.Struct("<iIiIqqqQqqqQqIB")  # v2: + heartbeat_ns, pidns, joined_ns; v3: + offered_bp, path
_MODES = {0: "hard", 1: "soft", 2: "off"}
_SLICE_IN_USE = 1
_PROC_IN_USE, _PROC_BUSY, _PROC_LIGHT = 1, 2, 4
_PATHS = {0: "light", 1: "free", 2: "turns", 3: "yield"}
_COLOCATIONS = {0: "preemptive", 1: "shared", 2: "tidal"}
_SHARE_OFFSET = 4  # share_bp inside a slice record


class DeviceStateError(GpusliceError):
    """A per-device compute state file is missing, truncated or not ours."""


class UnknownDeviceStateVersion(DeviceStateError):
    """The file has a layout version (or size) this gpuslice does not know."""


@dataclass(frozen=True)
class ProcessCompute:
    pid: int  # inside its own PID namespace (see pid_namespace)
    busy: bool  # has GPU work outstanding right now (measured with events)
    measured: bool  # False: on the light path, only its launch activity is published
    busy_total_s: float
    pid_namespace: int = 0  # inode of the process's PID namespace; 0 = unknown
    heartbeat_s: float = 0.0  # CLOCK_MONOTONIC seconds (time.monotonic() on Linux) of its last heartbeat
    path: str = "light"  # light | free | turns | yield (how its launches go through the pacer now)
    offered_load: float | None = None  # GPU seconds its launches ask per CPU second (paced only; None = not yet)

    def heartbeat_age(self, now_monotonic: float | None = None) -> float:
        """Seconds since the process last proved alive (stale after 5 s: the native side frees it)."""
        import time

        return (time.monotonic() if now_monotonic is None else now_monotonic) - self.heartbeat_s


@dataclass(frozen=True)
class SliceCompute:
    grant: str
    set_share: float  # percent of the device; 0 or 100 = not paced
    achieved_share: float | None  # percent over the last complete 1-s window; None = none yet
    rate: float  # percent the controller allots right now (weights, soft, contention)
    throttled_share: float  # percent of the last window a launch was held back
    busy_total_s: float
    throttled_total_s: float
    launches: int
    mode: str  # hard | soft | off
    weight: int
    priority: int  # 0 high, 1 low
    paced: bool
    processes: tuple[ProcessCompute, ...] = field(default=())
    colocation: str = "preemptive"  # preemptive | shared | tidal (a tidal slice's set_share follows the tide)


@dataclass(frozen=True)
class DeviceCompute:
    uuid: str
    path: Path
    slices: tuple[SliceCompute, ...]


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def _check_header(buf: bytes, path: Path) -> str:
    if len(buf) < HEADER_SIZE:
        raise DeviceStateError(f"{path}: {len(buf)} bytes, too short for a device state header")
    magic, version, size, max_slices, max_procs, slice_off, slice_size, proc_off, proc_size, _c, _r, _u, uuid = (
        _HEADER.unpack_from(buf, 0)
    )
    if magic != MAGIC:
        raise DeviceStateError(f"{path}: not a gpuslice device state file (magic {magic:#x})")
    layout = (size, max_slices, max_procs, slice_off, slice_size, proc_off, proc_size)
    if version not in READABLE or layout != (FILE_SIZE, MAX_SLICES, MAX_PROCS, SLICE_OFF, SLICE_SIZE, PROC_OFF, PROC_SIZE):
        raise UnknownDeviceStateVersion(
            f"{path}: device state version {version} (size {size}) is not known; this gpuslice reads version "
            f"{VERSION} (size {FILE_SIZE}); update gpuslice or the enforcer so both agree"
        )
    if len(buf) != FILE_SIZE:
        raise DeviceStateError(f"{path}: {len(buf)} bytes, expected {FILE_SIZE}")
    return _cstr(uuid)


def parse_device_state(buf: bytes, path: Path | str = "<bytes>") -> DeviceCompute:
    """Parse one state file's bytes (raises DeviceStateError / UnknownDeviceStateVersion)."""
    path = Path(path)
    uuid = _check_header(buf, path)
    procs_by_slice: dict[int, list[ProcessCompute]] = {}
    for i in range(MAX_PROCS):
        (pid, flags, slice_idx, _id, _since, _last, _seen, busy_total, _expect, _want, beat, pidns, _joined, offered_bp,
         path) = _PROC.unpack_from(buf, PROC_OFF + i * PROC_SIZE)
        if not flags & _PROC_IN_USE:
            continue
        procs_by_slice.setdefault(slice_idx, []).append(
            ProcessCompute(
                pid=pid,
                busy=bool(flags & _PROC_BUSY),
                measured=not flags & _PROC_LIGHT or bool(flags & _PROC_BUSY),
                busy_total_s=busy_total / 1e9,
                pid_namespace=pidns,
                heartbeat_s=beat / 1e9,
                path=_PATHS.get(path, f"unknown({path})"),
                offered_load=offered_bp / 10000.0 if offered_bp else None,
            )
        )
    slices = []
    for i in range(MAX_SLICES):
        (flags, share_bp, mode, weight, priority, paced, rate_bp, grant, _credit, _credit_last, _active, busy_total,
         throttled_total, launches, _ws, _wb, _wt, achieved_bp, throttled_bp, _updated, coloc) = _SLICE.unpack_from(
            buf, SLICE_OFF + i * SLICE_SIZE
        )
        if not flags & _SLICE_IN_USE:
            continue
        slices.append(
            SliceCompute(
                grant=_cstr(grant),
                set_share=share_bp / 100.0,
                achieved_share=None if achieved_bp < 0 else achieved_bp / 100.0,
                rate=rate_bp / 100.0,
                throttled_share=max(throttled_bp, 0) / 100.0,
                busy_total_s=busy_total / 1e9,
                throttled_total_s=throttled_total / 1e9,
                launches=launches,
                mode=_MODES.get(mode, f"unknown({mode})"),
                weight=weight,
                priority=priority,
                paced=bool(paced),
                processes=tuple(procs_by_slice.get(i, ())),
                colocation=_COLOCATIONS.get(coloc, f"unknown({coloc})"),
            )
        )
    return DeviceCompute(uuid=uuid, path=path, slices=tuple(slices))


def _updates(buf: bytes) -> int:
    return struct.unpack_from("<Q", buf, 56)[0]


def read_device_state(path: Path | str, retries: int = 5) -> DeviceCompute:
    """Read one ``<uuid>.dev`` file consistently (see the module docstring)."""
    path = Path(path)
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # no link followed, no FIFO: tenants write this folder
            for _ in range(retries):
                first = f.read(FILE_SIZE)
                f.seek(0)
                if len(first) < 64:
                    break
                again = f.read(64)
                f.seek(0)
                if _updates(first) == _updates(again):
                    return parse_device_state(first, path)
            return parse_device_state(first, path)  # busy writers: the latest copy, still validated
    except FileNotFoundError as e:
        raise DeviceStateError(f"{path}: no such device state file") from e
    except OSError as e:
        raise DeviceStateError(f"{path}: {e.strerror}") from e


def state_file_name(uuid: str) -> str:
    """The name of ``uuid``'s pacing file: the pacer names it after ``cuDeviceGetUuid_v2`` printed as
    ``GPU-<hex>``, which for a MIG instance is its own UUID (``MIG-<hex>`` in NVML)."""
    import re

    return ("GPU-" + uuid[4:] if re.fullmatch(r"MIG-[0-9a-fA-F-]{36}", uuid) else uuid) + ".dev"


def read_all(directory: Path | str) -> list[DeviceCompute]:
    """Every device state in ``directory`` (empty when the directory does not exist)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return [read_device_state(p) for p in sorted(d.glob("*.dev"))]


