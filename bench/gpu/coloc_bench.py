"""Co-location benchmark (issue 13): a latency-critical server beside a GPU-saturating trainer on one GPU.

Server kinds (bench/gpu/coloc_worker.py): ``launch`` (launch-bound, batch 1, idle gaps), ``gpu`` (GPU-bound,
batch 32), ``decode`` (a decoder's loop of many tiny kernels, a sync per token). For each kind, one step:
  alone       the server alone: p50 / p99, and the share of the device's time it leaves idle (1 - its request
              rate x its GPU time per request, measured with CUDA graphs replayed back to back)
  trainer     the trainer alone: iterations / s
  plain       both, no gpuslice (the driver time-slices the two contexts)
  mps         both as clients of a private MPS daemon (started by coloc.sh), the trainer at
              CUDA_MPS_CLIENT_PRIORITY=1 (below normal), the server at 0: the best MPS offers for priority
  preemptive  gpuslice run --engine timeslice --priority high (server) / --priority low (trainer), colocation
              preemptive (default): the time-sliced engine's yield path
  shared      colocation shared, soft shares: the server gets its alone busy share x 1.25 + 5 points (what a
              user who measured it would set), the trainer the rest
  spatial     gpuslice run --engine spatial --priority high / low: both clients of the MPS daemon gpuslice starts for
              the device, the low-priority trainer below normal (CUDA_MPS_CLIENT_PRIORITY=1, set by gpuslice); only
              where the MPS binaries are (coloc.sh's private daemon started)
  default     (only when named in --modes) issue 13's commands as a new user writes them: gpuslice run --priority
              high / --priority low and nothing else; the engine is gpuslice's choice (--engine auto: spatial where
              the node has MPS) and each process's grant line is kept in the raw results (what it chose); judged as
              spatial
  spatial-full (only when named in --modes) spatial with the trainer's --compute 100: every SM, still a
              below-normal client (what gpuslice's yield cap, 60 % of the SMs for a yielding trainer started beside
              a high-priority slice, changes: spatial against spatial-full in the same ABBA run)
  spatial-gate (only when named in --modes) spatial with both processes asking for the spatial yield gate
              (GPUSLICE_SPATIAL_YIELD=1, native/include/gpuslice/mps.h): the trainer also holds its launches while
              the server has a backlog (what the gate changes: spatial against spatial-gate in one ABBA run)
  spatial-gate-full (only when named in --modes) spatial-gate with the trainer's --compute 100: the gate without
              the yield cap (whether the gate alone protects the server and leaves the trainer more)
  spatial-gate-variant (only when named in --modes, with --variant-lib) spatial-gate with both processes on an
              enforcer built with measurement switches (coloc.sh GS_COLOC_VARIANT_CFLAGS: e.g. -DGS_DRAIN_OFF, no
              drain records; -DGS_CTL_DRAIN_SPIN_NS=50000LL, fewer drain looks): what each part of the gate costs
  preemptive-variant (only when named in --modes, with --variant-lib) preemptive with both processes on that
              build: the time-sliced engine's A/B
  tidal       (only with --tidal) the trainer colocation tidal, following the server's idle time
  solo-mps    (only when named in --modes) the server alone as a client of the private MPS daemon
  solo-spatial (only when named in --modes) the server alone under gpuslice run --engine spatial --priority high:
              with solo-mps, what the spatial engine costs the server without a neighbour (its daemon, the enforcer)
  solo-mps-pinned (only when named in --modes) solo-mps with the pinned device-memory limit gpuslice's spatial
              engine sets (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M, the bench's --memory 16GiB)
  solo-mps-enforced (only when named in --modes) the server alone under gpuslice run --priority high (the
              time-sliced engine: the enforcer, its light path) as a client of the private MPS daemon: with
              solo-mps, solo-mps-pinned and solo-spatial, which part of the spatial engine costs a server alone
              (the enforcer, the pinned limit, or gpuslice's own daemon)
  solo-trainer (only when named in --modes) the trainer alone, set up as under spatial (gpuslice run --engine
              spatial --priority low, --compute of --spatial-trainer-compute): what an SM cap costs a trainer
              that has no server beside it, against 'trainer'
--slot S (the paired protocol): the trainer works only in half of the S-s slots of a phase, in the Thue-Morse
order (coloc_worker.trainer_on: off, on, on, off, on, off, off, on: a drift over the window cancels; a step is
started only when its mean ends inside the slot), and each co-located server is also judged against itself in
the slots between (a table of its own, and goals "paired"; the server alone is split the same way: the null):
the server kinds are CPU-bound inside a request, so their latency drifts with the VM's CPU speed between
phases and with what each new process draws (one run's "alone" p50 read 5.7-7.2 ms); within one phase both
cancel. Requests in a slot's first 0.1 s, or crossing into the next slot, count in neither. A paired goal is
judged on the median of the repeats' own ratios and also names the ratio over the null of the same repeats with
a 95 % interval (matched_null): what the trainer adds.
Phases go in ABBA order (the modes forward, then backward), --reps times (2 = ABBA); every phase starts
fresh processes, waits until both are warm, and measures the same window in both. The trainer's bound is its
alone speed x the server's idle fraction (issue 13's goal: >= 80 % of it); the between-requests bound leaves
out the idle time inside a request (the CPU gaps of a launch-bound request, the decoder's per-token syncs),
which a preemptive trainer is given since issue 13's item 1 (README-compute.md, "Co-location": each entry
costs the next server kernel at most YIELD_QUEUE + a trainer kernel + a switch).

  python3 bench/gpu/coloc_bench.py --out DIR --tmp SHORTDIR [--steps 1,2,3] [--reps 2] [--window 3]
                                   [--modes alone,trainer,...] [--budget S] [--mps-pipe DIR] [--dry] [--plan-only]
Every phase records the SM clock (NVML) over its window (the table's "SM MHz"): "alone" p99 can be read against
the clocks of an idle GPU between requests. A yielding trainer under gpuslice also records its enforcer's yield
counters over the window (the raw's trainer ``yield``: its launch threads' sleeps in the yield gate by why, ns;
coloc_worker.yield_split), tabled as "Where the yielding trainer waited" (yield_table).
  python3 bench/gpu/coloc_bench.py --report DIR/coloc-raw.json [more raw files]   the tables again, merged
Writes DIR/coloc-raw.json (every phase), DIR/coloc.md (the tables, the goals met or MISSED by how much), and
DIR/logs/ (each process's output).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "coloc_worker.py"
sys.path.insert(0, str(HERE))
from coloc_worker import DEFAULT_TRAINER, TRAINERS, YIELD_KEYS  # noqa: E402 - beside this file
KINDS = ("launch", "gpu", "decode")
KIND_NAMES = {"launch": "launch-bound (ResNet-50 b1, 4 ms think)", "gpu": "GPU-bound (ResNet-50 b32, 8 ms think)",
              "decode": "decode (32 tokens x ~40 tiny kernels, sync per token, 5 ms think)"}
# a phase's process start, imports, warm-up and calibration, and its end: the H100 run of 2026-11-25 took 331 s
# for 20 phases of a 3-s window (16.5 s a phase), so 11.5 s + window + 2 s
STARTUP_S = 11.5


ALL_MODES = ("alone", "solo-mps", "solo-mps-pinned", "solo-mps-enforced", "solo-spatial", "trainer", "solo-trainer",
             "plain", "mps", "preemptive", "preemptive-variant", "shared", "spatial", "default", "spatial-full", "spatial-gate",
             "spatial-gate-full", "spatial-gate-variant", "tidal")
OPT_IN = ("solo-mps", "solo-mps-pinned", "solo-mps-enforced", "solo-spatial", "solo-trainer", "default", "spatial-full",
          "spatial-gate", "spatial-gate-full", "spatial-gate-variant", "preemptive-variant",
          "tidal")  # run only when named (tidal also by --tidal)
# co-located spatial, judged alike
SPATIAL_MODES = ("spatial", "default", "spatial-full", "spatial-gate", "spatial-gate-full", "spatial-gate-variant")
SOLO = {"solo-mps": "mps", "solo-mps-pinned": "mps", "solo-mps-enforced": "mps",
        "solo-spatial": "spatial"}  # the server alone, set up as in the co-located mode (Bench.command: how)
SPATIAL_PINNED = "0=16384M"  # what gpuslice's spatial engine sets for the bench's --memory 16GiB (mps.client_env)
SOLO_TRAINER = {"solo-trainer": "spatial"}  # the trainer alone, set up as in the co-located mode
PREEMPTIVE_MODES = ("preemptive", "preemptive-variant")  # time-sliced preemptive, judged alike
VARIANT = {"spatial-full": "spatial", "spatial-gate": "spatial", "spatial-gate-full": "spatial",
           "spatial-gate-variant": "spatial", "preemptive-variant": "preemptive"}  # one setting
# changed (Bench.command says which)


def modes(tidal: bool, only: str = "") -> list[str]:
    """The modes of a step in their forward order; only: a comma list (--modes) to run a subset."""
    keep = {m.strip() for m in only.split(",") if m.strip()} | ({"tidal"} if tidal else set())
    if not only:
        return [m for m in ALL_MODES if m not in OPT_IN or m in keep]
    return [m for m in ALL_MODES if m in keep]


def phases(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(kind, mode, rep) in run order: per kind (a step), the modes forward then backward, --reps times."""
    steps = [int(s) for s in args.steps.split(",")] if args.steps else [1, 2, 3]
    mine = modes(args.tidal or "tidal" in args.modes.split(","), args.modes)
    out = []
    for s in steps:
        kind = KINDS[s - 1]
        for rep in range(args.reps):
            order = list(mine) if rep % 2 == 0 else mine[::-1]
            # 'alone' measures what 'shared' sizes its shares from: keep it first in a backward pass too
            if rep % 2 == 1 and "alone" in order:
                order.remove("alone")
                order.insert(0, "alone")
            # mps needs the private daemon; spatial needs the MPS binaries (gpuslice starts a daemon of its own)
            out.extend((kind, m, rep) for m in order
                       if runnable(base_mode(m), args) and (not m.endswith("-variant") or getattr(args, "variant_lib", "")))
    return out


def base_mode(mode: str) -> str:
    """The co-located mode a solo or variant mode is set up as (itself for the others)."""
    return SOLO.get(mode) or SOLO_TRAINER.get(mode) or VARIANT.get(mode) or mode


def runnable(mode: str, args: argparse.Namespace) -> bool:
    """mps needs the private daemon; spatial needs the MPS binaries (gpuslice starts a daemon of its own)."""
    if mode == "mps":
        return bool(args.mps_pipe or args.dry)
    return mode != "spatial" or bool(args.mps_pipe and not args.dry)


class ClockSampler(threading.Thread):
    """The GPU's SM clock (NVML, nvidia-ml-py) every `every` s from t0 to t0 + window: whether 'alone' ran at
    lower clocks than the co-located phases (an idle GPU between requests may drop its clocks: issue 13). Also
    NVML's memory utilization (the percent of its last sample period, 1/6-1 s, in which device memory was read
    or written): how much the neighbour keeps the memory system busy, the leading suspect for what the spatial
    engine's SM partition does not protect (a streaming neighbour cost the decoder 3.2 %, README Limits)."""

    def __init__(self, t0: float, window: float, index: int = 0, every: float = 0.05):
        super().__init__(daemon=True)
        self.t0, self.window, self.index, self.every = t0, window, index, every
        self.mhz: list[int] = []
        self.mem: list[int] = []
        self.max_mhz: int | None = None
        self.error = ""

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
                self.max_mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
                while time.time() < self.t0:
                    time.sleep(0.005)
                while time.time() < self.t0 + self.window:
                    self.mhz.append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
                    self.mem.append(pynvml.nvmlDeviceGetUtilizationRates(h).memory)
                    time.sleep(self.every)
            finally:
                pynvml.nvmlShutdown()
        except Exception as exc:  # no NVML (the CPU double has no clocks): recorded, never a crash
            self.error = f"{type(exc).__name__}: {exc}"[:200]

    def result(self) -> dict:
        if not self.mhz:
            return {"error": self.error or "no samples"}
        return {"mean": round(statistics.fmean(self.mhz), 1), "min": min(self.mhz), "max": max(self.mhz),
                "p10": sorted(self.mhz)[len(self.mhz) // 10], "n": len(self.mhz), "max_sm_mhz": self.max_mhz,
                "mem_util_pct": round(statistics.fmean(self.mem), 1) if self.mem else None}


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.tmp = Path(args.tmp)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        self.env.update(GPUSLICE_STATE_DIR=str(self.tmp / "state"), PYTHONUNBUFFERED="1", GPUSLICE_KILL_GRACE="3",
                        GS_COLOC_TRAINER=args.trainer)
        self.t_end = time.monotonic() + args.budget
        self.raw: dict = {"phases": [], "skipped": [], "window_s": args.window, "reps": args.reps,
                          "trainer": args.trainer}
        self.busy: dict[str, float] = {}  # kind -> the server's busy fraction alone (latest)
        self.live: dict[str, subprocess.Popen] = {}  # the phase's processes (each its own session) while it runs

    def stop_workers(self) -> None:
        """End the running phase's processes (a bench ended by a signal: they run in sessions of their own)."""
        for p in self.live.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def worker(self, kind: str, folder: Path, role: str) -> list[str]:
        cmd = [sys.executable, str(WORKER), "--kind", kind, "--ready", str(folder / f"ready.{role}"),
               "--go", str(folder / "go"), "--out", str(folder / f"out.{role}.json"), "--window", str(self.args.window)]
        slot = getattr(self.args, "slot", 0.0)
        return cmd + (["--slot", f"{slot:g}"] if slot else []) + (["--dry"] if self.args.dry else [])

    def command(self, mode: str, role: str, kind: str, folder: Path) -> tuple[list[str], dict]:
        """The process of one role (server or trainer) in one mode: its command and environment."""
        w = self.worker(kind if role == "server" else "train", folder, role)
        env = dict(self.env)
        variant, mode = mode, base_mode(mode)
        if mode == "mps":
            env.update(CUDA_MPS_PIPE_DIRECTORY=self.args.mps_pipe or str(self.tmp / "no-mps"),
                       CUDA_MPS_CLIENT_PRIORITY="0" if role == "server" else "1")
            if variant == "solo-mps-pinned":
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = SPATIAL_PINNED
            if variant == "solo-mps-enforced":  # a time-sliced slice keeps the caller's MPS pipe: the private daemon
                return [sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", "16GiB",
                        "--engine", "timeslice", "--priority", "high", "--", *w], env
            return w, env
        if mode not in ("preemptive", "shared", "tidal", "spatial", "default"):
            return w, env
        if variant.endswith("-variant"):  # both processes on the build with measurement switches
            env["GPUSLICE_ENFORCER_LIB"] = self.args.variant_lib
        opts = ["run", "--device", "0", "--memory", "16GiB", "--priority", "high" if role == "server" else "low"]
        if mode in ("preemptive", "shared", "tidal"):  # the time-sliced engine, named (auto would choose spatial)
            opts += ["--engine", "timeslice"]
        if mode == "spatial":  # gpuslice's MPS engine: the low-priority trainer a below-normal client of its daemon
            opts += ["--engine", "spatial"]
            if variant in ("spatial-gate", "spatial-gate-full", "spatial-gate-variant"):  # both ask for the yield gate
                env["GPUSLICE_SPATIAL_YIELD"] = "1"
            full = variant in ("spatial-full", "spatial-gate-full")
            cap = 100 if full else getattr(self.args, "spatial_trainer_compute", 0)
            if cap and role == "trainer":  # its MPS active-thread percentage: SMs the server's kernels find free
                opts += ["--compute", str(cap)]
        if mode == "shared":
            share = round(min(90, max(10, self.busy.get(kind, 0.5) * 100 * 1.25 + 5)))
            opts += ["--colocation", "shared", "--mode", "soft",
                     "--compute", str(share if role == "server" else 100 - share)]
        elif mode == "tidal" and role == "trainer":
            opts += ["--colocation", "tidal"]
        return [sys.executable, "-m", "gpuslice.cli", *opts, "--", *w], env

    @staticmethod
    def _await_grant(log: Path, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
        """Until the grant line is in the process's log (or it ended, or ``timeout`` s): whether it came."""
        deadline = time.monotonic() + timeout
        while grant_line(log) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return grant_line(log) is not None

    def pacer_paths(self) -> dict[str, str]:
        """pid -> the pacer path of each gpuslice process on the device now (enforcer's device state)."""
        try:
            from gpuslice.enforcer.devstate import read_device_state
        except ImportError:
            return {}
        out = {}
        for f in glob.glob(str(self.tmp / "state" / "**" / "*.slices"), recursive=True):  # a device's slice records
            try:
                for s in read_device_state(f).slices:
                    for p in s.processes:
                        out[str(p.pid)] = f"{s.colocation}/{'high' if s.priority == 0 else 'low'}:{p.path}"
            except Exception as exc:  # a reader error is evidence too, never a crash of the bench
                out["error"] = str(exc)[:200]
        return out

    def run_phase(self, kind: str, mode: str, rep: int) -> None:
        estimate = STARTUP_S + self.args.window + 2
        label = f"{kind}/{mode}#{rep}"
        if time.monotonic() + estimate > self.t_end:
            self.raw["skipped"].append(label)
            self.say(f"skip {label}: the time budget is spent")
            return
        folder = self.tmp / "phase" / f"{kind}-{mode}-{rep}"
        folder.mkdir(parents=True, exist_ok=True)
        roles = (["server"] if mode == "alone" or mode in SOLO else ["trainer"] if mode in ("trainer", *SOLO_TRAINER)
                 else ["server", "trainer"])
        procs, no_grant = {}, ""
        self.live = procs
        for role in roles:
            cmd, env = self.command(mode, role, kind, folder)
            if role == "trainer" and base_mode(mode) in ("spatial", "default"):  # its enforcer says its SM cap (one
                env.setdefault("GPUSLICE_LOG_LEVEL", "info")                    # line at start; the server's untouched)
            log = open(self.logs / f"{kind}-{mode}-{rep}-{role}.log", "w")
            procs[role] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if role == "server" and "trainer" in roles and base_mode(mode) in GPUSLICE_MODES:
                # the trainer starts once the server holds its grant: a yielding spatial trainer takes its SM cap
                # from the device's roster when its process starts, and one whose grant came first (the two
                # `gpuslice run`s raced) was not capped (2026-12-06: a GPU-bound server read 1.24x alone beside
                # such a run's trainer at 0.98x its alone speed, against 1.06x and 0.86x the run before)
                if not self._await_grant(self.logs / f"{kind}-{mode}-{rep}-{role}.log", procs[role]):
                    no_grant = "the server had no grant line when the trainer started (refused, or 60 s passed)"
        rec: dict = {"kind": kind, "mode": mode, "rep": rep, "t": time.time()}
        if no_grant:
            rec["error"] = no_grant
        deadline = time.monotonic() + 120
        while not all((folder / f"ready.{r}").exists() for r in roles):
            if any(p.poll() is not None for p in procs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        t0 = time.time() + 0.5
        (folder / "go.tmp").write_text(f"{t0:.6f}")
        os.replace(folder / "go.tmp", folder / "go")
        clock = ClockSampler(t0, self.args.window)
        clock.start()
        time.sleep(0.5 + self.args.window / 2)
        rec["paths"] = self.pacer_paths() if base_mode(mode) in ("preemptive", "shared", "tidal", "spatial",
                                                                  "default") else {}
        for role, p in procs.items():
            try:
                p.wait(timeout=self.args.window + 60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
            f = folder / f"out.{role}.json"
            rec[role] = json.loads(f.read_text()) if f.exists() else {"error": f"no result (exit {p.returncode})"}
            rec[role]["exit"] = p.returncode
            grant = grant_line(self.logs / f"{kind}-{mode}-{rep}-{role}.log")
            if grant:  # what gpuslice granted (its engine, its SM cap): the default mode's evidence
                rec[role]["grant"] = grant
            threads = mps_threads(self.logs / f"{kind}-{mode}-{rep}-{role}.log")
            if threads is not None:  # a spatial process's MPS active-thread percentage, as its enforcer set it
                rec[role]["mps_threads"] = threads
        clock.join(timeout=5)
        rec["sm_clock_mhz"] = clock.result()
        if mode == "alone" and "busy_fraction" in rec.get("server", {}):
            self.busy[kind] = rec["server"]["busy_fraction"]
        self.raw["phases"].append(rec)
        s, t = rec.get("server", {}), rec.get("trainer", {})
        self.say(f"{label}: server p50 {s.get('p50_ms')} p99 {s.get('p99_ms')} ms, trainer {t.get('it_per_s')} it/s, "
                 f"SM clock {rec['sm_clock_mhz'].get('mean', rec['sm_clock_mhz'].get('error'))} MHz"
                 + (f", paths {rec['paths']}" if rec["paths"] else ""))

    def run(self) -> None:
        plan = phases(self.args)
        for kind, mode, rep in plan:
            self.run_phase(kind, mode, rep)
            (self.out / "coloc-raw.json").write_text(json.dumps(self.raw, indent=1))


def _log_text(log: Path) -> str:
    """A process's log as text ("" while there is none)."""
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def grant_line(log: Path) -> str | None:
    """The grant line `gpuslice run` wrote in a process's log (``gpuslice: grant g-…: <device> memory … compute
    …``), without its prefix."""
    text = _log_text(log)
    lead = "gpuslice: grant g-"
    return next((line.strip()[len("gpuslice: "):] for line in text.splitlines() if line.startswith(lead)), None)


GPUSLICE_MODES = ("preemptive", "shared", "tidal", "spatial", "default")  # base modes run under `gpuslice run`


def mps_threads(log: Path) -> int | None:
    """The active-thread percentage a spatial process's enforcer logged at its start (``spatial slice: MPS client
    of …, active threads N%``, GPUSLICE_LOG_LEVEL=info), or None."""
    found = re.search(r"spatial slice: MPS client of .*?, active threads (\d+)%", _log_text(log))
    return int(found.group(1)) if found else None


def chosen_engines(phs: list[dict], kind: str) -> list[str]:
    """What gpuslice granted in the default mode's phases (no --engine): each role's engines, from its grant lines."""
    got = [p for p in phs if p["kind"] == kind and p["mode"] == "default"]
    if not got:
        return []
    said = []
    for role in ("server", "trainer"):
        lines = [p.get(role, {}).get("grant") for p in got]
        engines = sorted({granted_engine(g) for g in lines if g})
        caps = sorted({p[role]["mps_threads"] for p in got if isinstance(p.get(role, {}).get("mps_threads"), int)})
        said.append(f"the {role} {' / '.join(engines) or 'no grant line'} in {sum(1 for g in lines if g)} of "
                    f"{len(got)} phases" + (f" (MPS active threads {', '.join(f'{c}%' for c in caps)})" if caps else ""))
    return [f"Default mode (issue 13's commands, no --engine): gpuslice granted {'; '.join(said)}.", ""]


def granted_engine(line: str) -> str:
    """The engine a grant line names: ``spatial`` (an MPS client: the line says so) or ``timeslice``."""
    return "spatial" if "(spatial, MPS" in line else "timeslice"


# ---------------------------------------------------------------------------------------------- report
def _side(p: dict, role: str, part: str = "on") -> dict:
    """A phase's result of one role. Under the paired protocol (--slot) a co-located server's figures are those
    of the slots the trainer worked in (part "on") or rested in ("off"); alone, every request counts."""
    got = p.get(role, {})
    if role == "server" and part in got and p["mode"] not in ("alone", "trainer") and p["mode"] not in SOLO:
        return got[part]
    return got


def _vals(phs: list[dict], kind: str, mode: str, role: str, key: str, part: str = "on") -> list[float]:
    return [_side(p, role, part)[key] for p in phs if p["kind"] == kind and p["mode"] == mode
            and isinstance(_side(p, role, part).get(key), (int, float))]


def _pooled(phs: list[dict], kind: str, mode: str, q: float, part: str = "on") -> float | None:
    """The q-quantile of the server's latencies of every repeat together (a 3-s window holds 150-700
    requests: one repeat's p99 is its 2nd-7th slowest request)."""
    lat = sorted(x for p in phs if p["kind"] == kind and p["mode"] == mode
                 for x in _side(p, "server", part).get("lat_ms", []))
    return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None


def _split_phases(phs: list[dict], kind: str, mode: str) -> list[dict]:
    """The phases of a mode whose server was measured under the paired protocol (--slot). The server alone is
    split the same way (slots with no trainer in either): its on/off ratio is the protocol's own spread."""
    return [p for p in phs if p["kind"] == kind and p["mode"] == mode and "on" in p.get("server", {})
            and mode != "trainer" and mode not in SOLO_TRAINER]


def _split_pooled(ph: list[dict], q: float, part: str) -> float | None:
    """The q-quantile of the server's latencies in the on- or off-slots (part) of the phases ph together."""
    lat = sorted(x for p in ph for x in p["server"][part].get("lat_ms", []))
    return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None


def _phase_ratio(p: dict, key: str) -> float | None:
    """One phase's server figure (key: p50_ms or p99_ms) in the trainer's slots over its rest slots; None when a
    side has none."""
    on, off = p["server"]["on"].get(key), p["server"].get("off", {}).get(key)
    return on / off if on and off else None


def paired_ratios(phs: list[dict], kind: str, mode: str, q: float) -> list[float]:
    """Each repeat's server p50 (q 0.5) or p99 (q 0.99) in the trainer's slots over the same in its rest slots, in
    run order. Judged by their median: pooling the repeats' requests mixes ABBA positions, and the VM drifts
    between positions by more than the goal (the decoder alone read 17.2 and 23.1 ms in one run,
    bench/results/2026-11-30-h200-coloc-current-gpubound-decode.md), so the pooled ratio can sit outside
    every repeat's own. For "alone" (no trainer in any slot) it is the null: what the split reads by itself."""
    key = "p50_ms" if q == 0.5 else "p99_ms"
    out = []
    for p in _split_phases(phs, kind, mode):
        r = _phase_ratio(p, key)
        # no request in the trainer's slots (every one stalled past its slot, or none made) is the worst repeat,
        # never a dropped one; none in the rest slots says nothing
        out.extend([r] if r else [float("inf")] if p["server"].get("off", {}).get(key) else [])
    return out


def paired(phs: list[dict], kind: str) -> list[str]:
    """The paired protocol's table (--slot): each co-located server against itself in the slots the trainer
    rested in, so the drift of the VM's CPU speed between phases and what a new process draws (cuDNN's
    algorithms, its cores) cancel; the repeats' own ratios, their median judged (paired_ratios). The server
    alone, split the same way, comes first: the spread the split has with no trainer at all."""
    rows = []
    for mode in ALL_MODES:
        if mode in SOLO or mode in ("trainer", *SOLO_TRAINER):
            continue
        ph = _split_phases(phs, kind, mode)
        if not ph:
            continue
        cells = []
        for q in (0.5, 0.99):
            on, off = _split_pooled(ph, q, "on"), _split_pooled(ph, q, "off")
            per = paired_ratios(phs, kind, mode, q)
            cells.append(f"{statistics.median(per):.3f}x [{', '.join(f'{r:.3f}' for r in per)}]; pooled {on:.2f} / "
                         f"{off:.2f} ms ({on / off:.3f}x)" if on and off and per else "-")
        n = sum(len(p["server"]["on"].get("lat_ms", [])) for p in ph), sum(len(p["server"]["off"].get("lat_ms", [])) for p in ph)
        label = "alone (no trainer: the null)" if mode == "alone" else mode
        rows.append(f"| {label} | {cells[0]} | {cells[1]} | {n[0]} / {n[1]} |")
    if not rows:
        return []
    slot = next((p["server"].get("slot_s") for p in phs if "slot_s" in p.get("server", {})), None)
    orders = {p["server"].get("slot_order", "") for p in phs if "slot_s" in p.get("server", {})}
    order = {"thue-morse": "Thue-Morse order", "alternating": "every other slot",
             "": "order not recorded: every other slot before becd189"}.get(" ".join(orders), "mixed orders")
    return [f"Paired (the trainer on in half the {slot:g}-s slots of the same phase, {order}): the server's figure in "
            "the trainer's slots over the same in its rest slots, the median of the repeats [each repeat's, in run order]; "
            "then all repeats' requests pooled (on / off ms). Requests in the first 0.1 s of a slot or crossing into "
            "the next are in neither. The server alone is split the same way with no trainer in any slot: its ratio "
            "is what the split reads by itself.", "", "| mode | p50 on / off | p99 on / off | requests on / off |",
            "| --- | --- | --- | --- |"] + rows + [""]


YIELD_WHY = (("yield_backlog_ns", "server's backlog"), ("yield_late_ns", "server's late start"),
             ("yield_busy_ns", "server busy (measured)"), ("yield_no_looks_ns", "server without looks"),
             ("yield_own_queue_ns", "own queue bound"))
# a label for every sleep counter the worker reads, and for nothing else (a counter added there shows up here)
assert {k for k, _ in YIELD_WHY} == set(YIELD_KEYS) - {"yield_entries"}, "coloc_worker.YIELD_KEYS and YIELD_WHY differ"


def yield_table(phs: list[dict], kind: str, window: float | None) -> list[str]:
    """Where a yielding trainer waited inside the window: its enforcer's counters (gpuslice_pacer_stats, read at the
    window's start and end by coloc_worker), its launch threads' sleeps in the yield gate by why, as % of the time it
    worked in the window (mean of the repeats). The server's reasons are time it gave up for the server; its own queue
    bound is the normal state of a trainer that keeps the device busy (it sleeps while YIELD_QUEUE is in flight)."""
    rows = []
    for mode in ALL_MODES:
        got = [(p["trainer"]["yield"], p["trainer"].get("on_s") or window or 0) for p in phs
               if p["kind"] == kind and p["mode"] == mode and isinstance(p.get("trainer", {}).get("yield"), dict)]
        got = [(y, w) for y, w in got if w > 0]
        if not got:
            continue
        cells = [f"{statistics.fmean(100 * y[k] / 1e9 / w for y, w in got):.1f} %" for k, _ in YIELD_WHY]
        held = f"{statistics.fmean(y['yield_entries'] / w for y, w in got):.0f}"
        rows.append(f"| {mode} | " + " | ".join(cells) + f" | {held} |")
    if not rows:
        return []
    return ["Where the yielding trainer waited (its enforcer's counters over the window: the launch threads' sleeps "
            "in the yield gate by why, % of the time it worked; mean of the repeats; several threads can sleep at "
            "once). The server's reasons are time given up for it; the own queue bound is the trainer keeping at "
            "most YIELD_QUEUE in flight.", "",
            "| mode | " + " | ".join(n for _, n in YIELD_WHY) + " | holds let go / s |",
            "| --- |" + " --- |" * (len(YIELD_WHY) + 1)] + rows + [""]


def _mean(v: list[float]) -> float | None:
    return statistics.fmean(v) if v else None


def _clock(phs: list[dict], kind: str, mode: str) -> str:
    """The SM clock over the phase's window: mean of the repeats' means [lowest sample seen], or why none."""
    got = [p["sm_clock_mhz"] for p in phs if p["kind"] == kind and p["mode"] == mode and "sm_clock_mhz" in p]
    ok = [c for c in got if "mean" in c]
    if not ok:
        return "n/a" if not got else "n/a (" + got[0].get("error", "")[:40] + ")"
    return f"{statistics.fmean(c['mean'] for c in ok):.0f} [min {min(c['min'] for c in ok)}]"


def _mem_busy(phs: list[dict], kind: str, mode: str) -> str:
    """NVML's memory utilization over the phase's window: mean of the repeats' means [their range], or '-'."""
    got = [c["mem_util_pct"] for p in phs if p["kind"] == kind and p["mode"] == mode
           for c in [p.get("sm_clock_mhz") or {}] if isinstance(c.get("mem_util_pct"), (int, float))]
    return f"{statistics.fmean(got):.0f} [{min(got):.0f}-{max(got):.0f}]" if got else "-"


def _fmt(v: list[float], ref: float | None = None, digits: int = 2, main: float | None = None) -> str:
    """main (default: the mean) [min-max of the repeats] (x ref)"""
    if not v:
        return "-"
    m = statistics.fmean(v) if main is None else main
    text = f"{m:.{digits}f}" + (f" [{min(v):.{digits}f}-{max(v):.{digits}f}]" if len(v) > 1 else "")
    return text + (f" ({m / ref:.3f}x)" if ref else "")


def failed_phase(p: dict) -> str | None:
    """Why a phase measured nothing it can be judged by (a process failed or exited non-zero, or the server had
    no grant when the trainer started), else None. Its figures are left out of every table and goal: a server
    timed beside a trainer that crashed read as if it had been co-located."""
    if p.get("error"):
        return p["error"]
    for role in ("server", "trainer"):
        side = p.get(role)
        if isinstance(side, dict) and (side.get("error") or side.get("exit", 0) != 0):
            return f"{role}: {side.get('error') or 'exit ' + str(side.get('exit'))}"
    return None


def report(raw: dict) -> str:
    verdicts = [(p, failed_phase(p)) for p in raw["phases"]]
    failed = [(p, why) for p, why in verdicts if why]
    phs = [p for p, why in verdicts if not why]
    lines = [f"Window {raw.get('window_s')} s per phase, {raw.get('reps')} repeats (ABBA). Server p50 / p99: of all "
             "repeats' requests together [min-max of the repeats' own]; trainer: mean [min-max]; x = against the "
             "same kind alone.", ""]
    synthetic = raw.get("trainer", DEFAULT_TRAINER) != DEFAULT_TRAINER
    if synthetic:
        lines += [f"The trainer's place is taken by the synthetic neighbour **{raw['trainer']}** "
                  "(bench/gpu/coloc_worker.py, GS_COLOC_TRAINER): its it/s are its steps, not a trainer's.", ""]
    goals: list[str] = []
    t_alone = _mean([p["trainer"]["it_per_s"] for p in phs if p["mode"] == "trainer"
                     and isinstance(p.get("trainer", {}).get("it_per_s"), (int, float))])
    for kind in KINDS:
        if not any(p["kind"] == kind for p in phs):
            continue
        p50a, p99a = _pooled(phs, kind, "alone", 0.50), _pooled(phs, kind, "alone", 0.99)
        busy = _mean(_vals(phs, kind, "alone", "server", "busy_fraction"))
        talone = _mean(_vals(phs, kind, "trainer", "trainer", "it_per_s")) or t_alone
        idle = None if busy is None else 1 - busy
        bound = talone * idle if talone and idle is not None else None
        reqa = _mean(_vals(phs, kind, "alone", "server", "req_per_s"))
        think = _mean(_vals(phs, kind, "alone", "server", "think_ms"))
        between = (think / 1000 * reqa) if reqa and think else None  # the share of time between requests
        lines += [f"### {KIND_NAMES[kind]}", "",
                  f"Alone: the server keeps the device busy {100 * busy:.1f} % of the time (idle {100 * idle:.1f} %); "
                  f"between requests {100 * between:.1f} % of the time; trainer alone {talone:.2f} it/s, so the idle bound "
                  f"is {bound:.2f} it/s." if busy is not None and talone and between else "Alone: not measured.", "",
                  "| mode | server p50 ms | server p99 ms | trainer it/s | trainer / idle bound | SM MHz | memory busy % "
                  "| pacer paths |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for mode in ALL_MODES:
            p50, p99 = _vals(phs, kind, mode, "server", "p50_ms"), _vals(phs, kind, mode, "server", "p99_ms")
            tr = _vals(phs, kind, mode, "trainer", "it_per_s")
            if not (p50 or tr):
                continue
            paths = sorted({v for p in phs if p["kind"] == kind and p["mode"] == mode for v in p.get("paths", {}).values()})
            lines.append(f"| {mode} | {_fmt(p50, p50a if mode != 'alone' else None, main=_pooled(phs, kind, mode, 0.5))} | "
                         f"{_fmt(p99, p99a if mode != 'alone' else None, main=_pooled(phs, kind, mode, 0.99))} | {_fmt(tr, talone if mode != 'trainer' else None)} | "
                         f"{f'{_mean(tr) / bound:.2f}' if tr and bound and mode not in ('trainer', *SOLO_TRAINER) else '-'} | "
                         f"{_clock(phs, kind, mode)} | {_mem_busy(phs, kind, mode)} | {', '.join(paths) or '-'} |")
        lines.append("")
        lines += chosen_engines(phs, kind)
        lines += yield_table(phs, kind, raw.get("window_s"))
        lines += paired(phs, kind)
        goals += _goals(kind, phs, p50a, p99a, bound, talone, between)
    errors = [f"{p['kind']}/{p['mode']}#{p['rep']} {why}: left out of every figure above" for p, why in failed]
    lines += ["### Goals (issue 13)" + (f": not judged, the neighbour is {raw['trainer']}, not the trainer; the goal "
                                       "lines for reference only" if synthetic else ""), ""] + [f"- {g}" for g in goals]
    if raw.get("skipped"):
        lines.append(f"- not run (time budget): {', '.join(raw['skipped'])}")
    if errors:
        lines += ["", "### Errors", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines) + "\n"


T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # Student's t, two-sided 95 %, by degrees of freedom


def matched_null(phs: list[dict], kind: str, mode: str, q: float) -> str:
    """Each repeat's paired ratio over the null's of the same run and ABBA repeat (the server alone, split the same
    way): their geometric mean and its 95 % interval (Student's t on the logs). This, not the median against the
    goal alone, says what the trainer adds beyond the split's own reading (bench/results/
    2026-11-30-h200-coloc-decode-null.md: the decoder's median 1.05 was x1.051 [0.984-1.122] over its null)."""
    key = "p50_ms" if q == 0.5 else "p99_ms"
    null = {(p.get("run", 0), p["rep"]): _phase_ratio(p, key) for p in _split_phases(phs, kind, "alone")}
    d = [math.log(r / null[k]) for p in _split_phases(phs, kind, mode)
         if (r := _phase_ratio(p, key)) and null.get(k := (p.get("run", 0), p["rep"]))]
    if len(d) < 2:
        return ""
    t = T95[max(k for k in T95 if k <= len(d) - 1)]
    m, half = statistics.fmean(d), t * statistics.stdev(d) / math.sqrt(len(d))
    return (f"; over the null of the same repeats x{math.exp(m):.3f} [95 % CI {math.exp(m - half):.3f}-"
            f"{math.exp(m + half):.3f}, {len(d)} pairs]")


def _goals(kind: str, phs: list[dict], p50a, p99a, bound, talone, between) -> list[str]:
    out = _mode_goals(kind, "preemptive", phs, p50a, p99a, bound, talone, between)
    for mode in ("preemptive-variant", *SPATIAL_MODES):  # the variant and the spatial engine, judged alike
        if _pooled(phs, kind, mode, 0.5) is not None:
            out += _mode_goals(kind, mode, phs, p50a, p99a, bound, talone, between)
    for mode in (*PREEMPTIVE_MODES, *SPATIAL_MODES):  # paired: against the same server in its rest slots
        for q, lim in ((0.5, 1.03), (0.99, 1.10)):
            per = paired_ratios(phs, kind, mode, q)
            if per:
                r = statistics.median(per)
                runs = {p.get("run", 0) for p in _split_phases(phs, kind, mode)}
                null = paired_ratios([p for p in phs if p.get("run", 0) in runs], kind, "alone", q)
                beside = (f"; the server alone read {statistics.median(null):.3f}x on the same split in the same "
                          f"run(s) (median of {len(null)}: the split's own spread)" if null else "")
                few = "; under 3 repeats: inside the split's noise" if len(per) < 3 else ""
                out.append(f"{kind}: {mode} paired server p{int(q * 100)} {r:.3f}x its rest slots, the median of "
                           f"{len(per)} repeats [{min(per):.3f}-{max(per):.3f}] (goal <= {lim:.2f}x): "
                           + ("met" if r <= lim else f"MISSED by {100 * (r - lim):.1f} points") + few + beside
                           + matched_null(phs, kind, mode, q))
    return out


def _mode_goals(kind: str, mode: str, phs: list[dict], p50a, p99a, bound, talone, between) -> list[str]:
    out = []
    p50, p99 = _pooled(phs, kind, mode, 0.5), _pooled(phs, kind, mode, 0.99)
    tr = _mean(_vals(phs, kind, mode, "trainer", "it_per_s"))
    if None in (p50, p99, p50a, p99a):
        return [f"{kind}: {mode} or alone not measured"]
    for name, got, ref, lim in (("p50", p50, p50a, 1.03), ("p99", p99, p99a, 1.10)):
        r = got / ref
        out.append(f"{kind}: {mode} server {name} {r:.3f}x alone (goal <= {lim:.2f}x): "
                   + ("met" if r <= lim else f"MISSED by {100 * (r - lim):.1f} points"))
    if tr is not None and bound:
        r = tr / bound
        note = ""
        if r < 0.8 and between and talone and mode in PREEMPTIVE_MODES:
            note = (f"; between requests alone ({100 * between:.0f} % of the time) the bound is "
                    f"{talone * between:.2f} it/s, the trainer got {tr / (talone * between):.2f} of that: the rest of the "
                    "idle time is inside requests (CPU gaps, per-token syncs), which the yield path gives only where its "
                    "drain looks see the server's queue empty")
        out.append(f"{kind}: {mode} trainer {r:.2f} of the idle bound (goal >= 0.80): "
                   + ("met" if r >= 0.8 else f"MISSED by {100 * (0.8 - r):.0f} points") + note)
    plain_p99 = _pooled(phs, kind, "plain", 0.99)
    plain_tr = _mean(_vals(phs, kind, "plain", "trainer", "it_per_s"))
    # The floor for the low-priority side under every mode that protects the server (the time-sliced
    # preemptive and the spatial engine alike): never less than plain time-slicing where plain protects as well.
    if plain_p99 and plain_tr and tr is not None and mode in (*PREEMPTIVE_MODES, *SPATIAL_MODES):
        protected = plain_p99 <= 1.10 * p99a
        out.append(f"{kind}: plain time-slicing gives p99 {plain_p99 / p99a:.2f}x alone and the trainer "
                   f"{plain_tr:.2f} it/s vs {mode} {tr:.2f}: "
                   + (("met" if tr >= plain_tr else f"MISSED: plain protects the tail too and the trainer got "
                       f"{100 * (1 - tr / plain_tr):.0f} % more there") if protected
                      else "plain does not give the same p99 protection, so it is no floor here"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--tmp")
    ap.add_argument("--steps", default="")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--budget", type=float, default=420)
    ap.add_argument("--mps-pipe", default="")
    ap.add_argument("--spatial-trainer-compute", type=int, default=0,
                    help="under spatial, the trainer's compute share (its MPS active-thread percentage); 0: none")
    ap.add_argument("--variant-lib", default="",
                    help="the enforcer built with measurement switches, for the -variant modes (coloc.sh builds it)")
    ap.add_argument("--slot", type=float, default=0.0,
                    help="paired protocol: the trainer works in half the slots of this many s, Thue-Morse order "
                         "(0: the whole window)")
    ap.add_argument("--tidal", action="store_true")
    ap.add_argument("--trainer", choices=TRAINERS, default=DEFAULT_TRAINER,
                    help="the neighbour in the trainer's place (coloc_worker.build_trainer): transformer, or a "
                         "synthetic load of one resource, alu (arithmetic) or hbm (memory bandwidth, the L2)")
    ap.add_argument("--modes", default="", help=f"comma list of {','.join(ALL_MODES)} (default: all but tidal and the solo modes)")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--report", nargs="+")
    ap.add_argument("--slot-order", choices=("thue-morse", "alternating"), default="",
                    help="with --report: the split's order for raws that did not record it (before ff3c3e4; "
                         "2026-11-30-h200-coloc-thuemorse-decode-raw.tgz is thue-morse, older ones alternating)")
    args = ap.parse_args()
    bad = [m for m in args.modes.split(",") if m.strip() and m.strip() not in ALL_MODES]
    if bad:
        ap.error(f"--modes: unknown {','.join(bad)}; allowed: {','.join(ALL_MODES)}")
    if args.slot and round(args.window / args.slot) % 8:
        ap.error(f"--window {args.window:g} / --slot {args.slot:g}: the paired split needs a multiple of 8 slots (the "
                 "Thue-Morse order balances the trainer's slots against its rest slots only over 8, 16, ...)")
    if args.report:
        merged: dict = {"phases": [], "skipped": []}
        for i, f in enumerate(args.report):
            r = json.loads(Path(f).read_text())
            if i and r.get("trainer", DEFAULT_TRAINER) != merged.get("trainer", DEFAULT_TRAINER):
                ap.error(f"--report {f}: its trainer is {r.get('trainer', 'transformer')}, the files before it had "
                         f"{merged.get('trainer', 'transformer')}: one table holds one neighbour")
            for p in r["phases"]:
                p["run"] = i  # the null beside a paired goal comes from the same runs
                if args.slot_order and "slot_s" in p.get("server", {}):
                    p["server"].setdefault("slot_order", args.slot_order)
            merged["phases"] += r["phases"]
            merged["skipped"] += r.get("skipped", [])
            merged.update({k: r[k] for k in ("window_s", "reps", "trainer") if k in r})
        print(report(merged))
        return 0
    plan = phases(args)
    est = len(plan) * (STARTUP_S + args.window + 2)
    print(f"plan: {len(plan)} phases ({', '.join(sorted({k for k, _, _ in plan}))}), {args.reps} repeats, window "
          f"{args.window:g} s: planned {est:.0f} s (cut at {args.budget:.0f} s)"
          + ("" if args.mps_pipe or args.dry else "; no MPS daemon: no mps rows"), flush=True)
    if args.plan_only:
        return 0
    bench = Bench(args)
    # a device call's time limit ends the bench with SIGTERM: the phases done so far still get their report
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        bench.run()
    finally:
        bench.stop_workers()
        (Path(args.out) / "coloc-raw.json").write_text(json.dumps(bench.raw, indent=1))
        (Path(args.out) / "coloc.md").write_text(report(bench.raw))
    failed = [p for p in bench.raw["phases"] if failed_phase(p)]
    return 1 if failed or not bench.raw["phases"] else 0


if __name__ == "__main__":
    sys.exit(main())
