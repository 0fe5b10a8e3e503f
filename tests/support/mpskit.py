"""The MPS stand-in installed for a test: a folder holding ``nvidia-cuda-mps-control`` and
``nvidia-cuda-mps-server`` (tests/support/mps_standin.py under both names), and a check that no MPS process
of a given root is left."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from gpuslice.host import procs

STANDIN = Path(__file__).with_name("mps_standin.py")


def install_standin(folder: Path, python: str = sys.executable) -> Path:
    """Write the stand-in into ``folder`` (run by ``python``: one other users may run where the daemon runs as
    one of them); the path of its control binary."""
    folder.mkdir(parents=True, exist_ok=True)
    body = STANDIN.read_text().split("\n", 1)[1]
    for name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        path = folder / name
        path.write_text(f"#!{python}\n{body}")
        path.chmod(0o755)
    return folder / "nvidia-cuda-mps-control"


def mps_processes(root: Path) -> list[int]:
    """Live MPS processes (real or stand-in) whose pipe directory is under ``root``."""
    found = []
    for s in procs.all_stats():
        try:
            comm = (procs.PROC / str(s.pid) / "comm").read_text().strip()
            env = (procs.PROC / str(s.pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm.startswith("nvidia-cuda-mps") and any(
                e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=" + str(root).encode()) for e in env):
            found.append(s.pid)
    return found


def kill_all(root: Path) -> list[int]:
    """SIGKILL what :func:`mps_processes` finds (a test's own clean-up); the pids it found."""
    found = mps_processes(root)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def short_root(prefix: str = "gsmps-") -> Iterator[Path]:
    """A fixture body: a short folder under /tmp (MPS sockets need short paths) whose MPS processes are all
    gone at the end; a test that left one fails."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    yield folder
    left = kill_all(folder)
    shutil.rmtree(folder, ignore_errors=True)
    assert not left, f"the test left MPS processes behind: {left}"


def failing_control(folder: Path, message: str) -> Path:
    """A control binary that cannot start a daemon: it says ``message`` on stderr and exits 1."""
    path = folder / "nvidia-cuda-mps-control"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    path.chmod(0o755)
    return path
