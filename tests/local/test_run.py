"""``gpuslice run`` end to end as real processes: environment, exit codes, release on every way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit import gpuslice

from gpuslice.host import procs


def ledger_grants(env) -> list[dict]:
    out = subprocess.run([*PS, "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["slices"]


PS = [os.sys.executable, "-m", "gpuslice.cli", "ps"]


@pytest.fixture
def env(state_env, enforcer_lib):
    return {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib)}


def test_run_sets_the_slice_and_propagates_exit_code(env, tmp_path):
    out_file = tmp_path / "seen"
    script = (f'echo "$CUDA_VISIBLE_DEVICES|$GPUSLICE_SLICE|$LD_PRELOAD" > {out_file}; '
              f'cat "$GPUSLICE_SLICE" >> {out_file}; echo hello; exit 7')
    proc = gpuslice("run", "--memory", "4GiB", "--compute", "30", "--", "sh", "-c", script, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert out == "hello\n"  # the command's own output streams through
    first, *lines = out_file.read_text().splitlines()
    visible, slice_file, preload = first.split("|")
    assert visible.startswith("GPU-") and preload.split()[0] == env["GPUSLICE_ENFORCER_LIB"]
    assert slice_file.startswith(env["GPUSLICE_STATE_DIR"])
    assert "memory_limit=4294967296" in lines and "compute=30" in lines and f"devices={visible}" in lines
    assert "grant g-" in err
    assert not Path(slice_file).exists()  # released: the grant's folder is gone
    assert ledger_grants(env) == []


def test_enforcer_loads_into_a_non_cuda_process(env):
    proc = gpuslice("run", "--memory", "1GiB", "--", "python3", "-c", "print(6 * 7)", env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "42"


def _waiters(env) -> list:
    done = subprocess.run([sys.executable, "-m", "gpuslice.cli", "ps", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)
    return json.loads(done.stdout)["waiters"] if done.returncode == 0 else []


def _wait_for_grant(env, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        grants = ledger_grants(env)
        if grants and grants[0]["pids"] is not None:
            return grants[0]
        time.sleep(0.2)
    raise AssertionError("no grant appeared")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_launcher_ends_tree_and_releases(env, tmp_path, signum, code):
    marker = tmp_path / "pid"
    proc = gpuslice("run", "--memory", "2GiB", "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 60", env=env)
    while not marker.exists() or not marker.read_text().endswith("\n"):  # the shell creates it, then writes
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while not (grants := ledger_grants(env))[0]["pids"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the launcher records the child right after the fork
    assert len(grants) == 1 and grants[0]["pids"] == [child]  # ps shows the command's processes
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert not procs.alive(child, 0)
    assert ledger_grants(env) == []


def test_leftover_background_processes_are_ended(env, tmp_path):
    marker = tmp_path / "bg"
    proc = gpuslice("run", "--", "sh", "-c", f"sleep 60 & echo $! > {marker}; exit 0", env=env)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not procs.alive(int(marker.read_text()), 0)
    assert ledger_grants(env) == []


def test_killed_launcher_grant_is_reclaimed(env, tmp_path):
    marker = tmp_path / "pid"
    proc = gpuslice("run", "--memory", "2GiB", "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 60", env=env)
    while not marker.exists() or not marker.read_text().endswith("\n"):  # the shell creates it, then writes
        time.sleep(0.05)
    child = int(marker.read_text())
    proc.kill()  # SIGKILL: no cleanup in the launcher at all
    proc.wait()
    deadline = time.monotonic() + 10
    while procs.alive(child, 0) and time.monotonic() < deadline:  # PDEATHSIG ends the command
        time.sleep(0.05)
    assert not procs.alive(child, 0)
    assert ledger_grants(env) == []  # ps reclaims the grant of the dead tree


def _orphan_grandchildren(env, marker: Path) -> tuple[subprocess.Popen, list[int]]:
    """`gpuslice run -- sh -c 'sleep & sleep & wait'`, then SIGKILL to the launcher: PDEATHSIG ends sh, the
    sleeps are orphaned (reparented away from the dead launcher) and still hold the grant."""
    script = f"sleep 300 & echo $! >> {marker}; sleep 301 & echo $! >> {marker}; wait"
    proc = gpuslice("run", "--memory", "2GiB", "--", "sh", "-c", script, env=env)
    deadline = time.monotonic() + 30
    while not marker.exists() or len(marker.read_text().split()) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    sleeps = [int(x) for x in marker.read_text().split()]
    proc.kill()
    proc.wait()
    return proc, sleeps


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(procs.alive(p, 0) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_killed_launcher_orphaned_grandchildren_are_ended_and_the_grant_freed(env, tmp_path):
    _, sleeps = _orphan_grandchildren(env, tmp_path / "pids")
    try:
        assert all(procs.alive(p, 0) for p in sleeps)  # PDEATHSIG reached sh only
        assert ledger_grants(env) == []  # ps's reclaim pass: SIGTERM to the slice's processes, then free
        assert _gone(sleeps, 5)
    finally:
        for pid in sleeps:
            if procs.alive(pid, 0):
                os.kill(pid, signal.SIGKILL)


def test_the_agent_ends_orphaned_grandchildren_on_its_own(env, tmp_path, agent):
    from gpuslice.local.client import AgentClient

    _, sleeps = _orphan_grandchildren(env, tmp_path / "pids")
    try:
        assert _gone(sleeps, 15)  # nobody runs ps: the agent's reclaim loop ends them
        deadline = time.monotonic() + 10
        client = AgentClient(agent.socket)
        while client.grants()["grants"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.grants()["grants"] == []
    finally:
        for pid in sleeps:
            if procs.alive(pid, 0):
                os.kill(pid, signal.SIGKILL)


def test_command_not_found_is_127_and_released(env):
    proc = gpuslice("run", "--", "/nonexistent/tool", env=env)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 127 and "command not found" in err
    assert ledger_grants(env) == []


def test_request_that_never_fits_is_refused_at_once_even_with_wait(env):
    for extra in ((), ("--wait",)):
        proc = gpuslice("run", "--memory", "200GiB", *extra, "--", "true", env=env)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err
        assert "memory: '200GiB'" in err and "79.6 GiB" in err and "waiting" not in err


def test_too_big_for_now_fails_with_what_is_free(env):
    holder = gpuslice("run", "--memory", "60GiB", "--device", "0", "--", "sleep", "5", env=env)
    try:
        _wait_for_grant(env)
        proc = gpuslice("run", "--memory", "30GiB", "--device", "0", "--", "true", env=env)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert "30.0 GiB" in err and "free now" in err
    finally:
        holder.kill()
        holder.communicate()


def test_bad_device_names_allowed_values(env):
    proc = gpuslice("run", "--device", "9", "--", "true", env=env)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "device" in err and "GPU-" in err


def test_concurrent_runs_do_not_overcommit(env, tmp_path):
    runs = [gpuslice("run", "--memory", "20GiB", "--device", "0", "--", "sleep", "4", env=env) for _ in range(5)]
    results = [(r.communicate(timeout=90), r.returncode) for r in runs]
    ok = [rc for _, rc in results if rc == 0]
    refused = [err for (out, err), rc in results if rc == 1]
    assert len(ok) == 3, results  # 79.6 GiB holds three 20 GiB slices
    assert len(refused) == 2 and all("free now" in e for e in refused)
    assert ledger_grants(env) == []


def test_wait_queues_and_runs_when_freed(env, tmp_path):
    # The first slice holds the device until the second is queued (a condition, not a 3 s sleep that a loaded
    # machine outlasts before the second has even started).
    go = tmp_path / "go"
    first = gpuslice("run", "--memory", "60GiB", "--device", "0", "--", "sh", "-c",
                     f"while [ ! -e {go} ]; do sleep 0.05; done", env=env)
    _wait_for_grant(env)
    second = gpuslice("run", "--memory", "60GiB", "--device", "0", "--wait", "--", "echo", "ran", env=env)
    deadline = time.monotonic() + 60
    while not _waiters(env):
        assert time.monotonic() < deadline and second.poll() is None, "the second run never queued"
        time.sleep(0.1)
    go.touch()
    out, err = second.communicate(timeout=60)
    first.communicate(timeout=30)
    assert second.returncode == 0, err
    assert "position 1 in the queue" in err and out.strip() == "ran"


def test_multi_gpu_run_gets_whole_devices(env, tmp_path):
    seen = tmp_path / "seen"
    proc = gpuslice("run", "--gpus", "2", "--", "sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {seen}; '
                    f'cat "$GPUSLICE_SLICE" >> {seen}', env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    first, *lines = seen.read_text().splitlines()
    uuids = first.split(",")
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids)
    assert "memory_limit=85520809984" in lines  # whole H100s: the device's memory
    assert "whole device" in err and "all of its compute" in err


def test_gpus_2_with_memory_is_two_shared_slices_on_distinct_devices(env, tmp_path):
    seen = tmp_path / "seen"
    proc = gpuslice("run", "--gpus", "2", "--memory", "4GiB", "--", "sh", "-c",
                    f'echo "$CUDA_VISIBLE_DEVICES" > {seen}; cat "$GPUSLICE_SLICE" >> {seen}', env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    first, *lines = seen.read_text().splitlines()
    assert len(set(first.split(","))) == 2
    assert "memory_limit=4294967296" in lines
    assert "whole" not in err and err.count("memory 4.0 GiB compute unpaced") == 2  # the grant line
