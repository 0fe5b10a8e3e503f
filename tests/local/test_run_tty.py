"""``gpuslice run`` on a terminal: the command becomes the foreground process group, so Ctrl-C (the
terminal's SIGINT) reaches it directly; the launcher takes the terminal back and releases the grant."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time

import pytest

CHILD = ("import os, time; print('fg=%s' % (os.tcgetpgrp(0) == os.getpgrp()), flush=True); time.sleep(60)")


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


@pytest.fixture
def env(state_env, enforcer_lib):
    return {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib)}


def test_ctrl_c_on_a_terminal_reaches_the_command(env):
    pid, master = pty.fork()
    if pid == 0:  # the child: a terminal session running gpuslice run
        os.execve(sys.executable, [sys.executable, "-m", "gpuslice.cli", "run", "--memory", "1GiB", "--",
                                   sys.executable, "-c", CHILD], env)
    try:
        seen = _read_until(master, b"fg=", 30)
        seen += _read_until(master, b"\n", 5)
        assert b"fg=True" in seen, seen
        os.write(master, b"\x03")  # Ctrl-C typed on the terminal
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            _read_until(master, b"\0", 0.1)
        else:
            os.kill(pid, 9)
            raise AssertionError("gpuslice run did not end after Ctrl-C")
        assert os.waitstatus_to_exitcode(status) == 130
    finally:
        os.close(master)
    grants = [g for g in (os.listdir(os.path.join(env["GPUSLICE_STATE_DIR"], "grants")))]
    assert grants == []  # released


def test_ctrl_z_stops_the_job_and_fg_resumes_it(env):
    pid, master = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "gpuslice.cli", "run", "--memory", "1GiB", "--",
                                   sys.executable, "-c", CHILD], env)
    try:
        seen = _read_until(master, b"fg=True", 30)
        assert b"fg=True" in seen, seen
        os.write(master, b"\x1a")  # Ctrl-Z: the command stops, and so does the launcher (the shell's job)
        deadline = time.monotonic() + 10
        stopped = False
        while not stopped and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
            stopped = bool(done) and os.WIFSTOPPED(status)
            time.sleep(0.05)
        assert stopped, "the launcher did not stop with its command"
        os.kill(pid, signal.SIGCONT)  # `fg`
        time.sleep(0.5)
        os.write(master, b"\x03")  # the command has the terminal again: Ctrl-C reaches it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            _read_until(master, b"\0", 0.1)
        else:
            os.kill(pid, 9)
            raise AssertionError("gpuslice run did not end after fg + Ctrl-C")
        assert os.waitstatus_to_exitcode(status) == 130
    finally:
        os.close(master)
    assert os.listdir(os.path.join(env["GPUSLICE_STATE_DIR"], "grants")) == []
