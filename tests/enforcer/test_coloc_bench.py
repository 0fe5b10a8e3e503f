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
import sys
import tarfile
from pathlib import Path

import pytest

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
            # and the yielding trainer's own counters over the window, read from the preloaded enforcer
            y = p["trainer"]["yield"]
            assert isinstance(y, dict) and all(isinstance(v, int) and v >= 0 for v in y.values()), y
        if p["mode"] in ("plain", "trainer"):  # no gpuslice, no counters
            assert p["trainer"]["yield"] is None, p
        if p["mode"] == "shared":
            assert all(v.startswith("shared/") and not v.endswith(":yield") for v in p["paths"].values()), p["paths"]
        # every phase says what the SM clock was, or why it could not (the NVML double has no clocks)
        assert "mean" in p["sm_clock_mhz"] or p["sm_clock_mhz"]["error"], p["sm_clock_mhz"]
    text = next(out.glob("*-coloc-steps3.md")).read_text()
    assert "decode: preemptive server p99" in text and "idle bound" in text and "| SM MHz |" in text
    # the tables again from the raw file (how the two calls' results become one table)
    again = subprocess.run([os.sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), "--report",
                            str(tmp_path / "coloc-run/coloc-raw.json")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "| preemptive |" in again.stdout, again.stderr
    tail = lines[next(i for i, x in enumerate(lines) if x.startswith("== co-location")):]  # the short table, last
    assert any(x.startswith("| preemptive |") for x in tail) and any("preemptive server p50" in x for x in tail)
    # the yield split's rows (in the results file) stay out of it: without their header they read as the mode's row
    assert "| server's backlog |" in text and not any(" % |" in x for x in tail), tail


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("coloc_bench", ROOT / "bench/gpu/coloc_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_coloc_modes_subset_keeps_abba() -> None:
    """--modes (GS_COLOC_MODES) runs a subset of the modes, still forward then backward per repeat with
    'alone' first, so all three kinds fit one device call; an unknown mode is refused before anything runs."""
    mod = _bench_module()
    ns = mod.argparse.Namespace(steps="1,2,3", reps=2, tidal=False, modes="alone,trainer,plain,preemptive",
                                mps_pipe="", dry=False)
    plan = mod.phases(ns)
    assert len(plan) == 24
    first = [m for k, m, r in plan if k == "launch" and r == 0]
    second = [m for k, m, r in plan if k == "launch" and r == 1]
    assert first == ["alone", "trainer", "plain", "preemptive"] and second == ["alone", "preemptive", "plain", "trainer"]
    r = subprocess.run([os.sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), "--out", "x", "--tmp", "y",
                        "--modes", "alone,bogus", "--plan-only"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown bogus" in r.stderr and "allowed: alone," in r.stderr
    ok = subprocess.run([os.sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), "--out", "x", "--tmp", "y",
                         "--steps", "1,2,3", "--modes", "alone,trainer,plain,preemptive", "--plan-only"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "24 phases" in ok.stdout and "cut at 420 s" in ok.stdout, ok.stdout


def test_coloc_solo_modes_run_only_when_named() -> None:
    """solo-mps / solo-spatial (the server alone, set up as under mps / spatial) are left out of the default
    plan, run when named, need what their co-located mode needs (the private daemon), and start the server
    alone with the same environment as the co-located mode's server."""
    mod = _bench_module()
    ns = mod.argparse.Namespace(steps="1", reps=2, tidal=False, modes="", mps_pipe="/p", dry=False)
    assert not {m for _, m, _ in mod.phases(ns)} & {"solo-mps", "solo-spatial", "tidal"}
    ns.modes = "alone,solo-mps,solo-spatial,mps,spatial"
    plan = [m for _, m, r in mod.phases(ns) if r == 0]
    assert plan == ["alone", "solo-mps", "solo-spatial", "mps", "spatial"]
    ns.mps_pipe = ""
    assert [m for _, m, _ in mod.phases(ns)] == ["alone", "alone"]
    bench = mod.Bench.__new__(mod.Bench)
    bench.args, bench.env, bench.busy = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p"), {}, {}
    solo, env = bench.command("solo-mps", "server", "launch", Path("/f"))
    _, env_co = bench.command("mps", "server", "launch", Path("/f"))
    assert env == env_co and env["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    spatial, _ = bench.command("solo-spatial", "server", "launch", Path("/f"))
    assert spatial[spatial.index("--engine") + 1] == "spatial" and spatial[spatial.index("--priority") + 1] == "high"


def test_coloc_solo_mps_variants_split_the_spatial_engine() -> None:
    """solo-mps-pinned is solo-mps plus the pinned device-memory limit gpuslice's spatial engine gives the bench's
    16-GiB server (the same string as gpuslice.host.mps.client_env); solo-mps-enforced is the server under
    gpuslice run --priority high on the time-sliced engine (the enforcer) with solo-mps's environment, so it is a
    client of the private daemon; both run only when named and need that daemon."""
    from gpuslice.host import mps
    from gpuslice.spec.model import Engine, Priority, Slice

    mod = _bench_module()
    spatial = Slice("GPU-x", 16 << 30, priority=Priority.HIGH, engine=Engine.SPATIAL)
    assert mps.client_env(spatial, "/p")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == mod.SPATIAL_PINNED
    bench = mod.Bench.__new__(mod.Bench)
    bench.args, bench.env, bench.busy = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p"), {}, {}
    plain, env0 = bench.command("solo-mps", "server", "launch", Path("/f"))
    pinned, env = bench.command("solo-mps-pinned", "server", "launch", Path("/f"))
    assert pinned == plain and env == {**env0, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": mod.SPATIAL_PINNED}
    enforced, env = bench.command("solo-mps-enforced", "server", "launch", Path("/f"))
    assert env == env0 and enforced[enforced.index("--") + 1:] == plain
    # the time-sliced engine, named: without --engine a slice naming its priority is spatial where MPS is
    assert enforced[enforced.index("--priority") + 1] == "high" and enforced[enforced.index("--engine") + 1] == "timeslice"
    ns = mod.argparse.Namespace(steps="1", reps=2, tidal=False, modes="", mps_pipe="/p", dry=False)
    assert not {m for _, m, _ in mod.phases(ns)} & {"solo-mps-pinned", "solo-mps-enforced"}
    ns.modes = "alone,solo-mps-pinned,solo-mps-enforced"
    assert [m for _, m, r in mod.phases(ns) if r == 0] == ["alone", "solo-mps-pinned", "solo-mps-enforced"]
    ns.mps_pipe = ""
    assert [m for _, m, _ in mod.phases(ns)] == ["alone", "alone"]


def test_coloc_solo_trainer_is_the_spatial_trainer_alone() -> None:
    """solo-trainer (what an SM cap costs a trainer with no server) runs only when named, starts the trainer
    alone with the co-located spatial trainer's command (its --compute cap included), and is not judged
    against the idle bound."""
    mod = _bench_module()
    ns = mod.argparse.Namespace(steps="1", reps=2, tidal=False, modes="", mps_pipe="/p", dry=False)
    assert "solo-trainer" not in {m for _, m, _ in mod.phases(ns)}
    ns.modes = "trainer,solo-trainer"
    assert [m for _, m, _ in mod.phases(ns)] == ["trainer", "solo-trainer", "solo-trainer", "trainer"]
    bench = mod.Bench.__new__(mod.Bench)
    bench.args = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p", spatial_trainer_compute=60)
    bench.env, bench.busy = {}, {}
    solo, _ = bench.command("solo-trainer", "trainer", "launch", Path("/f"))
    co, _ = bench.command("spatial", "trainer", "launch", Path("/f"))
    assert solo == co and solo[solo.index("--compute") + 1] == "60" and "train" in solo
    phs = [{"kind": "launch", "mode": m, "rep": 0, "trainer": {"it_per_s": v}}
           for m, v in (("trainer", 10.0), ("solo-trainer", 9.0))]
    row = next(line for line in mod.report({"phases": phs}).splitlines() if line.startswith("| solo-trainer "))
    assert "9.00 (0.900x)" in row and row.split("|")[5].strip() == "-"


def test_coloc_spatial_full_is_spatial_with_the_trainer_on_every_sm() -> None:
    """spatial-full (opt-in) differs from spatial only by the trainer's --compute 100, so one ABBA run judges
    gpuslice's yield cap; the server's command is the same."""
    mod = _bench_module()
    bench = mod.Bench.__new__(mod.Bench)
    bench.args = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p", spatial_trainer_compute=0)
    bench.env, bench.busy = {}, {}
    full, _ = bench.command("spatial-full", "trainer", "decode", Path("/f"))
    plain, _ = bench.command("spatial", "trainer", "decode", Path("/f"))
    assert full[full.index("--compute") + 1] == "100" and "--compute" not in plain
    assert [a for a in full if a not in ("--compute", "100")] == plain
    assert bench.command("spatial-full", "server", "decode", Path("/f")) == bench.command("spatial", "server", "decode", Path("/f"))
    ns = mod.argparse.Namespace(steps="3", reps=2, tidal=False, modes="spatial,spatial-full", mps_pipe="/p", dry=False)
    assert [m for _, m, _ in mod.phases(ns)] == ["spatial", "spatial-full", "spatial-full", "spatial"]


def test_coloc_default_mode_runs_the_issues_commands_as_written(tmp_path: Path) -> None:
    """default (opt-in) is issue 13's pair as a new user types it: `gpuslice run --priority high|low` with no
    --engine (gpuslice chooses); preemptive, shared and tidal name the time-sliced engine they measure. What each
    process was granted is read from its grant line and reported per role."""
    mod = _bench_module()
    bench = mod.Bench.__new__(mod.Bench)
    bench.args = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p", spatial_trainer_compute=0)
    bench.env, bench.busy = {}, {}
    for role, prio in (("server", "high"), ("trainer", "low")):
        cmd, _ = bench.command("default", role, "decode", Path("/f"))
        opts = cmd[cmd.index("run"):cmd.index("--")]
        assert opts == ["run", "--device", "0", "--memory", "16GiB", "--priority", prio]
        spatial, _ = bench.command("spatial", role, "decode", Path("/f"))
        assert spatial[spatial.index("--engine") + 1] == "spatial"
        for mode in ("preemptive", "shared"):
            cmd, _ = bench.command(mode, role, "decode", Path("/f"))
            assert cmd[cmd.index("--engine") + 1] == "timeslice", (mode, cmd)
    ns = mod.argparse.Namespace(steps="3", reps=2, tidal=False, modes="", mps_pipe="/p", dry=False)
    assert "default" not in {m for _, m, _ in mod.phases(ns)}
    log = tmp_path / "x.log"
    log.write_text("warming\ngpuslice: grant g-1a2b: GPU-x memory 16.0 GiB compute: every SM, 60% beside a "
                   "high-priority slice (spatial, MPS, below-normal client)\n{}\n")
    line = mod.grant_line(log)
    assert line.startswith("grant g-1a2b:") and mod.granted_engine(line) == "spatial"
    assert mod.granted_engine("grant g-1: GPU-x memory 1.0 GiB compute unpaced") == "timeslice"
    assert mod.grant_line(tmp_path / "none.log") is None
    log.write_text("gpuslice[1]: spatial slice: MPS client of /s/mps/x/pipe, active threads 60% (yielding beside "
                   "high-priority slice g-2), pinned memory 0=16384M, client priority below normal; launches not paced\n")
    assert mod.mps_threads(log) == 60 and mod.mps_threads(tmp_path / "none.log") is None
    phs = [{"kind": "decode", "mode": "default", "rep": r, "server": {"grant": "grant g-2: GPU-x (spatial, MPS)"},
            "trainer": {"grant": line, "mps_threads": 60}} for r in (0, 1)]
    said = " ".join(mod.chosen_engines(phs, "decode"))
    assert "the server spatial in 2 of 2 phases" in said and "the trainer spatial in 2 of 2 phases (MPS active threads 60%)" in said
    assert mod.chosen_engines(phs, "gpu") == []


def _variant_bench():
    """The bench module and a Bench (not started) whose variant build is /b/libgpuslice.so."""
    mod = _bench_module()
    bench = mod.Bench.__new__(mod.Bench)
    bench.args = mod.argparse.Namespace(window=1, dry=False, mps_pipe="/p", spatial_trainer_compute=0,
                                        variant_lib="/b/libgpuslice.so")
    bench.env, bench.busy = {"GPUSLICE_ENFORCER_LIB": "/a/libgpuslice.so"}, {}
    return mod, bench


def test_coloc_spatial_gate_modes_ask_for_the_gate() -> None:
    """spatial-gate (opt-in) is spatial with both processes asking for the spatial yield gate
    (GPUSLICE_SPATIAL_YIELD=1) and the same commands, so one ABBA run judges the gate; spatial-gate-variant is
    that on the build with measurement switches (--variant-lib), and is not run without it."""
    mod, bench = _variant_bench()
    for role in ("server", "trainer"):
        same, env0 = bench.command("spatial", role, "decode", Path("/f"))
        assert "GPUSLICE_SPATIAL_YIELD" not in env0
        cmd, env = bench.command("spatial-gate", role, "decode", Path("/f"))
        assert cmd == same and env == {**env0, "GPUSLICE_SPATIAL_YIELD": "1"}
        cmd, env = bench.command("spatial-gate-variant", role, "decode", Path("/f"))
        assert cmd == same and env == {**env0, "GPUSLICE_SPATIAL_YIELD": "1", "GPUSLICE_ENFORCER_LIB": "/b/libgpuslice.so"}
    # spatial-gate-full: the gate, and the trainer on every SM (no yield cap); the server as under spatial-gate
    for role in ("server", "trainer"):
        gate, genv = bench.command("spatial-gate", role, "decode", Path("/f"))
        full, fenv = bench.command("spatial-gate-full", role, "decode", Path("/f"))
        assert fenv == genv
        assert full == (gate if role == "server" else gate[:gate.index("--")] + ["--compute", "100"] + gate[gate.index("--"):])
    ns = mod.argparse.Namespace(steps="3", reps=2, tidal=False, modes="spatial,spatial-gate,spatial-gate-variant",
                                mps_pipe="/p", dry=False, variant_lib="/b/libgpuslice.so")
    order = ["spatial", "spatial-gate", "spatial-gate-variant"]
    assert [m for _, m, _ in mod.phases(ns)] == order + order[::-1]
    ns.variant_lib = ""
    assert [m for _, m, _ in mod.phases(ns)] == ["spatial", "spatial-gate", "spatial-gate", "spatial"]


def test_coloc_paired_goal_is_the_median_of_the_repeats_own_ratios() -> None:
    """Paired goals judge the median of each repeat's on/off ratio, not the pooled requests: two repeats at 1.00
    whose positions drift (10 ms in one, 20 ms in the other) are 1.00 each, while pooling their requests puts the
    slow position's "on" requests beside the fast one's "off" ones."""
    bench = _bench_module()

    def rep(i: int, on: list[float], off: list[float]) -> dict:
        side = lambda lat: {"lat_ms": lat, "p50_ms": sorted(lat)[len(lat) // 2], "p99_ms": max(lat)}
        return {"kind": "decode", "mode": "spatial", "rep": i, "server": {"on": side(on), "off": side(off), "slot_s": 1}}
    # repeat 0: on 10 (x3) off 10 (x1); repeat 1: on 20 (x1) off 20 (x3): pooled on p50 10 / off p50 20 -> 0.5x
    a, b = rep(0, [10.0, 10.0, 10.0], [10.0]), rep(1, [20.0], [20.0, 20.0, 20.0])
    assert bench.paired_ratios([a, b], "decode", "spatial", 0.5) == [1.0, 1.0]
    goals = [g for g in bench._goals("decode", [a, b], None, None, None, None, None) if "paired server p50" in g]
    assert goals == ["decode: spatial paired server p50 1.000x its rest slots, the median of 2 repeats [1.000-1.000] "
                     "(goal <= 1.03x): met; under 3 repeats: inside the split's noise"]
    slow = rep(2, [12.0], [10.0])  # a third repeat at 1.2: the median (1.0) is judged, the spread names it
    goals = [g for g in bench._goals("decode", [a, b, slow], None, None, None, None, None) if "paired server p50" in g]
    assert "1.000x" in goals[0] and "[1.000-1.200]" in goals[0] and goals[0].endswith("met")
    miss = [g for g in bench._goals("decode", [slow], None, None, None, None, None) if "paired server p50" in g]
    assert "MISSED by 17.0 points; under 3 repeats" in miss[0]
    assert "| spatial | 1.000x [1.000, 1.000, 1.200]" in "\n".join(bench.paired([a, b, slow], "decode"))
    # the server alone, split the same way with no trainer, is the null: listed first and named in the goal line
    null = {**rep(3, [11.0], [10.0]), "mode": "alone"}
    table = "\n".join(bench.paired([null, a, b, slow], "decode"))
    assert table.index("| alone (no trainer: the null) | 1.100x [1.100]") < table.index("| spatial |")
    assert "order not recorded: every other slot before becd189" in table  # raws made before the order was recorded
    goals = [g for g in bench._goals("decode", [null, a, b, slow], None, None, None, None, None) if "paired server p50" in g]
    assert goals == ["decode: spatial paired server p50 1.000x its rest slots, the median of 3 repeats [1.000-1.200] "
                     "(goal <= 1.03x): met; the server alone read 1.100x on the same split in the same run(s) (median "
                     "of 1: the split's own spread)"]
    # the null beside a goal comes from the runs of the judged phases only (--report tags each raw's phases)
    other = {**null, "run": 1, "server": {**null["server"], "on": rep(0, [30.0], [10.0])["server"]["on"]}}
    goals = [g for g in bench._goals("decode", [null, other, a, b, slow], None, None, None, None, None)
             if "paired server p50" in g]
    assert "read 1.100x on the same split in the same run(s) (median of 1" in goals[0]
    # a repeat with no request in the trainer's slots is the worst repeat, never a dropped one
    starved = rep(4, [10.0], [10.0])
    starved["server"]["on"] = {"lat_ms": [], "p50_ms": None, "p99_ms": None}  # the worker's summary of no request
    assert bench.paired_ratios([starved, a], "decode", "spatial", 0.5) == [float("inf"), 1.0]
    miss = [g for g in bench._goals("decode", [starved, slow, a], None, None, None, None, None) if "paired server p50" in g]
    assert "1.200x" in miss[0] and miss[0].split(": ")[-1].startswith("MISSED")


def test_coloc_paired_goal_names_the_ratio_over_the_null_of_the_same_repeats() -> None:
    """Each paired goal also says what the trainer adds beyond the split's own reading: every repeat's ratio over
    the null (the server alone) of the same run and ABBA repeat, their geometric mean and a 95 % interval; a
    repeat with no null of its own is left out of it, and one pair gives no interval."""
    import math

    bench = _bench_module()

    def ph(run: int, rep: int, mode: str, on: float) -> dict:
        side = lambda v: {"lat_ms": [v], "p50_ms": v, "p99_ms": v}
        return {"kind": "decode", "mode": mode, "rep": rep, "run": run, "server": {"on": side(on), "off": side(10.0)}}
    phs = [ph(0, 0, "alone", 10.0), ph(0, 0, "spatial", 11.0), ph(0, 1, "alone", 11.0), ph(0, 1, "spatial", 11.0),
           ph(1, 0, "alone", 12.0), ph(1, 0, "spatial", 13.2), ph(1, 1, "spatial", 20.0)]  # run 1 #1: no null
    d = [math.log(1.1 / 1.0), math.log(1.1 / 1.1), math.log(1.32 / 1.2)]
    m, half = sum(d) / 3, 4.303 * (sum((x - sum(d) / 3) ** 2 for x in d) / 2) ** 0.5 / 3 ** 0.5
    line = next(g for g in bench._goals("decode", phs, None, None, None, None, None) if "paired server p50" in g)
    assert line.endswith(f"over the null of the same repeats x{math.exp(m):.3f} [95 % CI {math.exp(m - half):.3f}-"
                         f"{math.exp(m + half):.3f}, 3 pairs]")
    assert bench.matched_null(phs[:2], "decode", "spatial", 0.5) == ""  # one pair: no interval


def test_coloc_paired_split_needs_a_multiple_of_8_slots(tmp_path: Path) -> None:
    """The Thue-Morse order balances the trainer's slots against its rest slots over 8, 16, ... slots only: another
    count is refused naming both values; --report takes the order for raws that did not record it."""
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), *a], capture_output=True,
                                    text=True)
    bad = run("--plan-only", "--window", "3", "--slot", "1")
    assert bad.returncode == 2 and "--window 3 / --slot 1" in bad.stderr and "multiple of 8" in bad.stderr
    assert run("--plan-only", "--window", "8", "--slot", "1", "--steps", "1", "--modes", "alone").returncode == 0
    side = {"lat_ms": [10.0], "p50_ms": 10.0, "p99_ms": 10.0}
    raw = {"phases": [{"kind": "decode", "mode": "alone", "rep": 0,
                       "server": {"on": side, "off": side, "slot_s": 1, **side}}], "window_s": 8, "reps": 1}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    assert "order not recorded" in run("--report", str(tmp_path / "raw.json")).stdout
    assert "Thue-Morse order" in run("--report", str(tmp_path / "raw.json"), "--slot-order", "thue-morse").stdout
    assert "phase, every other slot)" in run("--report", str(tmp_path / "raw.json"), "--slot-order", "alternating").stdout


def test_coloc_preemptive_variant_is_preemptive_on_the_variant_build() -> None:
    """preemptive-variant (opt-in) runs both processes exactly as preemptive, on the enforcer built with
    measurement switches: the time-sliced engine's A/B within one ABBA run; not run without --variant-lib."""
    mod, bench = _variant_bench()
    for role in ("server", "trainer"):
        same, env0 = bench.command("preemptive", role, "launch", Path("/f"))
        cmd, env = bench.command("preemptive-variant", role, "launch", Path("/f"))
        assert cmd == same and env == {**env0, "GPUSLICE_ENFORCER_LIB": "/b/libgpuslice.so"}
    ns = mod.argparse.Namespace(steps="1", reps=2, tidal=False, modes="alone,preemptive,preemptive-variant",
                                mps_pipe="", dry=False, variant_lib="/b/libgpuslice.so")
    assert [m for _, m, _ in mod.phases(ns)] == ["alone", "preemptive", "preemptive-variant",
                                                  "alone", "preemptive-variant", "preemptive"]
    ns.variant_lib = ""
    assert "preemptive-variant" not in [m for _, m, _ in mod.phases(ns)]


def _worker_module():
    import importlib.util
    import sys

    sys.path.insert(0, str(ROOT / "bench/gpu"))
    spec = importlib.util.spec_from_file_location("coloc_worker", ROOT / "bench/gpu/coloc_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_coloc_paired_protocol_splits_by_slot() -> None:
    """--slot: the trainer steps only inside its on-slots, the Thue-Morse ones (a step is started only when its
    mean ends in the slot; over 8 slots the on- and rest slots have equal mean position and spread),
    and the server files each request under the slot it started in, leaving out requests in a slot's first
    guard seconds or crossing into the next slot; the report then judges each co-located server against its
    own rest slots."""
    import time

    mod = _worker_module()
    t0, slot, window = time.time() + 0.05, 0.25, 1.5
    steps = []

    def step() -> None:
        a = time.time()
        time.sleep(0.02)
        steps.append((a, time.time()))
    tr = mod.run_trainer(step, t0, window, 0.0, slot)
    on = [k for k in range(8) if mod.trainer_on(k)]
    assert on == [1, 2, 4, 7] and sum(on) == sum(set(range(8)) - set(on))
    assert sum(k * k for k in on) == sum(k * k for k in set(range(8)) - set(on))  # a quadratic drift cancels too
    for a, b in steps:  # every step lies inside one on-slot (a sleep may overrun by a scheduler tick)
        k, _ = mod.slot_of(a, t0, slot)
        assert mod.trainer_on(k) and mod.slot_of(b - 0.01, t0, slot)[0] == k, (a - t0, b - t0)
    assert tr["on_s"] == 0.75 and tr["iters"] > 0 and tr["it_per_s"] == tr["iters"] / 0.75

    def request() -> None:
        time.sleep(0.003)
    sv = mod.run_server(request, 0.002, time.time() + 0.05, window, 0.0, slot, guard=0.05)
    on, off = sv["on"], sv["off"]
    assert on["requests"] > 10 and off["requests"] > 10 and on["requests"] + off["requests"] < sv["requests"]
    assert on["left_out"] > 0 and on["requests"] + off["requests"] + on["left_out"] + off["left_out"] == sv["requests"]
    bench = _bench_module()
    phase = {"kind": "launch", "mode": "spatial", "rep": 0, "server": sv, "trainer": tr}
    solo = {"kind": "launch", "mode": "alone", "rep": 0, "server": sv}
    assert bench._side(phase, "server")["lat_ms"] == on["lat_ms"]  # co-located: the trainer's slots
    assert bench._side(solo, "server")["lat_ms"] == sv["lat_ms"]  # alone: every request
    text = "\n".join(bench.paired([phase, solo], "launch"))
    assert "| spatial |" in text and f"{on['requests']} / {off['requests']}" in text and "| alone |" not in text
    assert sv["slot_order"] == tr["slot_order"] == "thue-morse" and "Thue-Morse order" in text
    starts = [t for t, _ in sv["series"]]  # every request in the window, in time order with its start
    assert starts == sorted(starts) and 0 <= starts[0] and starts[-1] < window
    assert sorted(ms for _, ms in sv["series"]) == sv["lat_ms"]
    assert any("spatial paired server p50" in g for g in bench._goals("launch", [phase, solo], 1, 1, None, None, None))


def test_coloc_clock_sampler_reads_the_window(monkeypatch) -> None:
    """The SM clock is sampled over the phase's window only and summarised (mean, min, p10, max, the
    board's maximum); without NVML the phase records why."""
    import sys
    import time
    import types

    mod = _bench_module()
    calls = []
    fake = types.SimpleNamespace(NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                 nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
                                 nvmlDeviceGetMaxClockInfo=lambda h, c: 1980,
                                 nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=99, memory=40))

    def clock(h, c):
        calls.append(time.time())
        return 1980 if len(calls) % 2 else 1755

    fake.nvmlDeviceGetClockInfo = clock
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    t0 = time.time() + 0.1
    s = mod.ClockSampler(t0, 0.3, every=0.02)
    s.start()
    s.join(timeout=5)
    res = s.result()
    assert calls and min(calls) >= t0 and max(calls) <= t0 + 0.3 + 0.05, (t0, calls)
    assert res["min"] == 1755 and res["max"] == 1980 and res["max_sm_mhz"] == 1980 and res["n"] == len(calls)
    assert 1755 < res["mean"] < 1980 and res["mem_util_pct"] == 40
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no NVML
    s = mod.ClockSampler(time.time(), 0.05)
    s.start()
    s.join(timeout=5)
    assert "error" in s.result() and "Error" in s.result()["error"]
    phs = [{"kind": "launch", "mode": "alone", "sm_clock_mhz": res}, {"kind": "launch", "mode": "plain",
                                                                      "sm_clock_mhz": {"error": "no samples"}}]
    assert mod._clock(phs, "launch", "alone").endswith(f"[min 1755]") and mod._clock(phs, "launch", "plain").startswith("n/a")
    assert mod._mem_busy(phs, "launch", "alone") == "40 [40-40]" and mod._mem_busy(phs, "launch", "plain") == "-"


def test_drain_cost_probe_builds_and_runs_every_scenario(native_build: Path, tmp_path: Path) -> None:
    """bench/drain_cost.c (what each piece of the drain machinery costs a launching thread; run on the GPU by
    hand) builds with warnings as errors and runs every scenario of every pattern to the end over the CPU driver
    double, so the probe cannot rot between GPU runs (the double has no stream memory operations: the wv
    scenarios say so and measure nothing)."""
    exe = tmp_path / "drain_cost"
    subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread",
                    str(Path(__file__).resolve().parents[2] / "bench" / "drain_cost.c"), "-o", str(exe), "-ldl"],
                   check=True)
    r = subprocess.run([str(exe), "3", "1"], env={"LD_LIBRARY_PATH": str(native_build / "double")},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if len(line.split()) == 4]
    scenarios = {"base", "rec", "rec_wake", "rec_poll10", "rec_poll50", "rec_age15", "rec_cap", "poll10", "wake", "wv",
                 "wv_poll10"}
    assert {(p, s) for p, s, _, _ in rows} == {(p, s) for p in ("launch", "decode", "gpubound") for s in scenarios}
    assert all(float(med) > 0 and float(p90) >= float(med) for _, _, med, p90 in rows)
    assert "stream_write_value unavailable" in r.stdout


def test_coloc_yield_table_splits_the_trainers_waits_by_why() -> None:
    """The trainer's yield-gate sleeps inside the window (coloc_worker.yield_split of two counter reads) are shown
    by why, as % of the time it worked (the slotted trainer's on-slots, else the window), mean of the repeats; a
    mode without counters (no pacer) has no row, and no table at all when none has them."""
    mod = _bench_module()
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    import coloc_worker

    a = dict.fromkeys(coloc_worker.YIELD_KEYS, 0)
    b = {**a, "yield_entries": 400, "yield_backlog_ns": 2_000_000_000, "yield_own_queue_ns": 1_000_000_000}
    split = coloc_worker.yield_split(a, b)
    assert split == b and coloc_worker.yield_split(None, b) is None and coloc_worker.yield_split({"launches": 1}, b) is None
    phs = [{"kind": "decode", "mode": "spatial-gate", "rep": 0, "trainer": {"it_per_s": 1.0, "yield": split, "on_s": 4.0}},
           {"kind": "decode", "mode": "spatial-gate", "rep": 1, "trainer": {"it_per_s": 1.0, "yield": a}},
           {"kind": "decode", "mode": "mps", "rep": 0, "trainer": {"it_per_s": 1.0, "yield": None}}]
    rows = mod.yield_table(phs, "decode", 8.0)
    row = next(r for r in rows if r.startswith("| spatial-gate |"))
    # backlog 2 s of 4 s on-time = 50 %, and 0 % in the other repeat (its 8-s window): mean 25 %; own queue 12.5 %
    assert row == "| spatial-gate | 25.0 % | 0.0 % | 0.0 % | 0.0 % | 12.5 % | 50 |", row
    assert not any(r.startswith("| mps |") for r in rows)
    assert mod.yield_table(phs[2:], "decode", 8.0) == []
    assert "| server's backlog |" in mod.report({"phases": phs, "window_s": 8.0})


def test_coloc_slotted_trainer_reads_its_counters_at_the_window_edges(monkeypatch) -> None:
    """The paired protocol's trainer (run_trainer_slotted, what every GPU run with GS_COLOC_SLOT uses) reads the
    enforcer's counters once when the window opens and once when it closes: its ``yield`` is their difference, also
    when a step runs past the tail."""
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    import time

    import coloc_worker

    reads: list[float] = []

    def counters() -> dict:
        reads.append(time.time())
        return dict.fromkeys(coloc_worker.YIELD_KEYS, 10 * len(reads))

    monkeypatch.setattr(coloc_worker, "pacer_counters", counters)
    t0 = time.time() + 0.05
    out = coloc_worker.run_trainer(lambda: time.sleep(0.004), t0, 0.4, 0.05, slot=0.05)
    assert len(reads) == 2 and reads[0] >= t0 and reads[1] > t0 + 0.4, [r - t0 for r in reads]
    assert out["yield"] == dict.fromkeys(coloc_worker.YIELD_KEYS, 10) and out["on_s"] > 0
    reads.clear()  # its first step runs past the window and the tail: the closing read comes after the loop
    t0, steps = time.time(), []  # the window open from the start: its first on-slot (1 of 0-7) starts the step

    def step() -> None:
        steps.append(1)
        time.sleep(0.5 if len(steps) == 1 else 0.004)
    out = coloc_worker.run_trainer(step, t0, 0.4, 0.01, slot=0.05)
    assert len(steps) == 1 and len(reads) == 2 and reads[1] > t0 + 0.41, [r - t0 for r in reads]
    assert out["yield"] == dict.fromkeys(coloc_worker.YIELD_KEYS, 10)


def test_coloc_synthetic_neighbour_is_named_and_not_judged(tmp_path: Path, monkeypatch) -> None:
    """GS_COLOC_TRAINER (--trainer) puts a synthetic neighbour of one resource (alu, hbm) in the trainer's place:
    the workers are told which through the bench's environment, the raw and the report name it and mark the goals
    not judged, an unknown name is refused naming the variable and what is allowed, and --report does not pool
    the raws of two neighbours into one table."""
    worker = _worker_module()
    monkeypatch.delenv("GS_COLOC_TRAINER", raising=False)
    assert worker.trainer_name() == "transformer"
    monkeypatch.setenv("GS_COLOC_TRAINER", "bogus")
    with pytest.raises(ValueError, match="GS_COLOC_TRAINER='bogus': allowed transformer, alu, hbm"):
        worker.trainer_name()
    mod = _bench_module()
    args = mod.argparse.Namespace(out=str(tmp_path / "o"), tmp=str(tmp_path / "t"), budget=10, window=1, reps=2,
                                  trainer="hbm")
    bench = mod.Bench(args)
    assert bench.env["GS_COLOC_TRAINER"] == "hbm" and bench.raw["trainer"] == "hbm"
    phs = [{"kind": "decode", "mode": m, "rep": 0, "server": {"p50_ms": 10.0, "p99_ms": 20.0, "lat_ms": [10.0]},
            "trainer": {"it_per_s": 5.0}} for m in ("alone", "spatial")]
    text = mod.report({"phases": phs, "trainer": "hbm"})
    assert "synthetic neighbour **hbm**" in text and "### Goals (issue 13): not judged, the neighbour is hbm" in text
    plain = mod.report({"phases": phs})
    assert "synthetic" not in plain and "### Goals (issue 13)\n" in plain
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), *a], capture_output=True,
                                    text=True, timeout=60)
    bad = run("--out", "x", "--tmp", "y", "--trainer", "bogus", "--plan-only")
    assert bad.returncode == 2 and "--trainer" in bad.stderr and "'alu'" in bad.stderr, bad.stderr
    for name, trainer in (("a.json", "alu"), ("b.json", None)):
        raw = {"phases": phs, "skipped": [], "window_s": 1, "reps": 1} | ({"trainer": trainer} if trainer else {})
        (tmp_path / name).write_text(json.dumps(raw))
    mixed = run("--report", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert mixed.returncode == 2 and "one table holds one neighbour" in mixed.stderr, mixed.stderr
    same = run("--report", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert same.returncode == 0 and "synthetic neighbour **alu**" in same.stdout, same.stderr


def test_coloc_plain_floor_judges_the_spatial_engine_too() -> None:
    """The issue's floor (the trainer never below plain time-slicing where plain gives the same p99 protection) is
    judged for the default spatial engine as well as the time-sliced preemptive mode, naming the judged mode; where
    plain does not protect the tail it is no floor; shared (no protection promised) and mps are not judged."""
    bench = _bench_module()

    def ph(mode: str, lat: float, it: float | None) -> dict:
        p = {"kind": "gpu", "mode": mode, "rep": 0, "server": {"lat_ms": [lat], "p50_ms": lat, "p99_ms": lat}}
        return p if it is None else {**p, "trainer": {"it_per_s": it}}
    phs = [ph("alone", 10.0, None), ph("plain", 10.5, 50.0), ph("spatial", 10.2, 40.0), ph("preemptive", 10.1, 55.0),
           ph("shared", 12.0, 60.0)]
    floor = [g for g in bench._goals("gpu", phs, 10.0, 10.0, 30.0, 60.0, 0.5) if "plain time-slicing gives" in g]
    assert floor == ["gpu: plain time-slicing gives p99 1.05x alone and the trainer 50.00 it/s vs preemptive 55.00: met",
                     "gpu: plain time-slicing gives p99 1.05x alone and the trainer 50.00 it/s vs spatial 40.00: "
                     "MISSED: plain protects the tail too and the trainer got 20 % more there"]
    phs[1] = ph("plain", 12.0, 50.0)  # plain's tail 1.20x alone: it protects nothing, so it is no floor
    floor = [g for g in bench._goals("gpu", phs, 10.0, 10.0, 30.0, 60.0, 0.5) if "plain time-slicing gives" in g]
    assert len(floor) == 2 and all(g.endswith("so it is no floor here") for g in floor)


def test_a_phase_whose_trainer_failed_is_left_out_of_every_figure() -> None:
    """A server timed beside a trainer that crashed (or was refused) was not co-located: its requests went into
    the pooled p50/p99 and a goal could read "met" (helper 46). Such a phase, and one whose server had no grant
    when the trainer started, is left out of the tables and goals and listed under Errors."""
    mod = _bench_module()

    def phase(mode: str, rep: int, p50: float, **extra) -> dict:
        server = {"p50_ms": p50, "p99_ms": p50, "lat_ms": [p50] * 10, "exit": 0}
        return {"kind": "gpu", "mode": mode, "rep": rep, "server": server,
                "trainer": {"it_per_s": 5.0, "exit": 0}, **extra}

    good = phase("default", 0, 4.0)
    crashed = phase("default", 1, 2.0)
    crashed["trainer"] = {"error": "no result (exit 1)", "exit": 1}
    ungranted = phase("default", 2, 2.0, error="the server had no grant line when the trainer started")
    text = mod.report({"phases": [phase("alone", 0, 4.0), good, crashed, ungranted]})
    row = next(line for line in text.splitlines() if line.startswith("| default "))
    assert row.split("|")[2].strip().startswith("4.00") and "(1.000x)" in row, row
    errors = text[text.index("### Errors"):]
    assert "gpu/default#1 trainer: no result (exit 1): left out" in errors
    assert "gpu/default#2 the server had no grant line" in errors
    assert mod.failed_phase(good) is None


def test_a_bench_ended_by_sigterm_writes_its_report_and_ends_its_workers(tmp_path: Path) -> None:
    """A device call's time limit ends the bench with SIGTERM: the phases done so far still get coloc.md and the
    raw file, and the running phase's workers (each in a session of its own) end with it (helper 46: nothing was
    written, and the workers were left running)."""
    import signal
    import time

    out, tmp = tmp_path / "out", tmp_path / "tmp"
    bench = subprocess.Popen([sys.executable, str(ROOT / "bench/gpu/coloc_bench.py"), "--out", str(out), "--tmp",
                              str(tmp), "--dry", "--steps", "3", "--modes", "alone,trainer", "--reps", "1",
                              "--window", "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = tmp / "phase" / "decode-trainer-0" / "ready.trainer"  # the trainer phase runs after the first's end
    deadline = time.monotonic() + 120
    while not second.exists():
        assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()[0]
        time.sleep(0.05)
    bench.send_signal(signal.SIGTERM)
    said, _ = bench.communicate(timeout=60)
    assert bench.returncode == 128 + signal.SIGTERM, said
    raw = json.loads((out / "coloc-raw.json").read_text())
    assert [p["mode"] for p in raw["phases"]] == ["alone"]
    assert "| alone |" in (out / "coloc.md").read_text()
    def cmdline(pid: Path) -> bytes:
        try:
            return (pid / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            return b""

    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and str(tmp).encode() in cmdline(p)]
    assert not left, left
