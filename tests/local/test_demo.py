"""The GPU demo's plumbing on CPU: two slices on GPU 0 of a snapshot, a stand-in workload, the live table,
failure reporting, and Ctrl-C on a terminal ending both slices."""

from __future__ import annotations

import glob
import json
import os
import pty
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuslice.local import demo as demo_module
from gpuslice.local.demo import DemoFailed, run_gpu_demo

FAKE = ("import json, sys, time; name, secs = sys.argv[1], float(sys.argv[2]); time.sleep(secs); "
        "print(json.dumps({'matmul_per_s': 10.0 if name == 'slice-a' else 20.0, 'cuda_total': 0}))")
# slice-b fails: no result line, exit 3, a message on stderr
FAILING = ("import json, sys, time; name = sys.argv[1]; time.sleep(0.5)\n"
           "if name == 'slice-b':\n    print('workload broke: CUDA error', file=sys.stderr); sys.exit(3)\n"
           "print(json.dumps({'matmul_per_s': 10.0, 'cuda_total': 0}))")


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """The demo's temporary folders go to this test's own folder: another test run on the machine (a second
    `make test`, another checkout) makes and removes its own gpuslice-demo-* folders in /tmp meanwhile."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))


def _demo_temp_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "gpuslice-demo-*")))


def test_demo_runs_two_slices_and_reports(state_env, enforcer_lib, monkeypatch, capsys):
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(enforcer_lib))
    before = _demo_temp_dirs()
    results = run_gpu_demo(seconds=2.5, refresh=0.3, workload=(sys.executable, "-c", FAKE))
    out = capsys.readouterr().out
    assert [r["exit"] for r in results] == [0, 0]
    assert [r["matmul_per_s"] for r in results] == [10.0, 20.0]
    assert "throughput ratio slice-b / slice-a = 2.00" in out
    assert "4.0 GiB" in out and "8.0 GiB" in out  # the live table showed both slices' limits
    assert f"state dir {state_env['GPUSLICE_STATE_DIR']}" in out
    assert _demo_temp_dirs() == before  # no private ledger, logs removed


def test_demo_fails_when_a_slice_fails(state_env, enforcer_lib, monkeypatch, capsys):
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(enforcer_lib))
    with pytest.raises(DemoFailed, match=r"1 of 2 slice\(s\) failed: slice-b \(exit 3\)"):
        run_gpu_demo(seconds=1, refresh=0.3, workload=(sys.executable, "-c", FAILING))
    out = capsys.readouterr().out
    assert "slice-b failed (exit 3)" in out and "workload broke: CUDA error" in out  # its log's tail
    results = run_gpu_demo(seconds=1, refresh=0.3, workload=(sys.executable, "-c", FAILING), check=False)
    assert [r["exit"] for r in results] == [0, 3] and "workload broke" in results[1]["log_tail"]
    assert demo_module.failed(results) == [results[1]]


def test_demo_uses_the_normal_state_dir_not_a_private_one(monkeypatch, tmp_path):
    """Without GPUSLICE_STATE_DIR the runs inherit the environment as it is (the default state dir, or a root
    agent), as `gpuslice ps` in another terminal does; nothing names a private ledger."""
    monkeypatch.delenv("GPUSLICE_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(demo_module.StateDir, "default", classmethod(lambda cls: cls(tmp_path / "default")))
    seen = {}

    def fake_popen(cmd, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(demo_module.subprocess, "Popen", fake_popen)
    before = _demo_temp_dirs()
    with pytest.raises(RuntimeError, match="stop here"):
        run_gpu_demo(seconds=1, workload=("true",))
    assert seen.get("env") is None  # inherits os.environ: no GPUSLICE_STATE_DIR of its own
    assert "GPUSLICE_STATE_DIR" not in os.environ
    assert seen["stdin"] == subprocess.DEVNULL and seen["start_new_session"] is True  # off the terminal
    assert _demo_temp_dirs() == before


SLEEPER = ("import os, sys, time; open(os.path.join(sys.argv[1], sys.argv[2]), 'w').write(str(os.getpid())); "
           "time.sleep(120)")


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_on_a_terminal_ends_the_demo_and_both_slices(state_env, enforcer_lib, tmp_path, inherited):
    """Also when the demo was started with SIGINT ignored (``nohup``, a background job, some CI runners): it
    sets the disposition it relies on itself (issue 15)."""
    env = {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib)}
    pids = tmp_path / "pids"
    pids.mkdir()
    code = ("from gpuslice.local.demo import run_gpu_demo; import sys; "
            f"run_gpu_demo(seconds=120, refresh=0.3, workload=(sys.executable, '-c', {SLEEPER!r}, {str(pids)!r}))")
    pid, master = pty.fork()
    if pid == 0:  # a terminal session running the demo in the foreground, as `make run` does
        # "default": as from an interactive shell, which gives a foreground job SIGINT's default action;
        # "ignored": as from `nohup`/`make test &` (exec keeps it ignored): the demo must set it itself
        signal.signal(signal.SIGINT, signal.SIG_IGN if inherited == "ignored" else signal.SIG_DFL)
        os.execve(sys.executable, [sys.executable, "-c", code], env)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        grants = Path(env["GPUSLICE_STATE_DIR"]) / "grants"
        while not (len(list(pids.iterdir())) == 2 and grants.is_dir() and len(list(grants.iterdir())) == 2):
            assert time.monotonic() < deadline, seen
            seen += _drain(master)
        ps = subprocess.run([sys.executable, "-m", "gpuslice.cli", "ps", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
        assert len(json.loads(ps.stdout)["slices"]) == 2  # another terminal sees the demo's slices
        time.sleep(0.5)
        os.write(master, b"\x03")  # Ctrl-C typed on the terminal
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            seen += _drain(master)
        else:
            os.kill(pid, 9)
            raise AssertionError(f"the demo did not end after Ctrl-C: {seen[-2000:]!r}")
        seen += _drain(master)
        assert os.waitstatus_to_exitcode(status) == 130, seen[-2000:]
        assert b"interrupted" in seen
    finally:
        os.close(master)
    for f in pids.iterdir():  # both slices' commands ended, not only the one holding the terminal
        workload_pid = int(f.read_text())
        deadline = time.monotonic() + 10
        while _alive(workload_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(workload_pid), f.name
    assert list(grants.iterdir()) == []  # both grants released


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _drain(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], 0.1)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
