"""Read (and, if needed, create) a slice's region: the shared-memory file through which the enforcer
processes of one slice account device memory, and through which the node sees live usage.

The layout is the ABI documented in ``native/include/gpuslice/region.h`` (the source of truth) and
``native/README.md``. Writers (the enforcer) hold a robust process-shared mutex and bracket every
update with a sequence counter (odd while inside); this reader never takes the lock: it copies the
file and keeps the copy only if the counter was even and unchanged around it (a seqlock), so a
reader can neither block nor be blocked by the enforcer. Counters written by the compute part
(``launches``, ``throttled_ns``, ``busy_ns``) are monotonic 8-byte values updated atomically outside
the seqlock; they are read as they are.

    snap = read_region("/run/gpuslice/g-1.region")
    snap.limit("GPU-...")        # bytes, or None for unlimited
    snap.used("GPU-...")         # bytes the slice holds on that device (contexts included)
    snap.processes               # per-process usage, per device
    snap.oom_refusals            # allocations refused, all devices
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from gpuslice.spec.errors import GpusliceError
from gpuslice.spec.files import open_regular

__all__ = ["DeviceUsage", "ProcessUsage", "RegionError", "RegionSnapshot", "RegionVersionError", "create_region",
           "read_region", "UNLIMITED", "VERSION"]

MAGIC = b"GSREGION"
VERSION = 1
HEADER_SIZE = 128
MAX_DEVICES = 16
MAX_PROCS = 128
DEVICE_SIZE = 192
PROC_SIZE = 800
TOTAL_SIZE = HEADER_SIZE + MAX_DEVICES * DEVICE_SIZE + MAX_PROCS * PROC_SIZE  # 105600
UNLIMITED = 2**64 - 1
SEQ_OFFSET = 40
LOCK_OFFSET = 64

# header: magic, version, header_size, size, max_devices, max_procs, device_size, proc_size, seq,
# device_count, flags, created_ns
_HEADER = struct.Struct("<8sIIQIIIIQIIQ")
# device: uuid[64], limit, used, peak, oom_refusals, context_overhead, compute, generation, spare[10]
_DEVICE = struct.Struct("<64sQQQQQII80s")
# process: pid, state, start_time, oom_refusals, reserved, then arrays
_PROC_HEAD = struct.Struct("<iIQQQ")
_U64X16 = struct.Struct("<16Q")
_U32X16 = struct.Struct("<16I")
assert _HEADER.size == 64 and _DEVICE.size == DEVICE_SIZE


class RegionError(GpusliceError):
    """A region file that cannot be read: missing, truncated, or not a gpuslice region."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"region {self.path}: {reason}")


class RegionVersionError(RegionError):
    """A region written by another gpuslice version, whose layout this reader does not know."""

    def __init__(self, path: str | os.PathLike[str], version: int):
        self.version = version
        super().__init__(path, f"layout version {version} is not supported (this gpuslice reads version {VERSION}); "
                               "upgrade gpuslice on this node or restart the slice with a matching enforcer")


@dataclass(frozen=True)
class DeviceUsage:
    """One device of the slice as the region records it."""

    index: int
    uuid: str
    limit: int | None  # bytes; None = unlimited
    used: int
    peak: int
    oom_refusals: int
    context_overhead: int
    compute: int
    generation: int = 0  # the slice file generation that last set ``limit`` (live resize; 0: never resized)


@dataclass(frozen=True)
class ProcessUsage:
    """One process of the slice. Per-device maps are keyed by device UUID and hold only devices the
    process touched (or that the compute part counted for it)."""

    pid: int
    start_time: int
    oom_refusals: int
    used: Mapping[str, int]
    peak: Mapping[str, int]
    contexts: Mapping[str, int]
    launches: Mapping[str, int] = field(default_factory=dict)
    throttled_ns: Mapping[str, int] = field(default_factory=dict)
    busy_ns: Mapping[str, int] = field(default_factory=dict)
    # oom_policy=wait (spare[0..3] of the process record): allocations waiting now for the device to have
    # room, the bytes they wait for, waits started and waits that timed out
    oom_waiting: int = 0
    oom_waiting_bytes: int = 0
    oom_waits: int = 0
    oom_wait_timeouts: int = 0

    @property
    def total_used(self) -> int:
        return sum(self.used.values())

    def alive(self) -> bool:
        """Whether the process still runs (same pid *and* same start time; pid namespaces aside: the
        check is only meaningful from the slice's own pid namespace or the host's when they match)."""
        return _pid_alive(self.pid, self.start_time)


@dataclass(frozen=True)
class RegionSnapshot:
    """A consistent copy of a region at one instant (``consistent`` is False only when a writer died
    mid-update and nobody has recovered the lock yet: numbers are then within one update of true)."""

    path: str
    version: int
    created_ns: int
    devices: tuple[DeviceUsage, ...]
    processes: tuple[ProcessUsage, ...]
    consistent: bool = True

    def device(self, uuid: str) -> DeviceUsage:
        for d in self.devices:
            if d.uuid == uuid:
                return d
        known = ", ".join(d.uuid for d in self.devices) or "none yet"
        raise KeyError(f"device {uuid} is not in region {self.path} (devices: {known})")

    def limit(self, uuid: str) -> int | None:
        return self.device(uuid).limit

    def used(self, uuid: str) -> int:
        return self.device(uuid).used

    def peak(self, uuid: str) -> int:
        return self.device(uuid).peak

    @property
    def oom_refusals(self) -> int:
        return sum(d.oom_refusals for d in self.devices)

    @property
    def total_used(self) -> int:
        return sum(d.used for d in self.devices)

    def as_dict(self) -> dict:
        """Plain data for JSON (the monitor, the dashboard, ``gpuslice ps --json``)."""
        return {
            "path": self.path, "version": self.version, "created_ns": self.created_ns, "consistent": self.consistent,
            "devices": [dict(vars(d)) for d in self.devices],
            "processes": [{"pid": p.pid, "start_time": p.start_time, "oom_refusals": p.oom_refusals,
                           "used": dict(p.used), "peak": dict(p.peak), "contexts": dict(p.contexts),
                           "launches": dict(p.launches), "throttled_ns": dict(p.throttled_ns),
                           "busy_ns": dict(p.busy_ns)} for p in self.processes],
        }


def _pid_alive(pid: int, start_time: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # alive per kill(), /proc not visible: trust kill()
    rest = stat[stat.rfind(b")") + 2 :].split()
    if rest and rest[0] in (b"Z", b"X"):
        return False
    try:
        return not start_time or int(rest[19]) == start_time
    except (IndexError, ValueError):
        return True


def _check_header(path: str, data: bytes) -> tuple:
    if len(data) < 16:
        raise RegionError(path, f"file is {len(data)} bytes, too small for a region")
    magic, version = data[:8], struct.unpack_from("<I", data, 8)[0]
    if magic != MAGIC:
        raise RegionError(path, f"bad magic {magic!r} (not a gpuslice region)")
    if version != VERSION:
        raise RegionVersionError(path, version)
    if len(data) < TOTAL_SIZE:
        raise RegionError(path, f"file is {len(data)} bytes, version {VERSION} needs {TOTAL_SIZE}")
    h = _HEADER.unpack_from(data, 0)
    sizes = (h[2], h[3], h[4], h[5], h[6], h[7])
    if sizes != (HEADER_SIZE, TOTAL_SIZE, MAX_DEVICES, MAX_PROCS, DEVICE_SIZE, PROC_SIZE):
        raise RegionError(path, f"layout sizes {sizes} do not match version {VERSION}")
    return h


def _parse(path: str, data: bytes, consistent: bool) -> RegionSnapshot:
    h = _check_header(path, data)
    device_count = min(h[9], MAX_DEVICES)
    devices = []
    for i in range(device_count):
        uuid, limit, used, peak, refusals, overhead, compute, gen, _s = _DEVICE.unpack_from(data, HEADER_SIZE + i * DEVICE_SIZE)
        devices.append(DeviceUsage(i, uuid.split(b"\0", 1)[0].decode("ascii", "replace"),
                                   None if limit == UNLIMITED else limit, used, peak, refusals, overhead, compute, gen))
    uuids = [d.uuid for d in devices]
    procs = []
    base = HEADER_SIZE + MAX_DEVICES * DEVICE_SIZE
    for p in range(MAX_PROCS):
        off = base + p * PROC_SIZE
        pid, state, start_time, refusals, _r = _PROC_HEAD.unpack_from(data, off)
        if state != 1 or pid <= 0:
            continue
        arrays = [_U64X16.unpack_from(data, off + 32), _U64X16.unpack_from(data, off + 160),
                  _U32X16.unpack_from(data, off + 288), _U64X16.unpack_from(data, off + 352),
                  _U64X16.unpack_from(data, off + 480), _U64X16.unpack_from(data, off + 608)]
        maps = [{uuids[i]: a[i] for i in range(device_count) if a[i]} for a in arrays]
        waiting, waits, timeouts, waiting_bytes = struct.unpack_from("<4Q", data, off + 736)
        procs.append(ProcessUsage(pid, start_time, refusals, *maps, oom_waiting=waiting, oom_waiting_bytes=waiting_bytes,
                                  oom_waits=waits, oom_wait_timeouts=timeouts))
    return RegionSnapshot(path, h[1], h[11], tuple(devices), tuple(procs), consistent)


FLOOR_S = 0.001  # what a read may wait for an odd sequence even when a wait_budget is spent


class _WaitBudget:
    def __init__(self, seconds: float) -> None:
        self.left = seconds


_BUDGET: contextvars.ContextVar[_WaitBudget | None] = contextvars.ContextVar("gpuslice_region_wait", default=None)


@contextlib.contextmanager
def wait_budget(seconds: float) -> Iterator[None]:
    """Within the block, every :func:`read_region` together waits at most ``seconds`` for sequences left odd.
    A monitor reading every grant's region under one lock (the agent's sample) would otherwise wait ``timeout``
    per region a tenant holds odd on purpose: 40 such regions held every other user's API call for 2 s a
    second (helper 41, stop 38)."""
    token = _BUDGET.set(_WaitBudget(seconds))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def read_region(path: str | os.PathLike[str], timeout: float = 0.05) -> RegionSnapshot:
    """Copy the region at ``path`` consistently (seqlock) and decode it.

    Read with pread, never mapped: the file belongs to the slice's user, and a reader that maps it (root's
    agent, the kube-agent) would die of SIGBUS when that user truncates it (issue 15, attacker's review). A
    writer holds the seqlock for microseconds, so ``timeout`` is short: a sequence left odd (a writer that
    died mid-update, or a tenant holding it odd on purpose) costs a monitor at most that long per region,
    and the copy is returned flagged inconsistent.

    Raises :class:`RegionVersionError` for a layout version this reader does not know and
    :class:`RegionError` for anything else that is not a readable region (a file cut short included).
    """
    path = os.fspath(path)
    try:
        fd = open_regular(path)  # no link followed, no FIFO opened: a tenant may name the path
    except OSError as e:
        raise RegionError(path, f"cannot open: {e.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        # Magic and version first, so a file of another layout gets the version error, not a size one.
        _check_header(path, os.pread(fd, min(size, TOTAL_SIZE), 0))
        budget = _BUDGET.get()
        # every read may wait FLOOR_S whatever the budget says (an honest writer holds the lock for microseconds,
        # so a region caught mid-update still reads whole once the budget is gone: helper 42); only waiting
        # beyond it is charged
        wait = timeout if budget is None else min(timeout, max(FLOOR_S, budget.left))
        snap, waited = _copy(path, fd, wait)
        if budget is not None:
            budget.left -= max(0.0, waited - FLOOR_S)
        return snap
    finally:
        os.close(fd)


def _copy(path: str, fd: int, wait: float) -> tuple[RegionSnapshot, float]:
    """A consistent copy of the open region, or the last copy flagged inconsistent once ``wait`` seconds passed
    after the first try; and how long it waited (0 when the first try was consistent)."""
    first = None
    while True:
        # The counter is read on its own before and after the copy, never taken from the copy: one
        # pread is one kernel string copy, whose loads x86 may perform out of order, so a counter
        # taken from inside it can be read after the fields it guards. Measured with 3 writers on a
        # 2-core box: counter from the copy, 2 torn snapshots in 1.2 M reads (a device total one free
        # above the sum of its processes, as test_region once failed in CI); read on its own, 0 in
        # 0.8 M.
        s1 = _read_seq(fd)
        data = os.pread(fd, TOTAL_SIZE, 0)
        if len(data) < TOTAL_SIZE:
            raise RegionError(path, f"{len(data)} bytes, expected {TOTAL_SIZE} (cut short while read)")
        s2 = _read_seq(fd)
        now = time.monotonic()
        first = now if first is None else first
        if s1 == s2 and s1 % 2 == 0:
            return _parse(path, data, True), now - first
        if now - first >= wait:
            return _parse(path, data, False), now - first  # flagged, rather than block a monitor
        time.sleep(0.0002)


def _read_seq(fd: int) -> int:
    return struct.unpack("<Q", os.pread(fd, 8, SEQ_OFFSET).ljust(8, b"\0"))[0]


# ------------------------------------------------------------------------------------------ create
class _Libc:
    lib = None

    @classmethod
    def get(cls) -> ctypes.CDLL:
        if cls.lib is None:
            cls.lib = ctypes.CDLL(None, use_errno=True)
        return cls.lib


def _init_robust_mutex(mm: mmap.mmap) -> None:
    """Initialise the lock in place with glibc itself (PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST),
    exactly as the enforcer does, rather than writing glibc's private mutex layout by hand."""
    libc = _Libc.get()
    attr = ctypes.create_string_buffer(64)
    buf = (ctypes.c_char * 64).from_buffer(mm, LOCK_OFFSET)
    try:
        for call, args in (("pthread_mutexattr_init", (attr,)),
                           ("pthread_mutexattr_setpshared", (attr, 1)),  # PTHREAD_PROCESS_SHARED
                           ("pthread_mutexattr_setrobust", (attr, 1)),   # PTHREAD_MUTEX_ROBUST
                           ("pthread_mutex_init", (buf, attr))):
            rc = getattr(libc, call)(*args)
            if rc != 0:
                raise RegionError("(new region)", f"{call} failed: {os.strerror(rc)}")
        libc.pthread_mutexattr_destroy(attr)
    finally:
        del buf


def create_region(path: str | os.PathLike[str], devices: Iterable[str] = (),
                  limits: Mapping[str, int | None] | None = None, context_overhead: int = 0,
                  compute: int = 0, *, mode: int = 0o600, uid: int = -1, gid: int = -1) -> bool:
    """Create the region at ``path`` with device records for ``devices`` (limits in bytes, None =
    unlimited) unless it exists. Returns True if this call created it.

    Like the enforcer, the file is built complete under a temporary name and then linked into place,
    so a process of the slice never maps a half-written region; if someone else wins, theirs stays.
    ``context_overhead`` 0 here means the enforcer's processes use the value they are configured with
    only for device records they add themselves; records created here carry the given value.

    ``mode`` (default 0600: the owner alone) and the owner ``uid``/``gid`` (-1: this process's) are set on the
    file before it appears under its name: a region is writable by exactly the users whose processes form the
    slice (the trust model in ``native/README.md``).
    """
    path = os.fspath(path)
    devices = list(devices)
    limits = dict(limits or {})
    if len(devices) > MAX_DEVICES:
        raise RegionError(path, f"{len(devices)} devices; a region holds at most {MAX_DEVICES}")
    for u in devices:
        if not u.isascii() or len(u.encode()) >= 64:
            raise RegionError(path, f"device UUID {u!r} is not ASCII or is longer than 63 bytes")
    if os.path.exists(path):
        read_region(path)  # refuses a foreign/other-version file with a clear error
        return False
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if uid >= 0 or gid >= 0:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        os.ftruncate(fd, TOTAL_SIZE)
        with mmap.mmap(fd, TOTAL_SIZE) as mm:
            _HEADER.pack_into(mm, 0, MAGIC, VERSION, HEADER_SIZE, TOTAL_SIZE, MAX_DEVICES, MAX_PROCS,
                              DEVICE_SIZE, PROC_SIZE, 0, len(devices), 1, time.time_ns())
            _init_robust_mutex(mm)
            for i, u in enumerate(devices):
                lim = limits.get(u)
                _DEVICE.pack_into(mm, HEADER_SIZE + i * DEVICE_SIZE, u.encode(), UNLIMITED if lim is None else int(lim),
                                  0, 0, 0, int(context_overhead), int(compute), 0, b"")
            mm.flush()
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.close(fd)
        os.unlink(tmp)
