"""gpuslice.host.procs: what counts as a process that is gone."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslice.host import procs


def test_a_process_that_does_not_exist_is_gone() -> None:
    assert procs.stat(2**22 + 1) is None and not procs.alive(2**22 + 1, 0)
    me = procs.stat(os.getpid())
    assert me is not None and procs.alive(os.getpid(), me.start)


def test_running_out_of_file_descriptors_is_not_taken_for_a_process_that_ended(monkeypatch) -> None:
    """A tenant's connection flood made /proc unreadable (EMFILE); taking that for "gone" would let the
    reclaimer free a grant whose processes still run."""
    def emfile(self: Path, *a, **k) -> bytes:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Path, "read_bytes", emfile)
    with pytest.raises(OSError) as err:
        procs.stat(os.getpid())
    assert err.value.errno == errno.EMFILE


def test_an_environment_still_being_laid_out_is_cannot_tell(tmp_path, monkeypatch) -> None:
    """A process mid-exec reads an empty environment after its parent is back from Popen, and its stat line's
    env_end (field 51) is still 0: "cannot tell", not "unmarked" (taking it for unmarked let the ledger miss a
    marked process: stop 36's CI). Once laid out, an empty environment is a plain no."""
    monkeypatch.setattr(procs, "PROC", tmp_path)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "environ").write_bytes(b"")
    fields = ["S"] + ["0"] * 49  # fields 3..52 of a stat line
    (tmp_path / "7" / "stat").write_text("7 (a b) " + " ".join(fields) + "\n")
    assert procs.environ_has(7, "GPUSLICE_SLICE=/s") is None
    fields[48] = "140737488351000"  # env_end set: the environment is laid out, and empty
    (tmp_path / "7" / "stat").write_text("7 (a b) " + " ".join(fields) + "\n")
    assert procs.environ_has(7, "GPUSLICE_SLICE=/s") is False
    # the kernel sets env_end before it copies the environment's pointers: a copy that ends between two reads
    reads = iter([b"", b"GPUSLICE_SLICE=/s\0"])
    monkeypatch.setattr(procs, "_environ", lambda pid: next(reads))
    assert procs.environ_has(7, "GPUSLICE_SLICE=/s") is True
    # env_end set between the empty read and the look at it: still "cannot tell" (the answer is of the read)
    monkeypatch.setattr(procs, "_environ", lambda pid: b"")
    looks = iter([False, True, True, True])
    monkeypatch.setattr(procs, "_env_laid_out", lambda pid: next(looks))
    assert procs.environ_has(7, "GPUSLICE_SLICE=/s") is None


def test_a_real_process_environment_is_read_once_exec_is_done() -> None:
    """The same on real processes: an empty environment reads as "no" and a marked one as "yes" once their exec
    is done (until then, "cannot tell")."""
    bare = subprocess.Popen(["sleep", "60"], env={})
    marked = subprocess.Popen(["sleep", "60"], env={"GPUSLICE_SLICE": "/s"})
    try:
        deadline = time.monotonic() + 30
        seen = {}
        for name, p in (("bare", bare), ("marked", marked)):
            while (answer := procs.environ_has(p.pid, "GPUSLICE_SLICE=/s")) is None:
                assert time.monotonic() < deadline and p.poll() is None, f"{name}: never laid out"
                time.sleep(0.01)
            seen[name] = answer
        assert seen == {"bare": False, "marked": True}
        assert procs.environ_has(marked.pid, "GPUSLICE_SLICE=/t") is False
    finally:
        for p in (bare, marked):
            p.kill()
            p.wait()


def test_a_process_name_that_is_not_utf8_is_read(tmp_path, monkeypatch) -> None:
    """A process's name is its owner's to set to any bytes; one that is not UTF-8 (in stat, status and comm) made
    every scan of the processes raise, and with it every `gpuslice run` on the machine end in a traceback (helper
    40, stop 38). It reads as a name like any other, its fields intact."""
    monkeypatch.setattr(procs, "PROC", tmp_path)
    (tmp_path / "9").mkdir()
    fields = ["S", "1", "9"] + ["0"] * 16 + ["4242"] + ["0"] * 28 + ["140737488351000", "0"]
    (tmp_path / "9" / "stat").write_bytes(b"9 (ab\xff) c) " + " ".join(fields).encode() + b"\n")
    (tmp_path / "9" / "status").write_bytes(b"Name:\tab\xff) c\nUid:\t1000\t1000\t1000\t1000\n")
    (tmp_path / "9" / "comm").write_bytes(b"ab\xff) c\n")
    assert procs.stat(9) == procs.ProcStat(pid=9, ppid=1, pgrp=9, start=4242, state="S")
    assert procs.real_uid(9) == 1000 and procs._env_laid_out(9)
    assert procs.read_text(9, "comm").strip().encode("utf-8", "surrogateescape") == b"ab\xff) c"
    assert [p.pid for p in procs.all_stats()] == [9]


def test_a_real_process_renamed_to_bytes_that_are_not_utf8_is_scanned() -> None:
    """The same on a real process that renames itself (prctl PR_SET_NAME) to a name with byte 0xff: the scan of
    every process and its descendants still reads it."""
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'gs\\xffname', 0, 0, 0); "
            "print('renamed', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"renamed\n"
        assert procs.read_text(child.pid, "comm").strip().encode("utf-8", "surrogateescape") == b"gs\xffname"
        assert child.pid in {p.pid for p in procs.all_stats()}
        assert child.pid in procs.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_empty_environments_are_looked_at_again_together_not_one_by_one(tmp_path, monkeypatch) -> None:
    """The looks again at a laid-out empty environment are one wait for every pid asked about: a wait per
    process let a user with a few thousand `env -i` processes add seconds to every ledger transaction that scanned
    them (helper 41, stop 38). 200 such processes cost EMPTY_ENV_LOOKS waits, and each still reads as empty."""
    monkeypatch.setattr(procs, "PROC", tmp_path)
    fields = ["S"] + ["0"] * 47 + ["140737488351000", "0"]  # env_end (field 51) set: laid out
    for pid in range(100, 300):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(b"")
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) " + " ".join(fields) + "\n")
    (tmp_path / "300").mkdir()
    (tmp_path / "300" / "environ").write_bytes(b"A=1\0GPUSLICE_SLICE=/s\0")
    sleeps = []
    monkeypatch.setattr(procs.time, "sleep", sleeps.append)
    envs = procs.marked(range(100, 301), ["GPUSLICE_SLICE=/s", "B=2"])
    assert len(sleeps) == procs.EMPTY_ENV_LOOKS
    assert all(envs[pid] == frozenset() for pid in range(100, 300))
    # only the entries asked about are kept, never the environment itself
    assert envs[300] == {"GPUSLICE_SLICE=/s"} and procs.environ_has(300, "GPUSLICE_SLICE=/s") is True
