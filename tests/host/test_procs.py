"""gpuslice.host.procs: what counts as a process that is gone."""

from __future__ import annotations

import errno
import os
import subprocess
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
    def emfile(self: Path, *a, **k) -> str:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Path, "read_text", emfile)
    with pytest.raises(OSError) as err:
        procs.stat(os.getpid())
    assert err.value.errno == errno.EMFILE


def test_an_environment_that_reads_empty_is_not_a_no() -> None:
    """A process mid-exec reads an empty environment after its parent is back from Popen: taking that for
    "unmarked" let the ledger miss a marked process (stop 36's CI). Empty means "cannot tell"."""
    bare = subprocess.Popen(["sleep", "60"], env={})
    marked = subprocess.Popen(["sleep", "60"], env={"GPUSLICE_SLICE": "/s"})
    try:
        assert procs.environ_has(bare.pid, "GPUSLICE_SLICE=/s") is None
        while (seen := procs.environ_has(marked.pid, "GPUSLICE_SLICE=/s")) is None:  # until its exec is done
            assert marked.poll() is None
        assert seen is True and procs.environ_has(marked.pid, "GPUSLICE_SLICE=/t") is False
    finally:
        for p in (bare, marked):
            p.kill()
            p.wait()
