"""Runs bench/enforcer_overhead.c: ns per intercepted call (alloc+free pair, empty launch, an unhooked
call), best of several runs. Shared by the memory acceptance and the compute sweep."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(where: Path) -> Path:
    """Compile the probe into `where` (plain cc; it finds the driver with dlopen)."""
    exe = where / "enforcer_overhead"
    subprocess.run(["cc", "-O2", "-std=c11", str(ROOT / "bench" / "enforcer_overhead.c"), "-o", str(exe), "-ldl"],
                   check=True)
    return exe


def best_ns(exe: Path, env: dict[str, str], runs: int = 3, iters: int = 20000) -> dict[str, float | str]:
    """{call: best ns over `runs`}; "error" holds the tail of stderr of a failed run."""
    best: dict[str, float | str] = {}
    for _ in range(runs):
        r = subprocess.run([str(exe), str(iters)], env=env, capture_output=True, text=True, timeout=120)
        for line in r.stdout.splitlines():
            k, v = line.split()
            if v != "n/a":
                best[k] = min(float(best.get(k, 1e18)), float(v))
        if r.returncode:
            best["error"] = r.stderr[-300:]
    return best
