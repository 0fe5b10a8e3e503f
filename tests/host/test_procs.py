"""gpuslice.host.procs: what counts as a process that is gone."""

from __future__ import annotations

import errno
import os
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
