"""Slice record files (layout version 5, :mod:`gpuslice.enforcer.devstate`) for tests.

``build_writer`` / ``write_sample``: written by the real native code (native/tests/test_devstate.c --write-sample
with native/src/pacing/devstate*.c): slices ``train-a`` (30 %, paced) and ``serve-b`` (unpaced) on
GPU-00000000-1111-2222-3333-444444444444, one file each in the device's ``.slices`` folder.
``record_bytes`` / ``write_record``: a file packed here by hand, for tests about something else than the native
writer's agreement with the reader (the monitor, root never writing a tenant's file).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuslice.enforcer import devstate

NATIVE = Path(__file__).resolve().parents[2] / "native"
SAMPLE_UUID = "GPU-00000000-1111-2222-3333-444444444444"
# The config parser the pacer's roster reader (policy.c) needs, as the native Makefile's CONFIG_SRC.
CONFIG_SOURCES = ("src/config/config.c", "src/config/colocation.c", "src/config/dump.c", "src/config/devices.c")


def build_writer(out: Path) -> Path:
    """Compile the sample writer into ``out`` (skips the test without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the native writer")
    sources = [NATIVE / "tests/test_devstate.c", *sorted((NATIVE / "src/pacing").glob("devstate*.c")),
               NATIVE / "src/pacing/policy.c", *(NATIVE / s for s in CONFIG_SOURCES)]
    subprocess.run([cc, "-std=c11", "-O1", "-pthread", f"-I{NATIVE / 'include'}", *map(str, sources), "-o", str(out)],
                   check=True)
    return out


def write_sample(writer: Path, folder: Path) -> Path:
    """The sample written into ``folder``; the device's records folder (``<uuid>.slices``)."""
    subprocess.run([str(writer), "--write-sample", str(folder)], check=True, capture_output=True)
    (p,) = list(folder.glob(f"*{devstate.RECORDS_SUFFIX}"))
    return p


def record_bytes(grant: str, uuid: str = SAMPLE_UUID, *, share_bp: int = 3000, achieved_bp: int = -1,
                 busy_ns: int = 0, throttled_ns: int = 0, throttled_bp: int = 0, launches: int = 0,
                 pids: tuple[int, ...] = (), version: int = devstate.VERSION, size: int = devstate.FILE_SIZE,
                 magic: int = devstate.MAGIC, in_use: bool = True) -> bytes:
    """One slice record file: header, ``grant``'s slice record (hard, weight 1, low priority, paced at
    ``share_bp``) and a busy process record for each of ``pids`` (heartbeat 7.5 s, PID namespace 4026532178)."""
    buf = bytearray(devstate.FILE_SIZE)
    devstate._HEADER.pack_into(buf, 0, magic, version, size, devstate.MAX_PROCS, devstate.SLICE_OFF,
                               devstate.SLICE_SIZE, devstate.PROC_OFF, devstate.PROC_SIZE, 0, 1, 7, uuid.encode())
    devstate._SLICE.pack_into(buf, devstate.SLICE_OFF, int(in_use), share_bp, 0, 1, 1, 1, share_bp, grant.encode(), 0,
                              0, 0, busy_ns, throttled_ns, launches, 0, 0, 0, achieved_bp, throttled_bp, 0, 0)
    for i, pid in enumerate(pids):
        devstate._PROC.pack_into(buf, devstate.PROC_OFF + i * devstate.PROC_SIZE, pid, 1 | 2, 0, 0, 0, 0, 0, busy_ns,
                                 0, 0, 7_500_000_000, 4026532178, 1_000_000_000, 0, 2)
    return bytes(buf)


def write_record(device_state: Path, uuid: str, grant: str, **kw) -> Path:
    """``record_bytes`` written as ``<device_state>/<stem>.slices/<grant>`` (the folder made if missing; an
    existing file is written in place, as a running slice's processes do)."""
    folder = device_state / devstate.records_folder_name(uuid)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / grant
    with open(target, "r+b" if target.exists() else "wb") as f:
        f.write(record_bytes(grant, uuid, **kw))
    return target
