"""gpuslice.enforcer.devstate against files written by the native side (devstate.c) and hand-made ones."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from devstatekit import build_writer, write_sample

from gpuslice.enforcer import devstate as compute


@pytest.fixture(scope="module")
def sample_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """native/tests/test_devstate.c (its --write-sample mode) built with the real devstate.c."""
    return build_writer(tmp_path_factory.mktemp("bin") / "devstate_writer")


def test_reads_what_the_native_side_wrote(sample_writer: Path, tmp_path: Path) -> None:
    p = write_sample(sample_writer, tmp_path)
    dev = compute.read_device_state(p)
    assert dev.uuid == "GPU-00000000-1111-2222-3333-444444444444"
    assert p.name == dev.uuid + ".dev"
    by = {s.grant: s for s in dev.slices}
    assert set(by) == {"train-a", "serve-b"}
    a, b = by["train-a"], by["serve-b"]
    assert (a.set_share, a.achieved_share, a.rate, a.throttled_share) == (30.0, 29.87, 30.0, 65.0)
    assert (a.mode, a.weight, a.priority, a.paced) == ("hard", 2, 1, True)
    assert a.launches == 4242
    assert a.busy_total_s == pytest.approx(0.123456789)
    assert a.throttled_total_s == pytest.approx(0.987654321)
    assert len(a.processes) == 1 and a.processes[0].busy and a.processes[0].busy_total_s == pytest.approx(0.123456789)
    # v2: the writer's PID namespace and a heartbeat taken at join (CLOCK_MONOTONIC, like time.monotonic())
    assert a.processes[0].pid_namespace == os.stat("/proc/self/ns/pid").st_ino
    assert 0 <= a.processes[0].heartbeat_age() < 60
    # v3: the path its launches take and its offered load
    assert (a.processes[0].path, a.processes[0].offered_load, a.processes[0].measured) == ("turns", 12.3456, True)
    # the writer process has exited; its records stay until a native process reaps them
    assert (b.set_share, b.achieved_share, b.mode, b.priority, b.paced) == (100.0, None, "soft", 0, False)
    assert len(b.processes) == 1 and not b.processes[0].measured
    assert (b.processes[0].path, b.processes[0].offered_load) == ("light", None)
    assert compute.read_all(tmp_path)[0].slices == dev.slices


def _blank(version: int = compute.VERSION, size: int = compute.FILE_SIZE, magic: int = compute.MAGIC) -> bytearray:
    buf = bytearray(compute.FILE_SIZE)
    struct.pack_into("<QIIIIIIII", buf, 0, magic, version, size, 32, 128, 256, 256, 256 + 32 * 256, 128)
    buf[64:72] = b"GPU-test"
    return buf


def test_hand_packed_slice_fields() -> None:
    buf = _blank()
    off = compute.SLICE_OFF + 3 * compute.SLICE_SIZE  # any slot
    struct.pack_into("<IIBBBBI", buf, off, 1, 4500, 1, 7, 0, 1, 5200)
    buf[off + 16 : off + 16 + 5] = b"hello"
    struct.pack_into("<ii", buf, off + 216, 5150, 1234)
    poff = compute.PROC_OFF + 100 * compute.PROC_SIZE
    struct.pack_into("<iIiI", buf, poff, 4242, 1 | 2, 3, 0)
    struct.pack_into("<qQq", buf, poff + 64, 7_500_000_000, 4026532178, 1_000_000_000)  # heartbeat, pidns, joined
    struct.pack_into("<IB", buf, poff + 88, 4200, 1)  # v3: offered load 0.42, the free path
    (s,) = compute.parse_device_state(bytes(buf)).slices
    assert (s.grant, s.set_share, s.rate, s.achieved_share, s.throttled_share) == ("hello", 45.0, 52.0, 51.5, 12.34)
    assert (s.mode, s.weight, s.priority, s.paced) == ("soft", 7, 0, True)
    assert [(p.pid, p.busy, p.pid_namespace, p.heartbeat_s) for p in s.processes] == [(4242, True, 4026532178, 7.5)]
    assert (s.processes[0].path, s.processes[0].offered_load) == ("free", 0.42)
    assert s.processes[0].heartbeat_age(10.0) == pytest.approx(2.5)
    assert s.colocation == "preemptive"  # 0 at byte 232: what enforcers before issue 13 wrote
    buf[off + 232] = 2
    struct.pack_into("<B", buf, poff + 92, 3)
    (s,) = compute.parse_device_state(bytes(buf)).slices
    assert (s.colocation, s.processes[0].path) == ("tidal", "yield")


@pytest.mark.parametrize(
    ("buf", "err", "match"),
    [
        (_blank(version=5), compute.UnknownDeviceStateVersion, "version 5"),
        (_blank(version=2), compute.UnknownDeviceStateVersion, "version 2"),  # same layout, other writers' rules
        (_blank(version=1, size=16640), compute.UnknownDeviceStateVersion, "version 1"),  # the 64-byte records
        (_blank(size=999), compute.UnknownDeviceStateVersion, "size 999"),
        (_blank(magic=0x1234), compute.DeviceStateError, "not a gpuslice device state"),
        (_blank()[:100], compute.DeviceStateError, "too short"),
        (_blank()[: compute.FILE_SIZE - 8], compute.DeviceStateError, "expected"),
    ],
)
def test_refuses_unknown_or_damaged(buf: bytearray, err: type[Exception], match: str) -> None:
    with pytest.raises(err, match=match):
        compute.parse_device_state(bytes(buf))


def test_reads_version_3_files_of_the_same_layout() -> None:
    """Version 4 changed the writers' lock, not the layout: ``ps`` shows a node in the middle of an upgrade."""
    assert compute.parse_device_state(bytes(_blank(version=3))).uuid == "GPU-test"


def test_missing(tmp_path: Path) -> None:
    assert compute.read_all(tmp_path / "nope") == []
    with pytest.raises(compute.DeviceStateError, match="no such"):
        compute.read_device_state(tmp_path / "x.dev")


def test_a_fifo_or_link_in_place_of_a_device_state_file_is_refused_at_once(tmp_path):
    """Root's monitor reads these files in a folder every tenant may write: no link followed, no FIFO opened."""
    import os
    import time

    from gpuslice.enforcer.devstate import DeviceStateError, read_device_state

    fifo = tmp_path / "GPU-fifo.dev"
    os.mkfifo(fifo)
    link = tmp_path / "GPU-link.dev"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"x" * 64)
    started = time.monotonic()
    for path in (fifo, link):
        with pytest.raises(DeviceStateError):
            read_device_state(path)
    assert time.monotonic() - started < 5
