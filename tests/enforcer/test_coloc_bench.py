"""bench/gpu/coloc.sh end to end on a CPU (its --dry-run): the orchestration the GPU run depends on.

The workers sleep like the server kinds and the trainer, and launch through the CPU driver double with the
real enforcer preloaded by ``gpuslice run``, so what the pacer publishes is real: under ``preemptive`` the
low-priority trainer is on the yield path beside the high-priority server, under ``shared`` nobody yields. A
stub ``nvidia-cuda-mps-control`` records that the private MPS daemon is started and always told to quit.
Numbers mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/bin/sh
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$(dirname "$0")/calls"; exit 0; fi
read cmd; echo "$cmd $CUDA_MPS_PIPE_DIRECTORY" >> "$(dirname "$0")/calls"
"""


def test_coloc_dry_run(tmp_path: Path, native_build: Path) -> None:
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-cuda-mps-control").write_text(STUB)
    (stub / "nvidia-cuda-mps-control").chmod(0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "GS_COLOC_", "LD_PRELOAD"))}
    env.update(PATH=f"{stub}:{os.environ['PATH']}", OUT=str(out), PYTHON=os.sys.executable, GS_COLOC_STEPS="3",
               GS_COLOC_REPS="2", GS_COLOC_WINDOW="0.8")
    r = subprocess.run(["bash", str(ROOT / "bench/gpu/coloc.sh"), "--dry-run"], env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert "plan:" in lines[0] and "planned" in lines[0], lines[0]  # the plan comes first
    calls = (stub / "calls").read_text().split("\n")
    assert calls[0].startswith("start ") and calls[1] == "quit " + calls[0].split(" ", 1)[1], calls
    # two files come back from the device tool's $OUT: the results and one archive of everything else
    # (named by the steps it ran: two device calls write two results files)
    assert len(list(out.iterdir())) == 2 and len(list(out.glob("*-cpu-dry-run-coloc-steps3.md"))) == 1
    with tarfile.open(next(out.glob("*-coloc-steps3-raw.tgz"))) as tf:
        raw = json.load(tf.extractfile("coloc-run/coloc-raw.json"))
        tf.extract("coloc-run/coloc-raw.json", tmp_path)
    assert raw["skipped"] == []
    order = [p["mode"] for p in raw["phases"]]
    forward = ["alone", "trainer", "plain", "mps", "preemptive", "shared"]
    assert order == forward + ["alone"] + forward[:0:-1]  # ABBA ('alone' first again: shared sizes from it)
    for p in raw["phases"]:
        for role in ("server", "trainer"):
            if role in p:
                assert "error" not in p[role] and p[role]["exit"] == 0, p
        if p["mode"] == "preemptive":  # the pacer's own view, read from the device state mid-window
            assert sorted(p["paths"].values()) == ["preemptive/high:light", "preemptive/low:yield"], p["paths"]
        if p["mode"] == "shared":
            assert all(v.startswith("shared/") and not v.endswith(":yield") for v in p["paths"].values()), p["paths"]
    text = next(out.glob("*-coloc-steps3.md")).read_text()
    assert "decode: preemptive server p99" in text and "idle bound" in text
    # the tables again from the raw file (how the two calls' results become one table)
    again = subprocess.run([os.sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), "--report",
                            str(tmp_path / "coloc-run/coloc-raw.json")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "| preemptive |" in again.stdout, again.stderr
    tail = lines[next(i for i, x in enumerate(lines) if x.startswith("== co-location")):]  # the short table, last
    assert any(x.startswith("| preemptive |") for x in tail) and any("preemptive server p50" in x for x in tail)
