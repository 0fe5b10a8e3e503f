"""bench/gpu/capture_pool_probe.py on a CPU: what it refuses before any GPU work (the GPU run is gpu_all.sh's
capture-probe step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench/gpu/capture_pool_probe.py"


def test_an_unknown_question_is_refused_naming_the_allowed_ones() -> None:
    r = subprocess.run([sys.executable, str(PROBE), "pool_size", "none"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""  # nothing probed: no question of the list runs either
    assert "unknown question(s) ['pool_size']" in r.stderr
    assert "none, ctx_device, stream_device" in r.stderr and "pool_size_relaxed, pool_size_global" in r.stderr
