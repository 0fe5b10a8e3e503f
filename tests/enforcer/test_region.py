"""gpuslice.enforcer.region against regions written by the real enforcer (over the CPU driver double):
consistent snapshots while writers run, limits from a region Python created, dead processes,
and clear refusals of files that are not a region this version knows."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslice.enforcer.region import (MAGIC, TOTAL_SIZE, RegionError, RegionVersionError, create_region, read_region)
from gpuslice.enforcer.slicefile import write_slice_file

from .conftest import double_uuid

MiB = 1 << 20
U0 = double_uuid(0)


def start_writer(build: Path, env: dict[str, str], seconds: float, threads: int = 4) -> subprocess.Popen:
    p = subprocess.Popen([str(build / "helpers" / "region_writer"), str(seconds), str(threads)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")
    return p


def test_snapshots_consistent_while_writers_run(tmp_path: Path, native_build: Path, slice_env) -> None:
    region = tmp_path / "slice.region"
    limit = 200 * MiB
    conf = tmp_path / "slice.conf"
    write_slice_file(conf, devices=(U0,), memory_limit=limit, region=str(region), context_overhead=8 * MiB)
    writers = [start_writer(native_build, slice_env(conf), 2.0, threads=2) for _ in range(3)]
    seen, busy = 0, 0
    while any(w.poll() is None for w in writers):
        s = read_region(region)
        assert s.consistent
        d = s.device(U0)
        assert d.limit == limit
        assert d.used == sum(p.used.get(U0, 0) for p in s.processes), "device total = sum of its processes"
        assert d.used <= limit and d.peak <= limit, "never over the limit, at any instant"
        seen += 1
        busy += d.used > 3 * 8 * MiB
    outs = [w.communicate() for w in writers]
    assert all(w.returncode == 0 for w in writers), outs
    assert seen > 20 and busy > 0
    refused = sum(int(o[0].split()[-1]) for o in outs)
    final = read_region(region)
    assert final.oom_refusals == refused > 0  # 3 x 2 threads x up to 16 x 32 MiB against 200 MiB: refusals happen
    assert final.used(U0) == 0 and final.processes == ()  # normal exit gives records back
    assert final.peak(U0) <= limit


def test_python_created_region_is_used_by_the_enforcer(tmp_path: Path, native_build: Path, slice_env) -> None:
    region = tmp_path / "slice.region"
    assert create_region(region, [U0], {U0: 64 * MiB}, context_overhead=4 * MiB) is True
    assert create_region(region, [U0], {U0: 1 << 40}) is False  # first comer wins
    conf = tmp_path / "slice.conf"
    write_slice_file(conf, devices=(U0,), memory_limit=1 << 30, region=str(region), context_overhead=4 * MiB)
    w = start_writer(native_build, slice_env(conf), 0.5, threads=2)
    peak = 0
    while w.poll() is None:
        s = read_region(region)
        peak = max(peak, s.used(U0))
        assert s.limit(U0) == 64 * MiB
    w.communicate()
    assert w.returncode == 0
    assert 0 < peak <= 64 * MiB and read_region(region).peak(U0) <= 64 * MiB


def test_dead_process_seen_and_reclaimed(tmp_path: Path, native_build: Path, slice_env) -> None:
    region = tmp_path / "slice.region"
    conf = tmp_path / "slice.conf"
    write_slice_file(conf, devices=(U0,), memory_limit=1 << 30, region=str(region), context_overhead=4 * MiB)
    victim = start_writer(native_build, slice_env(conf), 30)
    time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    s = read_region(region)
    (p,) = s.processes
    assert p.pid == victim.pid and not p.alive() and p.used[U0] >= 4 * MiB
    assert p.contexts[U0] >= 1
    d = s.as_dict()
    assert d["devices"][0]["uuid"] == U0 and d["processes"][0]["pid"] == victim.pid
    json.dumps(d)  # plain data
    w = start_writer(native_build, slice_env(conf), 0.1, threads=1)  # attaching reclaims the dead
    s = read_region(region)
    assert victim.pid not in [q.pid for q in s.processes]
    assert all(q.alive() for q in s.processes)
    w.communicate()


def _file(path: Path, magic: bytes, version: int, size: int = TOTAL_SIZE) -> None:
    data = bytearray(size)
    data[:8] = magic
    struct.pack_into("<I", data, 8, version)
    path.write_bytes(bytes(data))


def test_unknown_version_refused_by_python_and_enforcer(tmp_path: Path, native_build: Path, slice_env) -> None:
    region = tmp_path / "slice.region"
    _file(region, MAGIC, 2)
    with pytest.raises(RegionVersionError) as e:
        read_region(region)
    assert e.value.version == 2 and "version 2 is not supported" in str(e.value)
    with pytest.raises(RegionVersionError):
        create_region(region, [U0])
    conf = tmp_path / "slice.conf"
    write_slice_file(conf, devices=(U0,), memory_limit=1 << 30, region=str(region))
    r = subprocess.run([str(native_build / "helpers" / "region_writer"), "0.1", "1"], env=slice_env(conf),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cuInit refused" in r.stderr
    assert "version 2 is not supported" in r.stderr  # the enforcer's one log line says why


@pytest.mark.parametrize("content,match", [
    (b"", "too small"),
    (b"NOTAREGN" + b"\0" * 200, "bad magic"),
    (MAGIC + struct.pack("<I", 1) + b"\0" * 100, "needs 105600"),
])
def test_not_a_region(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "r"
    p.write_bytes(content)
    with pytest.raises(RegionError, match=match):
        read_region(p)


def test_missing_region(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="cannot open"):
        read_region(tmp_path / "nope")


def test_torn_writer_flagged_not_blocking(tmp_path: Path) -> None:
    """A writer that died mid-update leaves seq odd; the reader returns promptly, flagged."""
    region = tmp_path / "r"
    create_region(region, [U0], {U0: MiB})
    with open(region, "r+b") as f:
        f.seek(40)
        f.write(struct.pack("<Q", 7))
    t = time.monotonic()
    s = read_region(region, timeout=0.05)
    assert not s.consistent and time.monotonic() - t < 1
    assert s.limit(U0) == MiB


def test_created_region_permissions(tmp_path: Path) -> None:
    """A region is its owner's alone unless its creator says otherwise (the trust model, native/README.md):
    0600 by default; the device plugin asks 0666 for a container's folder, which only that container sees."""
    region = tmp_path / "r"
    create_region(region, [U0])
    assert os.stat(region).st_mode & 0o777 == 0o600
    assert read_region(region).limit(U0) is None
    shared = tmp_path / "shared"
    create_region(shared, [U0], mode=0o666)
    assert os.stat(shared).st_mode & 0o777 == 0o666


def test_a_region_path_that_is_a_link_or_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Root's monitor reads regions in folders tenants may write: a link is not followed, a FIFO not opened."""
    target = tmp_path / "r"
    create_region(target, [U0])
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(RegionError, match="cannot open"):
        read_region(link)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t = time.monotonic()
    with pytest.raises(RegionError, match="cannot open"):
        read_region(fifo)
    assert time.monotonic() - t < 5


def test_a_region_its_owner_keeps_truncating_never_kills_the_reader(tmp_path: Path) -> None:
    """The region is its slice user's file; root's agent reads it. A reader that mapped it died of SIGBUS when
    the owner cut the file short mid-read (issue 15); read by pread it gets a snapshot or a RegionError.
    Runs in a child so that a SIGBUS fails this test instead of ending the test run."""
    region = tmp_path / "r"
    create_region(region, [U0], {U0: MiB})
    code = f"""
import os, threading, time
from gpuslice.enforcer.region import RegionError, TOTAL_SIZE, read_region
path, stop = {str(region)!r}, time.monotonic() + 1.0
def cut():
    while time.monotonic() < stop:
        os.truncate(path, 4096)
        os.truncate(path, TOTAL_SIZE)
threading.Thread(target=cut, daemon=True).start()
reads = errors = 0
while time.monotonic() < stop:
    try:
        read_region(path)
        reads += 1
    except RegionError:
        errors += 1
print(reads + errors)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])  # -7 would be SIGBUS
    assert int(done.stdout) > 10


def test_regions_held_odd_share_one_wait_within_a_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant may hold its regions' sequence odd on purpose; a monitor reading every grant's region under one
    lock waited the timeout for each (40 such regions: 2 s a sample, every other user's API call behind it:
    helper 41). Within ``wait_budget`` all reads together wait at most the budget, and each still returns its
    copy, flagged; outside one, each region keeps its own timeout."""
    from gpuslice.enforcer import region as mod

    class Clock:  # the reader's clock, advanced only by its own sleeps: the waits are counted, not timed
        t = 0.0

        def monotonic(self) -> float:
            return self.t

        def sleep(self, d: float) -> None:
            self.t += d

    paths = []
    for k in range(40):
        paths.append(tmp_path / f"r{k}")
        create_region(paths[-1], [U0], {U0: MiB})
        with open(paths[-1], "r+b") as f:
            f.seek(40)
            f.write(struct.pack("<Q", 7))
    clock = Clock()
    monkeypatch.setattr(mod, "time", clock)
    with mod.wait_budget(0.05):
        snaps = [read_region(p, timeout=0.05) for p in paths]
    # the budget, and then each region its floor (an honest region caught mid-update still gets that long)
    assert clock.t < 0.05 + 40 * (mod.FLOOR_S + 0.0003) and all(not s.consistent and s.limit(U0) == MiB for s in snaps)
    clock.t = 0.0
    read_region(paths[0], timeout=0.05)
    read_region(paths[1], timeout=0.05)
    assert clock.t >= 0.1  # no budget: each region its own timeout
