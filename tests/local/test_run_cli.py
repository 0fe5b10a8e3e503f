"""``gpuslice run``'s options at the command line: each one reaches the slice, bad values are refused naming
the option. Exit codes: 2 for a value wrong on any node (click's usage error), 1 for a request this node can
never hold (it names the option too), else the command's own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from nodekit import gpuslice

from gpuslice.host.devices import load_snapshot

DEVICES = load_snapshot("h100-80gb")


@pytest.fixture
def env(state_env, enforcer_lib):
    return {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib), "COLUMNS": "200"}


def run(env, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = gpuslice("run", *args, env=env)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


SHOW = 'echo "$CUDA_VISIBLE_DEVICES"; cat "$GPUSLICE_SLICE"'


@pytest.mark.parametrize("args, option, words", [
    (("--gpus", "0"), "--gpus", "from 1 to 64"),
    (("--policy", "foo"), "--policy", "binpack, spread, bestfit, fgd, random"),
    (("--priority", "urgent"), "--priority", "high or low"),
    (("--mode", "fast"), "--mode", "hard, soft or off"),
    (("--compute", "130"), "--compute", "from 0 to 100"),
    (("--memory", "4XB"), "--memory", "4GiB"),
])
def test_bad_values_are_usage_errors_naming_the_option(env, args, option, words):
    code, out, err = run(env, *args, "--", "true")
    flat = " ".join(err.replace("│", " ").split())  # click/rich may box and wrap the message
    assert code == 2, err
    assert f"'{option}'" in flat and words in flat, flat
    assert "count:" not in flat and "policy.node" not in flat


@pytest.mark.parametrize("args, words", [
    (("--gpus", "9"), "gpus: 9 is not allowed; expected at most 8 (this node has 8 device(s))"),
    (("--gpus", "2", "--device", "3"), "gpus: 2 is not allowed; expected at most 1 (--device allows 1 device(s))"),
    (("--memory", "100GiB"), "memory: '100GiB' is not allowed; expected at most 79.6 GiB on one device"),
    (("--device", "9"), "device: '9' is not allowed"),
    (("--memory", "0.0000000001%"), "memory: '0.0000000001%' is not allowed; expected a share that gives at least "
                                     "1 byte of every device"),
])
def test_requests_this_node_can_never_hold_exit_1_naming_the_option(env, args, words):
    code, out, err = run(env, *args, "--wait", "--", "true")
    assert code == 1 and words in err, err


def test_device_by_uuid(env):
    code, out, err = run(env, "--device", DEVICES[5].uuid, "--memory", "1GiB", "--", "sh", "-c", SHOW)
    assert code == 0, err
    assert out.splitlines()[0] == DEVICES[5].uuid


def test_priority_and_mode_reach_the_slice_file(env):
    code, out, err = run(env, "--priority", "high", "--mode", "soft", "--compute", "25", "--memory", "2GiB",
                         "--", "sh", "-c", SHOW)
    assert code == 0, err
    lines = out.splitlines()
    assert "priority=0" in lines and "mode=soft" in lines and "compute=25" in lines
    assert "compute 25% (soft)" in err  # the grant line


def test_unpaced_grant_line_says_so(env):
    code, out, err = run(env, "--memory", "1GiB", "--", "true")
    assert code == 0 and "compute unpaced" in err and "-%" not in err


def test_policy_spread_takes_another_device_than_binpack(env):
    holder = gpuslice("run", "--memory", "1GiB", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; sleep 30',
                      env=env)
    try:
        taken = holder.stdout.readline().strip()
        assert taken.startswith("GPU-")
        code, out, err = run(env, "--memory", "1GiB", "--policy", "binpack", "--", "sh", "-c", SHOW)
        assert code == 0 and out.splitlines()[0] == taken, err  # packs next to the holder
        code, out, err = run(env, "--memory", "1GiB", "--policy", "spread", "--", "sh", "-c", SHOW)
        assert code == 0 and out.splitlines()[0] != taken, err  # spreads to an idle device
    finally:
        holder.kill()
        holder.communicate()


def _ps(env) -> dict:
    out = subprocess.run([os.sys.executable, "-m", "gpuslice.cli", "ps", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_waiter_for_gpu0_does_not_block_gpu3_and_ps_shows_the_queue(env):
    """The audit's case: a waiter for a full GPU 0 made `run --device 3 --memory 1GiB` fail."""
    full = gpuslice("run", "--device", "0", "--memory", "70GiB", "--", "sleep", "30", env=env)
    waiter = None
    try:
        deadline = time.monotonic() + 30
        while not _ps(env)["slices"]:
            assert time.monotonic() < deadline and full.poll() is None
            time.sleep(0.2)
        waiter = gpuslice("run", "--device", "0", "--memory", "30GiB", "--wait", "--", "true", env=env)
        while not _ps(env)["waiters"]:
            assert time.monotonic() < deadline and waiter.poll() is None
            time.sleep(0.2)
        code, out, err = run(env, "--device", "3", "--memory", "1GiB", "--", "sh", "-c", SHOW)
        assert code == 0, err
        assert out.splitlines()[0] == DEVICES[3].uuid
        time.sleep(1.1)
        view = _ps(env)
        (w,) = view["waiters"]
        assert w["position"] == 1 and w["device_indexes"] == [0] and w["age_seconds"] >= 1
        table = subprocess.run([os.sys.executable, "-m", "gpuslice.cli", "ps"], env=env, capture_output=True,
                               text=True, timeout=60).stdout
        queue = table[table.index("waiting"):]
        row = next(line for line in queue.splitlines() if "30GiB" in line)
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[0] == "1" and cells[5] == "0" and cells[6] == "1 × 30GiB, compute unpaced", cells
        assert re.fullmatch(r"[0-9]+s", cells[4]) and int(cells[4][:-1]) >= 1, cells  # how long it waits
    finally:
        full.kill()
        full.communicate()
        if waiter is not None:
            out, err = waiter.communicate(timeout=30)
            assert waiter.returncode == 0, err  # granted once GPU 0 was freed


def test_compute_only_runs_share_a_device_and_ps_shows_their_memory(env):
    """Issue 12: `run --compute 30` without --memory took the whole card, so a second compute-only run was
    refused ("largest free is 0 B"). Now each gets its compute share of the memory, says so, and ps shows it."""
    total = DEVICES[0].memory_total
    first = gpuslice("run", "--device", "0", "--compute", "30", "--", "sh", "-c", SHOW + "; sleep 30", env=env)
    try:
        lines = [first.stdout.readline().strip()]
        while not lines[-1].startswith("compute="):  # the slice file, up to its compute line
            lines.append(first.stdout.readline().strip())
            assert lines[-1], lines
        assert lines[0] == DEVICES[0].uuid and f"memory_limit={total * 30 // 100}" in lines, lines
        code, out, err = run(env, "--device", "0", "--compute", "60", "--", "sh", "-c", SHOW)
        assert code == 0, err
        assert f"memory_limit={total * 60 // 100}" in out.splitlines() and "compute=60" in out.splitlines()
        assert "no --memory: the slice gets 60% of each device's memory" in err
        (s,) = _ps(env)["slices"]
        assert s["memory_limit"] == total * 30 // 100 and s["compute_set"] == 30, s
        table = subprocess.run([os.sys.executable, "-m", "gpuslice.cli", "ps"], env=env, capture_output=True,
                               text=True, timeout=60).stdout
        assert "23.9 GiB" in table, table  # 30 % of the H100's 79.6 GiB in the limit column, not the card
    finally:
        first.terminate()  # the launcher ends its command's tree (and so the pipe) on SIGTERM
        first.communicate(timeout=60)


@pytest.mark.parametrize("args, option, words", [
    (("top", "--interval", "0"), "--interval", "seconds above 0"),
    (("top", "--interval", "nan"), "--interval", "seconds above 0"),
    (("top", "--count", "-3"), "--count", "0 (until Ctrl-C) or more"),
    (("agent", "--interval", "0"), "--interval", "seconds above 0"),
    (("agent", "--history", "0"), "--history", "minutes above 0"),
    (("agent", "--reclaim-interval", "0"), "--reclaim-interval", "seconds above 0"),
    (("agent", "--port", "70000"), "--port", "from 1 to 65535"),
])
def test_bad_top_and_agent_options_are_usage_errors(state_env, args, option, words):
    proc = gpuslice(*args, env={**state_env, "COLUMNS": "200"})
    out, err = proc.communicate(timeout=60)
    flat = " ".join(err.replace("│", " ").split())
    assert proc.returncode == 2, err
    assert f"'{option}'" in flat and words in flat, flat


@pytest.mark.parametrize("verb", [("run", "--", "true"), ("ps",), ("top", "--count", "1"), ("agent", "--port", "-1")])
def test_a_state_dir_under_a_file_is_one_line_naming_the_variable(env, tmp_path, verb):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = gpuslice(*verb, env={**env, "GPUSLICE_STATE_DIR": str(blocker / "x")})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and f"GPUSLICE_STATE_DIR={blocker / 'x'}" in err and "Not a directory" in err, err
