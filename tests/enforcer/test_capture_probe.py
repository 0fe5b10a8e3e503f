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


def test_a_child_that_dies_keeps_its_line_and_the_reason_at_the_head_of_its_stderr() -> None:
    """A question's process whose capture succeeded aborted at the graph's teardown on the H100 (2026-12-06): its
    line, printed before, is kept with the exit added; one that died before any line keeps the start of its stderr
    (where the reason is), not only the stack's tail."""
    sys.path.insert(0, str(PROBE.parent))
    import capture_pool_probe as probe

    reason, stack = "terminate called after throwing an instance of 'c10::Error'", "frame #%d: <unknown>\n"
    err = reason + "\n" + "".join(stack % i for i in range(200))
    done = subprocess.CompletedProcess([], -6, stdout='{"question": "none", "captured": true}\n', stderr=err)
    out = probe._answer("none", done)
    assert out["captured"] is True and out["exit"] == -6 and out["exit_after_line"] is True
    assert out["stderr"].startswith(reason) and out["stderr"].rstrip().endswith("frame #199: <unknown>")
    died = probe._answer("ctx_device", subprocess.CompletedProcess([], -6, stdout="", stderr=reason))
    assert died == {"question": "ctx_device", "exit": -6, "exit_after_line": False, "stderr": reason}
    ok = probe._answer("none", subprocess.CompletedProcess([], 0, stdout='{"question": "none"}\n', stderr="warn"))
    assert ok == {"question": "none"}
