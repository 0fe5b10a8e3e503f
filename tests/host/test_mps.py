"""One MPS control daemon's life through MpsControl, against the stand-in control daemon
(tests/support/mps_standin.py): it starts, answers, stops leaving no process and no pipe directory,
and whatever goes wrong — a daemon that dies, one that ignores quit, one that never comes up — ends the
same way. The real nvidia-cuda-mps-control is driven by the gpu-marked test at the end."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import pytest

from gpuslice.host import procs
from gpuslice.host.mps import YIELD_THREADS, MpsControl, MpsError, client_env, find_control, yields
from gpuslice.spec import Engine, GiB, MiB, Priority, Slice
from gpuslice.spec.model import Colocation
from mpskit import failing_control, install_standin, mps_processes, short_root

DEV = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"


@pytest.fixture
def root():
    yield from short_root()


@pytest.fixture
def control(root: Path) -> MpsControl:
    return MpsControl(install_standin(root / "bin"), root / "d", DEV, start_timeout=10, quit_timeout=3)


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_start_answers_and_stop_leaves_nothing(control: MpsControl, root: Path) -> None:
    pid = control.start()
    assert control.pid() == pid and procs.alive(pid, 0)
    assert (control.pipe_dir / "nvidia-cuda-mps-control.pid").exists()
    assert control.start() == pid  # already running: kept, not a second daemon
    control.query("start_server -uid 0")
    assert len(control.servers()) == 1
    assert control.env()["CUDA_VISIBLE_DEVICES"] == DEV
    control.stop()
    assert not control.running() and mps_processes(root) == []
    assert not control.pipe_dir.exists() and not control.record_file.exists()


def test_the_daemon_inherits_no_variable_of_its_starter_but_paths_and_locale(control: MpsControl,
                                                                             monkeypatch) -> None:
    """The daemon runs as the tenant, who reads its /proc/<pid>/environ: what the agent starting it holds in its
    environment (a token, its configuration, a preload) must not be there; PATH and the daemon's own folders are."""
    monkeypatch.setenv("GPUSLICE_AGENT_TOKEN", "s3cret")
    monkeypatch.setenv("KUBECONFIG", "/root/.kube/admin.conf")
    monkeypatch.setenv("LD_PRELOAD", "/opt/agent/libhook.so")
    monkeypatch.setenv("LANG", "C.UTF-8")
    pid = control.start()
    try:
        env = dict(e.split(b"=", 1) for e in (procs.PROC / str(pid) / "environ").read_bytes().split(b"\0") if e)
    finally:
        control.stop()
    assert not {b"GPUSLICE_AGENT_TOKEN", b"KUBECONFIG", b"LD_PRELOAD"} & env.keys(), sorted(env)
    assert env[b"PATH"] == os.environ["PATH"].encode() and env[b"LANG"] == b"C.UTF-8"
    assert env[b"CUDA_MPS_PIPE_DIRECTORY"] == str(control.pipe_dir).encode()
    assert env[b"CUDA_VISIBLE_DEVICES"] == DEV.encode()


def test_a_crashed_daemon_is_seen_and_its_orphaned_server_and_stale_pipes_are_cleared(control: MpsControl,
                                                                                        root: Path) -> None:
    pid = control.start()
    control.query("start_server -uid 0")
    server = control.servers()[0]
    with contextlib.suppress(MpsError):  # the connection dies with the daemon
        control.query("standin_crash")
    wait_for(lambda: not procs.alive(pid, 0))
    assert not control.running()
    assert (control.pipe_dir / "control").exists()  # stale socket left by the crash
    assert [s.pid for s in control.mps_processes()] == [server]  # its server lives on, orphaned
    control.stop()
    assert mps_processes(root) == [] and not control.pipe_dir.exists()


def test_a_daemon_that_ignores_quit_is_forced(control: MpsControl, root: Path) -> None:
    control.start()
    control.query("standin_hang_quit")
    t0 = time.monotonic()
    control.stop()
    assert mps_processes(root) == [] and not control.pipe_dir.exists()
    assert time.monotonic() - t0 < control.quit_timeout + 5


def test_a_restart_after_a_crash_gets_a_fresh_daemon(control: MpsControl) -> None:
    first = control.start()
    with contextlib.suppress(MpsError):  # the connection dies with the daemon
        control.query("standin_crash")
    wait_for(lambda: not control.running())
    second = control.start()  # stale pipe directory replaced, no "already running" refusal
    assert second != first and control.running()
    control.stop()


def test_faults_in_the_daemons_logs_are_reported(control: MpsControl) -> None:
    control.start()
    assert control.faults() == []
    control.query("standin_fault")
    wait_for(lambda: control.faults())
    assert "fatal GPU exception" in control.faults()[0]
    control.stop()
    control.start()  # a new life starts with clean logs
    assert control.faults() == []
    control.stop()


def test_a_daemon_that_cannot_start_says_why_and_leaves_nothing(root: Path) -> None:
    bad = failing_control(root / "bin", "cannot open device")
    ctl = MpsControl(bad, root / "d", DEV, start_timeout=3)
    with pytest.raises(MpsError, match="exited with 1: cannot open device"):
        ctl.start()
    silent = root / "bin2" / "nvidia-cuda-mps-control"
    silent.parent.mkdir(parents=True)
    silent.write_text("#!/bin/sh\nexit 0\n")  # "daemonizes" but never comes up
    silent.chmod(0o755)
    with pytest.raises(MpsError, match="did not come up within 1 s"):
        MpsControl(silent, root / "d2", DEV, start_timeout=1).start()


def test_a_pipe_directory_too_long_for_unix_sockets_is_refused(root: Path) -> None:
    deep = root / ("x" * 90)
    with pytest.raises(MpsError, match="at most 80 bytes.*GPUSLICE_STATE_DIR"):
        MpsControl(install_standin(root / "bin"), deep, DEV).start()


def test_find_control_prefers_the_environment(root: Path) -> None:
    binary = install_standin(root / "bin")
    assert find_control({"GPUSLICE_MPS_CONTROL": str(binary)}) == binary
    assert find_control({"PATH": str(root / "bin")}) == binary
    assert find_control({"PATH": str(root)}) is None
    with pytest.raises(MpsError, match="GPUSLICE_MPS_CONTROL=/nonexistent: not an executable"):
        find_control({"GPUSLICE_MPS_CONTROL": "/nonexistent"})


def test_client_env_of_a_spatial_slice() -> None:
    spatial = Slice(DEV, 4 * GiB + 5 * MiB // 2, compute=25, engine=Engine.SPATIAL, priority=Priority.HIGH)
    assert client_env(spatial, "/p") == {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4098M"}  # rounded down
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in client_env(Slice(DEV, GiB, engine=Engine.SPATIAL), "/p")
    assert client_env(Slice(DEV, GiB, compute=25), "/p") == {}


def test_a_low_priority_spatial_slice_that_yields_is_a_below_normal_client() -> None:
    """MPS runs normal clients' work before below-normal ones': the spatial engine's form of ``preemptive`` (a decode
    server beside a below-normal trainer on the H200: p50 1.16x / p99 0.96x alone, 2026-11-29-h200-coloc-steps3-mps.md).
    A ``shared`` low-priority slice yields to nobody, so it stays a normal client."""
    low = client_env(Slice(DEV, GiB, engine=Engine.SPATIAL), "/p")  # priority defaults to low
    assert low["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    shared = client_env(Slice(DEV, GiB, engine=Engine.SPATIAL, colocation=Colocation.SHARED), "/p")
    assert "CUDA_MPS_CLIENT_PRIORITY" not in shared
    high = client_env(Slice(DEV, GiB, engine=Engine.SPATIAL, priority=Priority.HIGH), "/p")
    assert "CUDA_MPS_CLIENT_PRIORITY" not in high



def test_the_yield_cap_named_here_is_the_enforcers() -> None:
    """`gpuslice run` says what the enforcer will do (mps.YIELD_THREADS); the enforcer's constant decides."""
    header = (Path(__file__).resolve().parents[2] / "native/include/gpuslice/mps.h").read_text()
    assert re.search(r"#define GS_MPS_YIELD_THREADS (\d+)", header).group(1) == str(YIELD_THREADS)
    assert yields(Slice(DEV, GiB, engine=Engine.SPATIAL))
    assert not yields(Slice(DEV, GiB, engine=Engine.SPATIAL, colocation=Colocation.SHARED))
    assert not yields(Slice(DEV, GiB, engine=Engine.SPATIAL, priority=Priority.HIGH))


@pytest.mark.gpu
def test_the_real_control_daemon_starts_answers_and_stops(root: Path) -> None:
    from gpuslice.host.devices import discover

    binary = find_control()
    if binary is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    ctl = MpsControl(binary, root / "d", discover()[0].uuid)
    pid = ctl.start()
    assert ctl.servers() == [] and ctl.pid() == pid
    ctl.stop()
    assert mps_processes(root) == [] and not ctl.pipe_dir.exists()
    assert os.path.isdir(ctl.log_dir)  # logs are kept until the folder goes
