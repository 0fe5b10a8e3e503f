"""``ps`` and ``top`` from the command line: tables, JSON lines, option errors."""

from __future__ import annotations

import json
import subprocess
import sys


def test_ps_and_top_json(state_env):
    cli = [sys.executable, "-m", "gpuslice.cli"]
    ps = subprocess.run([*cli, "ps"], env=state_env, capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0 and "NVIDIA H100" in ps.stdout and "slices" in ps.stdout
    top = subprocess.run([*cli, "top", "--json", "--count", "2", "--interval", "0.1"], env=state_env,
                         capture_output=True, text=True, timeout=60)
    lines = [json.loads(x) for x in top.stdout.splitlines()]
    assert len(lines) == 2 and len(lines[0]["devices"]) == 8
    live = subprocess.run([*cli, "top", "--count", "2", "--interval", "0.1"], env=state_env, capture_output=True,
                          text=True, timeout=60)
    assert live.returncode == 0 and "slices" in live.stdout and "NVIDIA H100" in live.stdout
    bad = subprocess.run([*cli, "top", "--interval", "0"], env=state_env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--interval" in bad.stderr  # a usage error, like every bad option value
