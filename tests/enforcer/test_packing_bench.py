"""bench/gpu/packing.sh end to end on a CPU (its --dry-run): the orchestration the GPU run depends on.

The services launch through the CPU driver double with the real enforcer preloaded (the ``double`` kind of
bench/gpu/packing_worker.py), so what the pacer publishes is real: memory-only slices stay on the light path
and never wait, the equal hard shares of launch-bound services take the free path. A stub
``nvidia-cuda-mps-control`` records that the private MPS daemon is started and always told to quit. The
short share-accuracy sweep runs with bench/compute/dry_workload.py. Numbers mean nothing here."""

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


def dry_run(tmp_path: Path, native_build: Path, slice_env,
            **pack: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """bash bench/gpu/packing.sh --dry-run with the double kind and the PACK_* settings given; returns the
    finished run (asserted successful), the stub MPS control's directory and $OUT."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-cuda-mps-control").write_text(STUB)
    (stub / "nvidia-cuda-mps-control").chmod(0o755)
    out = tmp_path / "out"
    env = slice_env()
    for k in ("LD_PRELOAD", "GPUSLICE_LOG_LEVEL"):  # the benchmark preloads per service itself
        env.pop(k)
    env.update(PATH=f"{stub}:{os.environ['PATH']}", OUT=str(out), PYTHON=os.sys.executable, PACK_KINDS="double",
               PACK_LIB=str(native_build / "libgpuslice.so"), **pack)
    env.pop("PACK_TAR", None)
    r = subprocess.run(["bash", str(ROOT / "bench/gpu/packing.sh"), "--dry-run"], env=env, capture_output=True,
                       text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, stub, out


def test_packing_dry_run(tmp_path: Path, native_build: Path, slice_env) -> None:
    r, stub, out = dry_run(tmp_path, native_build, slice_env, PACK_NS="2", PACK_REPS="2", PACK_SECONDS="1.2")
    lines = r.stdout.splitlines()
    assert "planned" in lines[0] and "phases" in lines[0], lines[0]  # the plan comes first
    # the MPS daemon it started was told to quit, in the same private directory
    calls = (stub / "calls").read_text().split("\n")
    assert calls[0].startswith("start ") and calls[1] == "quit " + calls[0].split(" ", 1)[1], calls
    # two files come back from the device tool's $OUT: the results and one archive of everything else
    assert sorted(p.name for p in out.iterdir()) == sorted([res.name for res in out.glob("*-packing.md")] +
                                                           [res.name for res in out.glob("*-packing-raw.tgz")])
    assert len(list(out.iterdir())) == 2
    with tarfile.open(next(out.glob("*-packing-raw.tgz"))) as tf:
        raw = json.load(tf.extractfile("packing-run/packing/packing-raw.json"))
        assert "packing-run/compute/summary.txt" in tf.getnames()
    (kind,) = raw["kinds"]
    assert kind["skipped"] == {}, kind["skipped"]
    phases = kind["phases"]
    assert [p["mode"] for p in phases] == ["alone", "plain", "mps", "memonly", "hard", "soft",
                                            "soft", "hard", "memonly", "mps", "plain", "alone"]  # ABBA
    for p in phases:
        assert all(s.get("iters", 0) > 0 for s in p["services"]), p
        for s in p["services"]:
            if p["mode"] == "memonly":
                assert s["paths"] == ["light"] and s["throttled_s"] == 0, s  # never waits
            if p["mode"] in ("hard", "soft"):
                assert s["paths"] == ["free"] and s["offered_load"] is not None, s
                # the enforcer's charge counters, read in the service through gpuslice_pacer_stats: every
                # request's 20 launches counted and charged, its measured pairs sorted clean or dirty
                c = s["pacer"]
                assert c["launches"] >= 20 * s["iters"] and c["launch_charged_ns"] > 0, c
                assert c["measured"] > 0 and c["clean"] + c["dirty"] == c["measured"], c
            if p["mode"] in ("plain", "mps", "alone"):
                assert s.get("pacer") is None, s  # no gpuslice, no counters
    # the dated results file names the run and holds both parts; the short table is printed last
    (res,) = out.glob("*-cpu-dry-run-packing.md")
    text = res.read_text()
    assert "| double | 2 |" in text and "Goals (issue 12)" in text and "accuracy: set share" in text
    assert "gpuslice hard 50/50" in text
    assert "Where the paced services' charge came from" in text and "| double | hard | 2 |" in text
    assert lines[-1].startswith(("time-slicing", "gpuslice hard")) or "| double | 2 |" in r.stdout


def test_packing_focus_dry_run(tmp_path: Path, native_build: Path, slice_env) -> None:
    """PACK_FOCUS=1: only the cells issue 12 still missed (a dry run's kind takes ResNet-50's: N=8 plain,
    memory-only, equal hard), ABBA with 3 repeats, no MPS daemon, and the accuracy sweep cut to matmul
    10/90 and ResNet-50 training 25/75 %, each share 3 times in ABBA order."""
    r, stub, out = dry_run(tmp_path, native_build, slice_env, PACK_FOCUS="1", PACK_REPS="3", PACK_SECONDS="1.0")
    assert "(focus)" in r.stdout.splitlines()[0], r.stdout.splitlines()[0]
    assert not (stub / "calls").exists()  # no MPS daemon in a focus run
    with tarfile.open(next(out.glob("*-packing-raw.tgz"))) as tf:
        raw = json.load(tf.extractfile("packing-run/packing/packing-raw.json"))
        with tarfile.open(fileobj=tf.extractfile("packing-run/compute/raw.tgz")) as inner:
            acc = {n: json.load(inner.extractfile(f"raw/acc_{n}.json")) for n in ("matmul", "resnet")}
        names = tf.getnames()
    assert raw["focus"] is True
    (kind,) = raw["kinds"]
    got = [(p["mode"], p["n"]) for p in kind["phases"]]
    fwd = [("plain", 8), ("memonly", 8), ("hard", 8)]
    assert got == [("alone", 1)] + fwd + fwd[::-1] + fwd + [("alone", 1)], got  # ABBA, 3 repeats
    for p in kind["phases"]:
        assert all(s.get("iters", 0) > 0 and s.get("launch_p50_s") for s in p["services"]), p
    assert any(n.endswith("compute/summary.txt") for n in names), names
    assert [str(ph["share"]) for ph in acc["resnet"]["phases"]] == ["25", "75", "75", "25", "25", "75"], acc
    assert [str(ph["share"]) for ph in acc["matmul"]["phases"]] == ["10", "90", "90", "10", "10", "90"], acc
    (res,) = out.glob("*-cpu-dry-run-packing.md")
    assert "PACK_FOCUS=1 bash bench/gpu/packing.sh" in res.read_text()


def test_packing_variants_dry_run(tmp_path: Path, native_build: Path, slice_env) -> None:
    """PACK_VARIANTS="B=<lib>": a second build of the enforcer runs as its own mode (hard-B) in the same ABBA
    order as the shipped one, its services preloading that build (their counters show they were paced), and
    the results name it beside the shipped build's ratio: how issue 12's constants are chosen on a GPU."""
    r, stub, out = dry_run(tmp_path, native_build, slice_env, PACK_NS="2", PACK_REPS="1", PACK_SECONDS="1.0",
                           PACK_SWEEP="0", PACK_VARIANTS=f"B={native_build / 'libgpuslice.so'}")
    with tarfile.open(next(out.glob("*-packing-raw.tgz"))) as tf:
        raw = json.load(tf.extractfile("packing-run/packing/packing-raw.json"))
    assert raw["variants"] == {"B": str(native_build / "libgpuslice.so")}
    (kind,) = raw["kinds"]
    assert [p["mode"] for p in kind["phases"]] == ["alone", "plain", "mps", "memonly", "hard", "hard-B", "soft",
                                                   "alone"]
    (variant,) = [p for p in kind["phases"] if p["mode"] == "hard-B"]
    assert variant["share"] == 50
    for s in variant["services"]:
        assert s["paths"] == ["free"] and s["pacer"]["launches"] >= 20 * s["iters"], s
    text = next(out.glob("*-cpu-dry-run-packing.md")).read_text()
    assert "hard, variant B" in text and "equal hard, variant B" in text and "| double | hard-B | 2 |" in text
