"""gpuslice.enforcer.devstate (slice record files, version 5) against files written by the native side
(devstate*.c) and hand-made ones."""

from __future__ import annotations

import os
import re
import struct
import time
from pathlib import Path

import pytest

from devstatekit import SAMPLE_UUID, build_writer, record_bytes, write_record, write_sample

from gpuslice.enforcer import devstate as compute


@pytest.fixture(scope="module")
def sample_writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """native/tests/test_devstate.c (its --write-sample mode) built with the real devstate*.c."""
    return build_writer(tmp_path_factory.mktemp("bin") / "devstate_writer")


def test_reads_what_the_native_side_wrote(sample_writer: Path, tmp_path: Path) -> None:
    """The reader and the native writer agree on the version 5 layout: one file per slice in the device's
    ``<uuid>.slices`` folder, named after its grant, with that slice's processes."""
    folder = write_sample(sample_writer, tmp_path)
    assert folder.name == compute.records_folder_name(SAMPLE_UUID)
    assert sorted(p.name for p in folder.iterdir()) == ["serve-b", "train-a"]
    dev = compute.read_device_state(folder)
    assert (dev.uuid, dev.path, dev.problems) == (SAMPLE_UUID, folder, ())
    assert compute.read_record(folder / "train-a").uuid == SAMPLE_UUID  # the header's uuid
    by = {s.grant: s for s in dev.slices}
    assert set(by) == {"train-a", "serve-b"}
    a, b = by["train-a"], by["serve-b"]
    assert (a.set_share, a.achieved_share, a.rate, a.throttled_share) == (30.0, 29.87, 30.0, 65.0)
    assert (a.mode, a.weight, a.priority, a.paced) == ("hard", 2, 1, True)
    assert a.launches == 4242
    assert a.busy_total_s == pytest.approx(0.123456789)
    assert a.throttled_total_s == pytest.approx(0.987654321)
    assert len(a.processes) == 1 and a.processes[0].busy and a.processes[0].busy_total_s == pytest.approx(0.123456789)
    # the writer's PID namespace and a heartbeat taken at join (CLOCK_MONOTONIC, like time.monotonic())
    assert a.processes[0].pid_namespace == os.stat("/proc/self/ns/pid").st_ino
    assert 0 <= a.processes[0].heartbeat_age() < 60
    # the path its launches take and its offered load
    assert (a.processes[0].path, a.processes[0].offered_load, a.processes[0].measured) == ("turns", 12.3456, True)
    # the writer process has exited; its records stay until a native process reaps them
    assert (b.set_share, b.achieved_share, b.mode, b.priority, b.paced) == (100.0, None, "soft", 0, False)
    assert len(b.processes) == 1 and not b.processes[0].measured
    assert (b.processes[0].path, b.processes[0].offered_load) == ("light", None)
    assert compute.read_all(tmp_path)[0].slices == dev.slices


def _blank(version: int = compute.VERSION, size: int = compute.FILE_SIZE, magic: int = compute.MAGIC) -> bytearray:
    buf = bytearray(compute.FILE_SIZE)
    struct.pack_into("<QIIIIIIII", buf, 0, magic, version, size, 32, 256, 256, 65536, 128, 0)
    buf[56:64] = b"GPU-test"
    return buf


def test_the_header_is_the_version_5_layout() -> None:
    """Offsets and sizes as native/include/gpuslice/devstate.h: 69632 bytes, the slice record at 256, 32 process
    records at 65536, ``updates`` at 48 and the uuid at 56; magic 0x004345524C535347."""
    assert (compute.FILE_SIZE, compute.SLICE_OFF, compute.PROC_OFF, compute.MAX_PROCS) == (69632, 256, 65536, 32)
    assert compute.MAGIC == 0x004345524C535347 and compute._HEADER.size == 120
    assert compute._SLICE.size == 233 and compute._PROC.size == 93
    assert compute.parse_device_state(bytes(_blank())).uuid == "GPU-test"
    header = (Path(__file__).resolve().parents[2] / "native/include/gpuslice/devstate.h").read_text()
    defined = dict(re.findall(r"#define (GS_DS_\w+) +([0-9A-Fa-fx]+)(?:ULL|u)?\b", header))
    assert int(defined["GS_DS_MAGIC"], 16) == compute.MAGIC and int(defined["GS_DS_VERSION"]) == compute.VERSION
    assert (int(defined["GS_DS_PROC_OFF"]), int(defined["GS_DS_SLOT_PROCS"])) == (compute.PROC_OFF, compute.MAX_PROCS)
    assert '#define GS_DS_FOLDER_SUFFIX "%s"' % compute.RECORDS_SUFFIX in header


def test_hand_packed_slice_and_process_fields() -> None:
    """Every field the reader reports, at its offset; all in-use process records of a file are its slice's
    (their ``slice`` field is no index any more)."""
    buf = _blank()
    off = compute.SLICE_OFF
    struct.pack_into("<IIBBBBI", buf, off, 1, 4500, 1, 7, 0, 1, 5200)
    buf[off + 16 : off + 16 + 5] = b"hello"
    struct.pack_into("<ii", buf, off + 216, 5150, 1234)
    for k, pid in ((0, 4242), (31, 4343)):  # the first and the last record
        poff = compute.PROC_OFF + k * compute.PROC_SIZE
        struct.pack_into("<iIiI", buf, poff, pid, 1 | 2, 7, 0)  # slice 7: ignored
        struct.pack_into("<qQq", buf, poff + 64, 7_500_000_000, 4026532178, 1_000_000_000)  # heartbeat, pidns, joined
        struct.pack_into("<IB", buf, poff + 88, 4200, 1)  # offered load 0.42, the free path
    (s,) = compute.parse_device_state(bytes(buf)).slices
    assert (s.grant, s.set_share, s.rate, s.achieved_share, s.throttled_share) == ("hello", 45.0, 52.0, 51.5, 12.34)
    assert (s.mode, s.weight, s.priority, s.paced) == ("soft", 7, 0, True)
    assert [(p.pid, p.busy, p.pid_namespace, p.heartbeat_s) for p in s.processes] == [
        (4242, True, 4026532178, 7.5), (4343, True, 4026532178, 7.5)]
    assert (s.processes[0].path, s.processes[0].offered_load) == ("free", 0.42)
    assert s.processes[0].heartbeat_age(10.0) == pytest.approx(2.5)
    assert s.colocation == "preemptive"
    buf[off + 232] = 2
    struct.pack_into("<B", buf, compute.PROC_OFF + 92, 3)
    (s,) = compute.parse_device_state(bytes(buf)).slices
    assert (s.colocation, s.processes[0].path) == ("tidal", "yield")


@pytest.mark.parametrize(
    ("buf", "err", "match"),
    [
        (_blank(version=4, size=16640 + 16384), compute.UnknownDeviceStateVersion, "version 4"),  # the shared .dev
        (_blank(version=6), compute.UnknownDeviceStateVersion, "version 6"),
        (_blank(size=999), compute.UnknownDeviceStateVersion, "size 999"),
        (_blank(magic=0x1234), compute.DeviceStateError, "not a gpuslice slice record"),
        (_blank()[:100], compute.DeviceStateError, "too short"),
        (_blank()[: compute.FILE_SIZE - 8], compute.DeviceStateError, "expected"),
        (_blank() + b"x", compute.DeviceStateError, "expected"),
    ],
)
def test_refuses_unknown_or_damaged(buf: bytearray, err: type[Exception], match: str) -> None:
    """A layout it does not know is UnknownDeviceStateVersion (naming the version), anything else not ours a
    DeviceStateError: never a crash, never a misread."""
    with pytest.raises(err, match=match):
        compute.parse_device_state(bytes(buf))


def test_the_reader_skips_empty_files_and_reads_each_slices_processes(tmp_path: Path) -> None:
    """An empty file is one its manager made before any process joined (and one sized but not yet written reads
    the same): no slice. A record not in use is left out. Every other file is its slice, with its processes."""
    write_record(tmp_path, SAMPLE_UUID, "g-busy", pids=(101, 102), achieved_bp=2950, busy_ns=4 * 10**9)
    write_record(tmp_path, SAMPLE_UUID, "g-idle", in_use=False, pids=(103,))
    folder = tmp_path / compute.records_folder_name(SAMPLE_UUID)
    (folder / "g-new").touch()
    (folder / "g-sized").write_bytes(bytes(compute.FILE_SIZE))
    dev = compute.read_device_state(folder)
    assert dev.problems == ()
    (s,) = dev.slices
    assert (s.grant, s.achieved_share, s.busy_total_s) == ("g-busy", 29.5, 4.0)
    assert [(p.pid, p.busy, p.path) for p in s.processes] == [(101, True, "turns"), (102, True, "turns")]
    assert compute.read_record(folder / "g-new") is None


def test_a_tenants_bad_file_is_named_and_skipped_never_the_whole_device(tmp_path: Path) -> None:
    """Each slice's tenant writes its own file: garbage, an unknown version, a record claiming another grant's
    name, or a link are each named in ``problems`` and skipped; the neighbours' slices still read."""
    write_record(tmp_path, SAMPLE_UUID, "g-good", pids=(7,))
    folder = tmp_path / compute.records_folder_name(SAMPLE_UUID)
    (folder / "g-garbage").write_bytes(b"\xff" * compute.FILE_SIZE)
    (folder / "g-future").write_bytes(record_bytes("g-future", version=6))
    (folder / "g-liar").write_bytes(record_bytes("g-good"))
    (folder / "g-link").symlink_to(folder / "g-good")
    (folder / ".tmp-x").write_bytes(b"ignored: never a grant's name")
    dev = compute.read_device_state(folder)
    assert [s.grant for s in dev.slices] == ["g-good"]
    problems = "\n".join(dev.problems)
    assert len(dev.problems) == 4, problems
    for name in ("g-garbage", "g-future", "g-liar", "g-link"):
        assert f"{folder / name}:" in problems
    assert "version 6" in problems and "names grant 'g-good'" in problems
    with pytest.raises(compute.UnknownDeviceStateVersion, match="g-future: slice record version 6"):
        compute.read_record(folder / "g-future")


def test_missing(tmp_path: Path) -> None:
    """No folder: read_all finds nothing; asking for one names what is missing."""
    assert compute.read_all(tmp_path / "nope") == []
    assert compute.read_all(tmp_path) == []
    with pytest.raises(compute.DeviceStateError, match="no such slice records folder"):
        compute.read_device_state(tmp_path / "x.slices")
    with pytest.raises(compute.DeviceStateError, match="no such slice record file"):
        compute.read_record(tmp_path / "g-1")


def test_a_fifo_or_link_in_place_of_a_record_or_folder_is_refused_at_once(tmp_path: Path) -> None:
    """Root's monitor reads these files: no link followed (a folder or a file), no FIFO opened (it would hang)."""
    folder = tmp_path / "GPU-x.slices"
    folder.mkdir()
    os.mkfifo(folder / "g-fifo")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "GPU-link.slices").symlink_to(tmp_path / "elsewhere")
    started = time.monotonic()
    with pytest.raises(compute.DeviceStateError):
        compute.read_record(folder / "g-fifo")
    assert "g-fifo" in compute.read_device_state(folder).problems[0]
    with pytest.raises(compute.DeviceStateError, match="a link, never followed"):
        compute.read_device_state(tmp_path / "GPU-link.slices")
    assert [d.uuid for d in compute.read_all(tmp_path)] == ["GPU-x"]  # the link is left out
    assert time.monotonic() - started < 5


def test_names_follow_the_pacer() -> None:
    """The pacer names a device's files after ``cuDeviceGetUuid_v2`` printed as GPU-<hex>: a MIG instance's own
    UUID with GPU-."""
    mig = "MIG-0b0c7a3e-1f2d-5a6b-9c8d-7e6f5a4b3c2d"
    assert compute.device_stem(mig) == "GPU-0b0c7a3e-1f2d-5a6b-9c8d-7e6f5a4b3c2d"
    assert compute.records_folder_name(mig) == "GPU-0b0c7a3e-1f2d-5a6b-9c8d-7e6f5a4b3c2d.slices"
    assert compute.records_folder_name("GPU-aaaa") == "GPU-aaaa.slices"
