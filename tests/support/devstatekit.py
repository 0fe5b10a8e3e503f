"""A per-device pacing file written by the real native code (native/tests/test_devstate.c --write-sample with
native/src/pacing/devstate.c): slices ``train-a`` (30 %, paced) and ``serve-b`` (unpaced) on
GPU-00000000-1111-2222-3333-444444444444. ``as_grant`` copies it under another device's name with
``train-a`` renamed, for tests whose ledger hands out its own grant ids and devices."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuslice.enforcer import devstate

NATIVE = Path(__file__).resolve().parents[2] / "native"
NAME_OFF = 16  # the grant name inside a slice record (128 bytes, NUL-padded)


def build_writer(out: Path) -> Path:
    """Compile the sample writer into ``out`` (skips the test without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the native writer")
    sources = [NATIVE / "tests/test_devstate.c", NATIVE / "src/pacing/devstate.c", NATIVE / "src/pacing/devstate_guard.c",
               NATIVE / "src/pacing/devstate_lock.c"]
    subprocess.run([cc, "-std=c11", "-O1", "-pthread", f"-I{NATIVE / 'include'}", *map(str, sources), "-o", str(out)],
                   check=True)
    return out


def write_sample(writer: Path, folder: Path) -> Path:
    subprocess.run([str(writer), "--write-sample", str(folder)], check=True, capture_output=True)
    (p,) = list(folder.glob("*.dev"))
    return p


def as_grant(writer: Path, folder: Path, device_uuid: str, grant: str) -> Path:
    """The sample's file as ``<folder>/<device_uuid>.dev``, its paced slice ``train-a`` named ``grant``."""
    scratch = folder / ".sample"
    scratch.mkdir(parents=True, exist_ok=True)
    data = bytearray(write_sample(writer, scratch).read_bytes())
    shutil.rmtree(scratch)
    for i in range(devstate.MAX_SLICES):
        off = devstate.SLICE_OFF + i * devstate.SLICE_SIZE + NAME_OFF
        if bytes(data[off:off + 8]) == b"train-a\0":
            data[off:off + 128] = grant.encode().ljust(128, b"\0")
    target = folder / f"{device_uuid}.dev"
    target.write_bytes(bytes(data))
    return target
