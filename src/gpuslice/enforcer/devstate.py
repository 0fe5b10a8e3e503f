"""Reader of the enforcer's per-slice compute records: set vs achieved share per slice, and its processes.

Version 5 (issue 15; layout in ``native/include/gpuslice/devstate.h``, pacing in ``native/README-compute.md``):
one file per slice (grant) and device, in the device's folder::

    <device_state_dir>/<stem>.slices/          root's, 0755, where a root manager made it
    <device_state_dir>/<stem>.slices/<grant>   the slice's records, named after its grant

(``<stem>``: :func:`device_stem`, the pacer's name for the device; a MIG instance's is ``GPU-<hex>``.) A file is
written only by its own slice's processes: locally it belongs to the grant's user (0644), in Kubernetes it is
mounted read-write into that one container only (and the folder read-only). Every other pacer of the device
maps it read-only. Until version 4 all slices of a device wrote one shared file (``<stem>.dev``, 0666), so a
tenant could rewrite, free or truncate its neighbours' records; now a tenant can only write (or spoil) its own.
Who makes the folder and the files: :mod:`gpuslice.enforcer.slicerecords`.

A file (69632 bytes, little-endian): a 256-byte header (magic ``0x004345524C535347``, "GSSLREC\\0", version 5, size, the record
offsets and sizes, ``created_ns``, ``updates`` at byte 48, the device UUID at 56); the slice record at 256
(its ``grant`` is the file's name); 32 process records at 65536, all of that slice (their ``slice`` field is
0). An empty file is one its manager made before any process joined: the first joiner sizes it. Versions 1-4
(the shared ``.dev`` file) are no longer read: nothing writes them any more.

Policy (share, mode, weight, priority, co-location) is never taken from these files: every pacer takes it from
root's roster beside them (:mod:`gpuslice.enforcer.policy`); a slice record's policy fields say what its own
processes obey. Process records carry their PID namespace and a heartbeat (``ProcessCompute.pid`` is the pid
*in that namespace*), the path their launches take through the pacer and their offered load.

Reads take no lock (the writers hold one Python does not take); the header's ``updates`` counter is read
before and after the copy and the copy is retried when it moved, so a reader never reports half of one update.
A tenant can write anything into its own file: :func:`read_device_state` reports a file it cannot read in
``DeviceCompute.problems`` and goes on with the others; :func:`read_record` raises for it.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.enforcer.devfolders import is_grant_id
from gpuslice.spec.errors import GpusliceError
from gpuslice.spec.files import open_regular

MAGIC = 0x004345524C535347  # the bytes "GSSLREC\0"
VERSION = 5
READABLE = (5,)
RECORDS_SUFFIX = ".slices"
HEADER_SIZE = 256
SLICE_SIZE = 256
PROC_SIZE = 128
MAX_PROCS = 32  # process records per slice file
SLICE_OFF = HEADER_SIZE
PROC_OFF = 65536  # on a 64 KiB boundary: every page size Linux uses maps the records on their own
FILE_SIZE = PROC_OFF + MAX_PROCS * PROC_SIZE
UPDATES_OFF = 48

_HEADER = struct.Struct("<QIIIIIIIIqQ64s")  # magic .. proc_size, pad, created_ns, updates, uuid; zeros to 256
_SLICE = struct.Struct("<IIBBBBI128sqqqQQQqqqiiqB")  # + colocation at 232 (issue 13, in what was padding)
_PROC = struct.Struct("<iIiIqqqQqqqQqIB")  # v2: + heartbeat_ns, pidns, joined_ns; v3: + offered_bp, path
_LAYOUT = (FILE_SIZE, MAX_PROCS, SLICE_OFF, SLICE_SIZE, PROC_OFF, PROC_SIZE)
_MODES = {0: "hard", 1: "soft", 2: "off"}
_SLICE_IN_USE = 1
_PROC_IN_USE, _PROC_BUSY, _PROC_LIGHT = 1, 2, 4
_PATHS = {0: "light", 1: "free", 2: "turns", 3: "yield"}
_COLOCATIONS = {0: "preemptive", 1: "shared", 2: "tidal"}


class DeviceStateError(GpusliceError):
    """A slice record file (or a device's folder of them) is missing, truncated or not ours."""


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
    path: Path  # the device's folder (<stem>.slices); one file's path for parse_device_state
    slices: tuple[SliceCompute, ...]
    problems: tuple[str, ...] = ()  # files of the folder that could not be read (each names its file), skipped


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def _check_header(buf: bytes, path: Path) -> str:
    if len(buf) < HEADER_SIZE:
        raise DeviceStateError(f"{path}: {len(buf)} bytes, too short for a slice record header")
    magic, version, size, max_procs, slice_off, slice_size, proc_off, proc_size, _pad, _c, _u, uuid = (
        _HEADER.unpack_from(buf, 0)
    )
    if magic != MAGIC:
        raise DeviceStateError(f"{path}: not a gpuslice slice record file (magic {magic:#x})")
    if version not in READABLE or (size, max_procs, slice_off, slice_size, proc_off, proc_size) != _LAYOUT:
        raise UnknownDeviceStateVersion(
            f"{path}: slice record version {version} (size {size}) is not known; this gpuslice reads version "
            f"{VERSION} (size {FILE_SIZE}); update gpuslice or the enforcer so both agree"
        )
    if len(buf) != FILE_SIZE:
        raise DeviceStateError(f"{path}: {len(buf)} bytes, expected {FILE_SIZE}")
    return _cstr(uuid)


def _process(buf: bytes, i: int) -> ProcessCompute | None:
    (pid, flags, _slice, _id, _since, _last, _seen, busy_total, _expect, _want, beat, pidns, _joined, offered_bp,
     path) = _PROC.unpack_from(buf, PROC_OFF + i * PROC_SIZE)
    if not flags & _PROC_IN_USE:
        return None
    return ProcessCompute(pid=pid, busy=bool(flags & _PROC_BUSY),
                          measured=not flags & _PROC_LIGHT or bool(flags & _PROC_BUSY), busy_total_s=busy_total / 1e9,
                          pid_namespace=pidns, heartbeat_s=beat / 1e9, path=_PATHS.get(path, f"unknown({path})"),
                          offered_load=offered_bp / 10000.0 if offered_bp else None)


def _slice(buf: bytes, processes: tuple[ProcessCompute, ...]) -> SliceCompute | None:
    (flags, share_bp, mode, weight, priority, paced, rate_bp, grant, _credit, _credit_last, _active, busy_total,
     throttled_total, launches, _ws, _wb, _wt, achieved_bp, throttled_bp, _updated, coloc) = _SLICE.unpack_from(
        buf, SLICE_OFF)
    if not flags & _SLICE_IN_USE:
        return None
    return SliceCompute(grant=_cstr(grant), set_share=share_bp / 100.0,
                        achieved_share=None if achieved_bp < 0 else achieved_bp / 100.0, rate=rate_bp / 100.0,
                        throttled_share=max(throttled_bp, 0) / 100.0, busy_total_s=busy_total / 1e9,
                        throttled_total_s=throttled_total / 1e9, launches=launches,
                        mode=_MODES.get(mode, f"unknown({mode})"), weight=weight, priority=priority, paced=bool(paced),
                        processes=processes, colocation=_COLOCATIONS.get(coloc, f"unknown({coloc})"))


def parse_device_state(buf: bytes, path: Path | str = "<bytes>", grant: str | None = None) -> DeviceCompute:
    """Parse one slice record file's bytes: its device and its slice (none when the record is not in use). With
    ``grant`` (the file's name) the record must speak for that grant. Raises DeviceStateError /
    UnknownDeviceStateVersion."""
    path = Path(path)
    uuid = _check_header(buf, path)
    processes = tuple(p for p in (_process(buf, i) for i in range(MAX_PROCS)) if p is not None)
    one = _slice(buf, processes)
    if one is not None and grant is not None and one.grant != grant:
        raise DeviceStateError(f"{path}: its record names grant {one.grant!r}, not the file's own {grant!r}")
    return DeviceCompute(uuid=uuid, path=path, slices=() if one is None else (one,))


def _updates(buf: bytes) -> int:
    return struct.unpack_from("<Q", buf, UPDATES_OFF)[0]


def _read_consistent(fd: int, retries: int) -> bytes:
    """The file's bytes, copied again while its ``updates`` counter moved under the copy (at most ``retries``)."""
    buf = b""
    for _ in range(retries):
        buf = os.pread(fd, FILE_SIZE + 1, 0)  # one byte more: a file grown past the layout is refused
        if len(buf) < UPDATES_OFF + 8 or _updates(buf) == _updates(os.pread(fd, UPDATES_OFF + 8, 0)):
            break
    return buf  # busy writers: the latest copy, still validated


def _not_joined(buf: bytes) -> bool:
    """An empty file (made by its manager), or one its first process has sized but not written yet."""
    return not buf or (len(buf) == FILE_SIZE and not any(buf[:HEADER_SIZE]))


def read_record(path: Path | str, retries: int = 5, *, dir_fd: int | None = None) -> DeviceCompute | None:
    """Read one slice record file consistently (see the module docstring); None when no process has joined it
    yet. With ``dir_fd`` (the folder, opened), ``path.name`` is opened in it and ``path`` only names the file in
    errors. No link is followed and no FIFO opened: the file is its tenant's. Raises DeviceStateError
    (UnknownDeviceStateVersion for a layout it does not know)."""
    path = Path(path)
    try:
        fd = open_regular(path if dir_fd is None else path.name, dir_fd=dir_fd)
    except FileNotFoundError as e:
        raise DeviceStateError(f"{path}: no such slice record file") from e
    except OSError as e:
        raise DeviceStateError(f"{path}: {e.strerror or e}") from e
    try:
        buf = _read_consistent(fd, retries)
    finally:
        os.close(fd)
    return None if _not_joined(buf) else parse_device_state(buf, path, grant=path.name)


def _open_folder(folder: Path) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise DeviceStateError(f"{folder}: no such slice records folder") from e
    except OSError as e:
        why = "a link, never followed" if os.path.islink(folder) else e.strerror or str(e)
        raise DeviceStateError(f"{folder}: not a slice records folder ({why})") from e


def read_device_state(folder: Path | str, retries: int = 5) -> DeviceCompute:
    """Every slice of one device's folder (``<stem>.slices``): each regular file named like a grant, read with
    :func:`read_record`. Empty files are skipped; a file that cannot be read is named in ``problems`` and
    skipped (a tenant may write anything into its own). Raises DeviceStateError when the folder itself cannot be
    read (missing, a link, not a folder)."""
    folder = Path(folder)
    dfd = _open_folder(folder)
    slices, problems = [], []
    try:
        for name in sorted(os.listdir(dfd)):
            if not is_grant_id(name):
                continue  # never a grant's (the native reader skips them too)
            try:
                one = read_record(folder / name, retries, dir_fd=dfd)
            except DeviceStateError as exc:
                problems.append(str(exc))
                continue
            slices += one.slices if one else ()
    finally:
        os.close(dfd)
    uuid = folder.name[: -len(RECORDS_SUFFIX)] if folder.name.endswith(RECORDS_SUFFIX) else folder.name
    return DeviceCompute(uuid=uuid, path=folder, slices=tuple(slices), problems=tuple(problems))


def device_stem(uuid: str) -> str:
    """The pacer's name for ``uuid``'s files: ``cuDeviceGetUuid_v2`` printed as ``GPU-<hex>``, which for a MIG
    instance is its own UUID (``MIG-<hex>`` in NVML)."""
    return "GPU-" + uuid[4:] if re.fullmatch(r"MIG-[0-9a-fA-F-]{36}", uuid) else uuid


def records_folder_name(uuid: str) -> str:
    """The folder of ``uuid``'s slice record files: ``<stem>.slices``."""
    return device_stem(uuid) + RECORDS_SUFFIX


def read_all(directory: Path | str) -> list[DeviceCompute]:
    """Every device's slices in ``directory`` (each ``*.slices`` folder; empty when the directory does not
    exist). A link or anything else at such a name is left out."""
    d = Path(directory)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(RECORDS_SUFFIX) and not n.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [read_device_state(d / n) for n in names if _is_folder(d / n)]


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
