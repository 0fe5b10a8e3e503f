"""Packing benchmark (issue 12): N launch-bound inference services on one GPU, with and without gpuslice.

For each model kind (bench/gpu/packing_worker.py: ResNet-50 and a transformer encoder, batch 8, fp16) it
starts one long-lived process per service and mode, so a process starts (imports, loads, warms up) once
and the measured phases cost only their own seconds:
  plain     no gpuslice: the driver time-slices the contexts
  mps       raw MPS, each client CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / N (one set of clients per N)
  memonly   gpuslice slices of 4 GiB and no compute share (the light path)
  hard      gpuslice equal hard shares (100 / N, whole percent, set live in the device state per phase)
  soft      gpuslice equal soft shares
A phase runs N services of one mode together for --seconds (the first 0.5 s not counted); the others
sit idle (no GPU work, so no time slices). Phases go in ABBA order: modes forward then backward, N up
then down, repeated --reps times, with one copy alone first and last. Each service's share of the
device's time is its request rate x the model's GPU time per request (a CUDA graph of one request
replayed back to back while nothing else runs: the ruler); NVML's per-process utilization and the
pacer's own charged time are shown beside it.

  python3 bench/gpu/packing.py --out DIR [--seconds 3.5] [--reps 2] [--kinds resnet50,encoder] [--ns 2,4,8]
  python3 bench/gpu/packing.py --focus --out DIR   only the cells issue 12 still missed (FOCUS below), 4 ABBA
                                                   repeats: about 3 minutes
  python3 bench/gpu/packing.py --plan ...          print the phases and the planned time, run nothing
  python3 bench/gpu/packing.py --report DIR        the tables again from DIR/packing-raw.json

MPS: set PACK_MPS_PIPE (and PACK_MPS_LOG) to a running private daemon's directories (packing.sh starts
and stops it); without them the mps mode is skipped and the results say so. Writes DIR/packing-raw.json
and DIR/packing.md (the tables; packing.sh adds them to the dated results file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))
from gpuslice.enforcer import devstate, policy  # noqa: E402
from gpuslice.enforcer.slicefile import read_slice_file, write_slice_file  # noqa: E402

LIB = Path(os.environ.get("PACK_LIB", ROOT / "native" / "build" / "libgpuslice.so"))
WORKER = [sys.executable, str(HERE / "packing_worker.py")]
# Variants of the enforcer, A/B in one run (PACK_VARIANTS="B=/path/libgpuslice.so,C=..."): each adds a mode
# "hard-B", ... of equal hard shares whose services preload that build (a constant changed at compile time),
# interleaved with the others in the same ABBA order, so a constant is chosen by measurement (issue 12)
def use_variants(variants: dict[str, str]) -> None:
    """The modes for these variants (name -> library): from PACK_VARIANTS, or read back from a run's raw data
    (--report). GPUSLICE: mode -> (slice mode, paced)."""
    global VARIANTS, MODES, GPUSLICE, PACED
    VARIANTS = dict(variants)
    MODES = ("plain", "mps", "memonly", "hard", *(f"hard-{v}" for v in VARIANTS), "soft")
    GPUSLICE = {"memonly": ("hard", False), "hard": ("hard", True), "soft": ("soft", True),
                **{f"hard-{v}": ("hard", True) for v in VARIANTS}}
    PACED = tuple(m for m, (_, paced) in GPUSLICE.items() if paced)


use_variants(dict(v.split("=", 1) for v in os.environ.get("PACK_VARIANTS", "").split(",") if "=" in v))
BATCH = 8
SETTLE = 0.5
START_S = 10.0     # planned start-up of one kind's services: this, plus START_PER_S per process (46 took ~60 s)
START_PER_S = 1.1
PHASE_GAP = 0.8  # per phase: commands out, results back
# --focus (PACK_FOCUS=1): the cells the 2026-11-25 H100 run missed, per kind (Ns, modes): ResNet-50 at N=8
# equal hard (0.77x plain) beside plain and memory-only; the encoder at N=4 memory-only (0.85x) beside plain
FOCUS = {"resnet50": ((8,), ("plain", "memonly", "hard", *(f"hard-{v}" for v in VARIANTS))),
         "encoder": ((4,), ("plain", "memonly"))}


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    grant: str = ""
    pid: int = 0
    slice_file: Path | None = None

    def send(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def recv(self, deadline: float) -> dict:
        """The next JSON line, or an error when the process ended or the deadline passed."""
        import select

        assert self.proc.stdout is not None
        while True:
            left = deadline - time.time()
            if left <= 0:
                return {"error": f"{self.name}: no answer in time"}
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    return {"error": f"{self.name}: ended (exit {self.proc.poll()})"}
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue  # a library printed to stdout: not ours


@dataclass
class Kind:
    name: str
    sets: dict[str, list[Worker]] = field(default_factory=dict)  # "plain", "memonly", ..., "mps4"
    skipped: dict[str, str] = field(default_factory=dict)


def cells(kind: str, ns: list[int], mps: bool, focus: bool, only: tuple[str, ...] = ()) -> tuple[list[int], list[str]]:
    """The Ns and modes one kind runs: all of them, or its FOCUS cells; ``only`` (PACK_MODES) keeps those modes
    (plain always: every ratio is to it)."""
    if focus:
        # a dry run's kinds (no GPU) take ResNet-50's cells
        fn, fm = FOCUS.get(kind) or (FOCUS["resnet50"] if kind in ("fake", "double") else ((), ()))
        ns, modes = list(fn), list(fm)
    else:
        modes = list(MODES)
    return ns, [m for m in modes if (mps or m != "mps") and (not only or m == "plain" or m in only)]


def plan(kinds: list[str], ns: list[int], reps: int, mps: bool,
         modes: list[str] | None = None) -> list[tuple[str, int, int]]:
    """(mode, n, rep) in ABBA order; ("alone", 1, r) first and last."""
    modes = modes if modes is not None else [m for m in MODES if mps or m != "mps"]
    phases: list[tuple[str, int, int]] = [("alone", 1, 0)]
    for r in range(reps):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            for n in (ns if r % 2 == 0 else ns[::-1]):
                phases.append((m, n, r))
    phases.append(("alone", 1, 1))
    return phases


def planned_seconds(kinds: list[str], ns: list[int], reps: int, seconds: float, mps: bool,
                    focus: bool = False, only: tuple[str, ...] = ()) -> float:
    total = 0.0
    for kind in kinds:
        kn, km = cells(kind, ns, mps, focus, only)
        procs = sum(max(kn) if m != "mps" else sum(kn) for m in km) if kn else 0
        total += START_S + START_PER_S * procs + len(plan([kind], kn, reps, mps, km)) * (seconds + PHASE_GAP) + 10
    return total


def start(kind: str, name: str, env: dict[str, str], log: Path) -> Worker:
    err = open(log / f"{kind}-{name}.err", "ab")
    p = subprocess.Popen(WORKER + ["--kind", kind, "--batch", str(BATCH)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=err, env=env, text=True, bufsize=1)
    return Worker(name, p)


def _ready(k: Kind, names: list[str], deadline: float) -> None:
    """Wait for the sets' ready lines; a set with a process that fails is dropped (and said why)."""
    for name in names:
        for w in k.sets[name]:
            msg = w.recv(deadline)
            if "ready" in msg:
                w.pid = int(msg["ready"])
            else:
                k.skipped.setdefault(name, msg.get("error", str(msg)))
    for name in names:
        if name in k.skipped:
            for w in k.sets.pop(name, []):
                w.proc.kill()


def start_kind(k: Kind, ns: list[int], tmp: Path, log: Path, mps_env: dict[str, str] | None,
               modes: tuple[str, ...] = MODES) -> None:
    """Every service process of one kind, into k.sets as they start (so an interrupted start stops them
    too); returns when all are ready (or dropped). The MPS clients start after the others have their
    contexts, so a plain context never waits on the MPS server's start."""
    kind, nmax = k.name, max(ns)
    base = {x: v for x, v in os.environ.items() if x not in ("LD_PRELOAD", "GPUSLICE_SLICE")}
    base["PYTHONUNBUFFERED"] = "1"
    k.sets["plain"] = [start(kind, f"plain{i}", base, log) for i in range(nmax)]
    for mode, (slice_mode, paced) in GPUSLICE.items():
        if mode not in modes:
            continue
        ws = k.sets[mode] = []
        for i in range(nmax):
            grant = f"pk-{kind}-{mode}{i}"
            sf = tmp / f"{grant}.slice"
            write_slice_file(sf, grant=grant, compute=100 // nmax if paced else 0, mode=slice_mode, priority=1,
                             memory_limit=4 * 2**30, device_state_dir=str(tmp / "state"), log_level="warn",
                             region=str(tmp / f"{grant}.region"))  # as the agent's slices: the credit lives there
            lib = VARIANTS.get(mode.partition("-")[2], str(LIB))
            w = start(kind, f"{mode}{i}", {**base, "LD_PRELOAD": lib, "GPUSLICE_SLICE": str(sf)}, log)
            w.grant, w.slice_file = grant, sf
            ws.append(w)
    _ready(k, list(k.sets), time.time() + 240)
    if "mps" not in modes:
        return
    if mps_env is None:
        k.skipped["mps"] = "no MPS daemon (PACK_MPS_PIPE unset or the daemon did not start)"
        return
    for n in ns:
        env = {**base, **mps_env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // n)}
        ws = k.sets[f"mps{n}"] = []
        for i in range(n):
            ws.append(start(kind, f"mps{n}-{i}", env, log))
    _ready(k, [f"mps{n}" for n in ns], time.time() + 120)


def stop_kind(k: Kind) -> None:
    for ws in k.sets.values():
        for w in ws:
            if w.proc.poll() is None:
                try:
                    w.send({"quit": 1})
                except OSError:
                    pass
    for ws in k.sets.values():
        for w in ws:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()


def slices_now(state: Path) -> dict[str, devstate.SliceCompute]:
    try:
        return {s.grant: s for d in devstate.read_all(state) for s in d.slices}
    except devstate.DeviceStateError:
        return {}


def run_phase(k: Kind, mode: str, n: int, seconds: float, state: Path) -> dict:
    """n services of `mode` together; per service: requests/s, latency, pacer view."""
    ws = k.sets["plain"][:1] if mode == "alone" else (k.sets[f"mps{n}"] if mode == "mps" else k.sets[mode][:n])
    share = 100 // n if mode in PACED else None
    if share is not None:
        for w in ws:  # a live share goes through the device's roster, as a resize does (issue 15)
            policy.set_share(state, read_slice_file(w.slice_file), share)
    before, tb = slices_now(state), time.time()
    t0 = time.time() + 0.3
    tm, t1 = t0 + SETTLE, t0 + seconds
    for w in ws:
        w.send({"run": [t0, tm, t1]})
    outs = [w.recv(t1 + 60) for w in ws]
    after, ta = slices_now(state), time.time()
    services = []
    for w, o in zip(ws, outs):
        rec = {"name": w.name, "pid": w.pid, **o}
        if "iters" in o:
            rec["rate"] = o["iters"] / (t1 - tm)
        if w.grant and w.grant in after:
            a, b = after[w.grant], before.get(w.grant)
            db = a.busy_total_s - (b.busy_total_s if b else 0.0)
            dt = a.throttled_total_s - (b.throttled_total_s if b else 0.0)
            rec["pacer_share"] = 100 * db / (ta - tb)
            rec["throttled_s"] = dt
            rec["paths"] = sorted({p.path for p in a.processes})
            loads = [p.offered_load for p in a.processes if p.offered_load is not None]
            rec["offered_load"] = loads[0] if loads else None
        services.append(rec)
    return {"mode": mode, "n": n, "share": share, "t": [t0, tm, t1], "services": services}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_kind(kind: str, args: argparse.Namespace, tmp: Path, log: Path, mps_env: dict[str, str] | None,
             into: list[dict]) -> None:
    """Every phase of one kind; its record is in `into` from the start, so a cut run keeps what it measured."""
    k = Kind(kind)
    result: dict = {"kind": kind, "skipped": k.skipped, "phases": []}
    into.append(result)
    t_start = time.time()
    ns, modes = cells(kind, args.ns, mps_env is not None, args.focus, args.modes)
    if not ns:
        k.skipped["all"] = "no focus cells for this kind"
        return
    try:
        start_kind(k, ns, tmp, log, mps_env, tuple(modes))
        print(f"[{time.strftime('%H:%M:%S')}] {kind}: {sum(len(w) for w in k.sets.values())} services ready in "
              f"{time.time() - t_start:.0f} s" + (f"; skipped {k.skipped}" if k.skipped else ""), flush=True)
        if "plain" not in k.sets:
            return
        cal = k.sets["plain"][0]
        cal.send({"calibrate": 200})
        result["calibration"] = cal.recv(time.time() + 120)
        for mode, n, rep in plan([kind], ns, args.reps, "mps" not in k.skipped,
                                 [m for m in modes if m != "mps" or "mps" not in k.skipped]):
            if mode != "alone" and (mode if mode != "mps" else f"mps{n}") not in k.sets:
                continue
            ph = run_phase(k, mode, n, args.seconds, tmp / "state")
            ph["rep"] = rep
            result["phases"].append(ph)
            agg = sum(s.get("rate", 0) for s in ph["services"]) * BATCH
            print(f"[{time.strftime('%H:%M:%S')}] {kind} {mode:8} N={n} rep {rep}: {agg:8.1f} samples/s", flush=True)
    finally:
        stop_kind(k)


# ------------------------------------------------------------------------------------------- report
def nvml_share(nvml: list[dict], pid: int, a: float, b: float) -> float | None:
    v = [r["sm"] for r in nvml if r.get("pid") == pid and a <= r["ts"] < b]
    return statistics.fmean(v) if v else None


def summarize(raw: dict) -> tuple[list[str], list[str], list[dict]]:
    """(table lines, goal lines, rows) from the raw results."""
    nvml = raw.get("nvml", [])
    lines = ["| kind | N | alone | plain | MPS | memory-only | hard |" + "".join(f" hard, variant {v} |" for v in VARIANTS)
             + " soft | hard: each service's device time (share) |", "|" + " --- |" * (9 + len(VARIANTS))]
    goals: list[str] = []
    rows: list[dict] = []
    for kr in raw["kinds"]:
        kind, phases = kr["kind"], kr["phases"]
        gpu = (kr.get("calibration") or {}).get("gpu_s_per_iter")

        def agg(mode: str, n: int) -> list[float]:
            return [sum(s.get("rate", 0) for s in p["services"]) * BATCH for p in phases
                    if p["mode"] == mode and p["n"] == n]

        alone = agg("alone", 1)
        alone_m = statistics.fmean(alone) if alone else 0.0
        alone_share = 100 * alone_m / BATCH * gpu if gpu else None
        for n in sorted({p["n"] for p in phases if p["mode"] != "alone"}):
            plain = agg("plain", n)
            pm = statistics.fmean(plain) if plain else 0.0
            cells, row = {}, {"kind": kind, "n": n, "alone": alone_m, "plain": pm}
            for mode in ("mps", "memonly", *PACED):
                v = agg(mode, n)
                if not v or not pm:
                    cells[mode] = "-"
                    continue
                # ABBA pairs: rep r of a mode against rep r of plain (same side of the run's middle)
                ratios = [x / y for x, y in zip(v, plain) if y] or [statistics.fmean(v) / pm]
                row[mode] = statistics.fmean(v) / pm
                row[mode + "_spread"] = (min(ratios), max(ratios))
                cells[mode] = f"{statistics.fmean(v):.0f} ({row[mode]:.2f}x, {min(ratios):.2f}-{max(ratios):.2f})"
            variants = "".join(f" {cells.get(f'hard-{v}', '-')} |" for v in VARIANTS)
            shares = [(100 * s["rate"] * gpu if gpu and "rate" in s else None, s.get("pacer_share"),
                       nvml_share(nvml, s.get("pid", 0), p["t"][1], p["t"][2]), p["share"])
                      for p in phases if p["mode"] == "hard" and p["n"] == n for s in p["services"]]
            ruler = [x[0] for x in shares if x[0] is not None]
            row["hard_shares"] = ruler
            row["hard_pacer"] = [x[1] for x in shares if x[1] is not None]
            row["hard_nvml"] = [x[2] for x in shares if x[2] is not None]
            share = 100 // n
            dev = f"{min(ruler):.1f}..{max(ruler):.1f} % ({share} %)" if ruler else "-"
            if row["hard_pacer"]:
                dev += f"; pacer {min(row['hard_pacer']):.1f}..{max(row['hard_pacer']):.1f}"
            lines.append(f"| {kind} | {n} | {alone_m:.0f} | {pm:.0f} | {cells['mps']} | {cells['memonly']} | "
                         f"{cells['hard']} |{variants} {cells['soft']} | {dev} |")
            rows.append(row)
            goals += judge(kind, n, row, share, alone_share)
            for v, lib in VARIANTS.items():
                if row.get(f"hard-{v}") is not None:
                    goals.append(f"- {kind} N={n} equal hard, variant {v} ({lib}): {row[f'hard-{v}']:.3f}x plain "
                                 f"(shipped build: {row['hard']:.3f}x)" if row.get("hard") is not None else
                                 f"- {kind} N={n} equal hard, variant {v}: {row[f'hard-{v}']:.3f}x plain")
    return lines, goals, rows


def judge(kind: str, n: int, row: dict, share: int, alone_share: float | None) -> list[str]:
    out = []
    mem, hard = row.get("memonly"), row.get("hard")
    if mem is not None:
        out.append(f"- {kind} N={n} memory-only {mem:.3f}x plain (goal >= 0.97): "
                   + ("met" if mem >= 0.97 else f"MISSED by {0.97 - mem:.3f}"))
    if hard is not None:
        out.append(f"- {kind} N={n} equal hard {hard:.3f}x plain (goal >= 0.9): "
                   + ("met" if hard >= 0.9 else f"MISSED by {0.9 - hard:.3f}"))
    ruler = row.get("hard_shares") or []
    if ruler:
        want = min(share, alone_share) if alone_share else share
        over = max(ruler) - (share + 2)
        under = (want - 2) - min(ruler)
        verdict = "met" if over <= 0 and under <= 0 else (
            f"MISSED: {max(over, under):.1f} points {'over' if over > under else 'under'}")
        out.append(f"- {kind} N={n} hard shares {min(ruler):.1f}..{max(ruler):.1f} % of the device for {share} % "
                   f"each (goal: at most {share + 2}, at least {want - 2:.1f} = min(share, alone "
                   f"{alone_share or 0:.1f}) - 2): {verdict}")
    return out


def diagnostics(raw: dict) -> list[str]:
    """Per kind, mode and N: latency, device time by the ruler, by the pacer and by NVML, throttled time,
    and the pacer's paths and offered loads (README-compute.md, "Paths")."""
    nvml = raw.get("nvml", [])
    lines = ["| kind | mode | N | p50 / p99 ms | launch ms | device time % (ruler) | (eager ruler) | pacer % | "
             "NVML SM % | throttled % | paths | offered load |", "|" + " --- |" * 12]
    mean = (lambda v: statistics.fmean(v) if v else None)
    fmt = (lambda x, f="{:.1f}": f.format(x) if x is not None else "-")
    for kr in raw["kinds"]:
        gpu = (kr.get("calibration") or {}).get("gpu_s_per_iter")
        eager = (kr.get("calibration") or {}).get("eager_s_per_iter")
        keys = sorted({(p["mode"], p["n"]) for p in kr["phases"]}, key=lambda x: (MODES.index(x[0]) if x[0] in MODES
                                                                                  else -1, x[1]))
        for mode, n in keys:
            ss = [(p, s) for p in kr["phases"] if (p["mode"], p["n"]) == (mode, n) for s in p["services"]]
            p50 = mean([s["p50_s"] * 1e3 for _, s in ss if s.get("p50_s")])
            p99 = mean([s["p99_s"] * 1e3 for _, s in ss if s.get("p99_s")])
            ruler = mean([100 * s["rate"] * gpu for _, s in ss if gpu and "rate" in s])
            eruler = mean([100 * s["rate"] * eager for _, s in ss if eager and "rate" in s])
            launch = mean([s["launch_p50_s"] * 1e3 for _, s in ss if s.get("launch_p50_s")])
            pacer = mean([s["pacer_share"] for _, s in ss if "pacer_share" in s])
            sm = mean([x for x in (nvml_share(nvml, s.get("pid", 0), p["t"][1], p["t"][2]) for p, s in ss) if x is not None])
            thr = mean([100 * s["throttled_s"] / (p["t"][2] - p["t"][0]) for p, s in ss if "throttled_s" in s])
            paths = ",".join(sorted({x for _, s in ss for x in s.get("paths", [])})) or "-"
            load = mean([s["offered_load"] for _, s in ss if s.get("offered_load") is not None])
            lines.append(f"| {kr['kind']} | {mode} | {n} | {fmt(p50, '{:.2f}')} / {fmt(p99, '{:.2f}')} | "
                         f"{fmt(launch, '{:.2f}')} | {fmt(ruler)} | {fmt(eruler)} | {fmt(pacer)} | {fmt(sm)} | {fmt(thr)} | "
                         f"{paths} | {fmt(load, '{:.2f}')} |")
    return lines


def charge_split(raw: dict) -> list[str]:
    """Where each paced service's charge came from (the enforcer's counters over the measured span, summed
    over services and repeats, per request): what its launches were charged when made, and what the
    harvest turned the measured ones into: clean pairs (nothing else ran: charged as measured, less the
    launch gap) and dirty ones (charged the shape's learned cost; the raw pair holds neighbours' time too).
    Against the eager ruler this tells a per-kernel bias of the cost model (dirty learned > clean measured,
    at every N) from a real cost of sharing (clean pairs themselves dearer as N grows)."""
    lines = ["| kind | mode | N | charged ms/req | eager ms/req | launches/req | pairs/req (clean, dirty) | "
             "clean us/pair: at launch -> measured | dirty us/pair: at launch -> learned (raw) | gap us/pair |",
             "|" + " --- |" * 10]
    fmt = (lambda x, f="{:.2f}": f.format(x) if x is not None else "-")
    for kr in raw["kinds"]:
        eager = (kr.get("calibration") or {}).get("eager_s_per_iter")
        for mode, n in sorted({(p["mode"], p["n"]) for p in kr["phases"] if p["mode"] in PACED},
                              key=lambda x: (MODES.index(x[0]), x[1])):
            cs = [s["pacer"] for p in kr["phases"] if (p["mode"], p["n"]) == (mode, n) for s in p["services"]
                  if s.get("pacer") and s.get("iters")]
            reqs = sum(s["iters"] for p in kr["phases"] if (p["mode"], p["n"]) == (mode, n) for s in p["services"]
                       if s.get("pacer") and s.get("iters"))
            if not cs or not reqs:
                continue
            tot = {k: sum(c.get(k, 0) for c in cs) for k in cs[0] if k not in ("path", "cost_avg_ns")}
            charged = (tot["launch_charged_ns"] + tot["clean_cost_ns"] - tot["clean_launch_ns"]
                       + tot["dirty_cost_ns"] - tot["dirty_launch_ns"])
            per = (lambda k, d: tot[k] / d / 1e3 if d else None)
            lines.append(
                f"| {kr['kind']} | {mode} | {n} | {fmt(charged / reqs / 1e6)} | {fmt(eager * 1e3 if eager else None)} | "
                f"{tot['launches'] / reqs:.0f} | {tot['clean'] / reqs:.1f}, {tot['dirty'] / reqs:.1f} | "
                f"{fmt(per('clean_launch_ns', tot['clean']), '{:.1f}')} -> {fmt(per('clean_cost_ns', tot['clean']), '{:.1f}')} | "
                f"{fmt(per('dirty_launch_ns', tot['dirty']), '{:.1f}')} -> {fmt(per('dirty_cost_ns', tot['dirty']), '{:.1f}')} "
                f"({fmt(per('dirty_raw_ns', tot['dirty']), '{:.1f}')}) | {fmt(per('gap_ns', tot['gap_pairs']), '{:.1f}')} |")
    return lines if len(lines) > 2 else []


def report(raw: dict) -> str:
    lines, goals, _ = summarize(raw)
    def ruler(k: dict) -> str:
        c = k.get("calibration") or {}
        text = f"{k['kind']}: {1e3 * c.get('gpu_s_per_iter', 0):.2f} ms GPU per request ({c.get('how', '-')})"
        if c.get("eager_s_per_iter"):
            text += f", eager {1e3 * c['eager_s_per_iter']:.2f} ms ({c.get('eager_how', '-')})"
        return text

    cal = "; ".join(ruler(k) for k in raw["kinds"])
    split = charge_split(raw)
    if split:
        split = ["", "Where the paced services' charge came from (the enforcer's counters, gpuslice_pacer_stats, "
                 "summed over services and repeats; per request, and per measured pair):", ""] + split
    skipped = "; ".join(f"{k['kind']}: {m} ({why})" for k in raw["kinds"] for m, why in k.get("skipped", {}).items())
    head = [f"Aggregate samples/s (batch {BATCH}) per N and mode: the mean of {raw['reps']} ABBA repeats of "
            f"{raw['seconds']:.1f}-s phases ({SETTLE} s of each not counted); in brackets the ratio to plain time-slicing and its range over "
            "the repeats (each repeat against the plain run on the same side of the order).",
            f"Ruler (GPU time of one request, CUDA graph replayed alone): {cal}.",
            "Device time of a service = its requests/s x the ruler; 'pacer' = the time gpuslice charged it; the eager "
            "ruler holds what eager launches cost the GPU beyond the graph (no CPU gaps): what the pacer should "
            "charge. 'launch ms' = the CPU time a request's launches took (median): the light path's cost shows there."]
    if skipped:
        head.append(f"Skipped: {skipped}.")
    if raw.get("interrupted"):
        head.append(f"**Incomplete**: {raw['interrupted']}.")
    return "\n".join(head + [""] + lines + ["", "Goals (issue 12):"] + goals + ["", "Per mode (means over services and "
                      "repeats), to tell causes apart:", ""] + diagnostics(raw) + split) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/gpuslice-out"), "packing"))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("PACK_SECONDS", 3.5)))
    ap.add_argument("--reps", type=int, default=int(os.environ.get("PACK_REPS", 2)))
    ap.add_argument("--kinds", default=os.environ.get("PACK_KINDS", "resnet50,encoder"))
    ap.add_argument("--ns", default=os.environ.get("PACK_NS", "2,4,8"))
    ap.add_argument("--focus", action="store_true", default=os.environ.get("PACK_FOCUS", "0") == "1",
                    help="only the FOCUS cells (PACK_FOCUS=1)")
    ap.add_argument("--modes", default=os.environ.get("PACK_MODES", ""),
                    help="comma list: only these modes (and plain), e.g. memonly,hard (PACK_MODES)")
    ap.add_argument("--plan", action="store_true", help="print the phases and the planned time only")
    ap.add_argument("--report", metavar="DIR", help="print the tables from DIR/packing-raw.json")
    a = ap.parse_args()
    if a.report:
        raw = json.loads((Path(a.report) / "packing-raw.json").read_text())
        use_variants(raw.get("variants", {}))
        print(report(raw), end="")
        return
    a.kinds = [k for k in a.kinds.split(",") if k]
    a.modes = tuple(m for m in a.modes.split(",") if m)
    if any(m not in MODES for m in a.modes):
        sys.exit(f"packing: --modes {','.join(a.modes)}: each one of {', '.join(MODES)}")
    a.ns = sorted({int(x) for x in a.ns.split(",") if x})
    if a.seconds <= SETTLE or a.reps < 1 or not a.ns or min(a.ns) < 2 or max(a.ns) > 8:
        sys.exit("packing: --seconds above 0.5, --reps at least 1, --ns from 2 to 8 (a device state holds 32 slices)")
    mps_pipe = os.environ.get("PACK_MPS_PIPE")
    mps_env = ({"CUDA_MPS_PIPE_DIRECTORY": mps_pipe, "CUDA_MPS_LOG_DIRECTORY": os.environ.get("PACK_MPS_LOG", mps_pipe)}
               if mps_pipe else None)
    if a.focus:
        a.kinds = [k for k in a.kinds if k in FOCUS or k in ("fake", "double")]
    kp = {}
    for k in a.kinds:
        kn, km = cells(k, a.ns, mps_env is not None, a.focus, a.modes)
        kp[k] = plan([k], kn, a.reps, mps_env is not None, km)
    total = planned_seconds(a.kinds, a.ns, a.reps, a.seconds, mps_env is not None, a.focus, a.modes)
    print(f"packing{' (focus)' if a.focus else ''}: " + "; ".join(
        f"{k} {len(p)} phases ({', '.join(f'{m}/{n}' for m, n, _ in p[:8])}, ...)" for k, p in kp.items())
        + f" of {a.seconds:.1f} s: planned {total:.0f} s", flush=True)
    if a.plan:
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "logs"
    log.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gs-packing."))
    nvml_file, sampler = tmp / "nvml.jsonl", None
    if os.environ.get("PACK_NVML", "1") == "1":
        sampler = subprocess.Popen([sys.executable, str(ROOT / "bench" / "compute" / "nvml_sampler.py"), "--out",
                                    str(nvml_file)], stderr=open(log / "nvml.err", "ab"))
    raw: dict = {"seconds": a.seconds, "reps": a.reps, "ns": a.ns, "batch": BATCH, "kinds": [], "started": time.time(),
                 "focus": a.focus, "variants": VARIANTS}
    # packing.sh cuts a run that outgrows its budget with SIGTERM: stop the services (run_kind's
    # finally) and write what was measured, saying so
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for kind in a.kinds:
            run_kind(kind, a, tmp, log, mps_env, raw["kinds"])
    except KeyboardInterrupt as exc:
        raw["interrupted"] = f"stopped by {exc or 'SIGINT'} after {time.time() - raw['started']:.0f} s: later phases missing"
        print(f"packing: {raw['interrupted']}", flush=True)
    finally:
        if sampler is not None:
            sampler.terminate()
            sampler.wait(10)
        raw["nvml"] = [json.loads(x) for x in nvml_file.read_text().splitlines() if x.strip()] \
            if nvml_file.exists() else []
        raw["finished"] = time.time()
        (out / "packing-raw.json").write_text(json.dumps(raw))
    text = report(raw)
    (out / "packing.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
