"""Tables of the compute benchmark from the workloads' JSON and the NVML samples (run_compute_bench.sh).

Achieved share, two independent measures, neither taken from the enforcer:
  NVML   the driver's per-process SM utilization (nvmlDeviceGetProcessUtilization), averaged over
         1-s windows: the share of time a kernel of the process was running. This is what
         `compute=N` promises (N % of the device's time) and what the +-2 goal is judged on.
  thrpt  the workload's throughput in the window / its exclusive throughput. It equals the time
         share only for a workload that keeps the GPU 100 % busy when alone at the same clocks;
         shown because it is what a user sees.
The enforcer's own published estimate is shown for comparison. The first second of every phase is
left out (the controller settling after the live share change).
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
from pathlib import Path

# no numpy: the GPU image is not guaranteed to have it


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    v = sorted(xs)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def load(d: Path, name: str) -> dict | None:
    p = d / f"{name}.json"
    try:
        return json.loads(p.read_text()) if p.exists() else None
    except json.JSONDecodeError:
        return None


class Nvml:
    def __init__(self, path: Path) -> None:
        self.dev: list[dict] = []
        self.proc: dict[int, list[tuple[float, float]]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "pid" in r:
                    self.proc.setdefault(r["pid"], []).append((r["ts"], r["sm"]))
                else:
                    self.dev.append(r)
        for v in self.proc.values():
            v.sort()

    def sm(self, pid: int, a: float, b: float) -> float | None:
        v = [s for t, s in self.proc.get(pid, []) if a <= t < b]
        return statistics.fmean(v) if v else None

    def device(self, key: str, a: float, b: float) -> float | None:
        v = [r[key] for r in self.dev if key in r and a <= r["t"] < b]
        return statistics.fmean(v) if v else None


def units_at(run: dict, t: float) -> float:
    pr = run["progress"]
    ts = run.setdefault("_ts", [p[0] for p in pr])
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return float(pr[0][1])
    if i >= len(pr):
        return float(pr[-1][1])
    (t0, u0), (t1, u1) = pr[i - 1], pr[i]
    return u0 + (u1 - u0) * (t - t0) / (t1 - t0) if t1 > t0 else float(u1)


def rate(run: dict, a: float, b: float) -> float:
    return (units_at(run, b) - units_at(run, a)) / (b - a)


def span(run: dict, i: int = 0, settle: float = 1.0) -> tuple[float, float]:
    ph = run["phases"][i]
    return ph["t0"] + settle, ph["t1"]


def wins(a: float, b: float) -> list[tuple[float, float]]:
    out, t = [], a
    while t + 1.0 <= b + 1e-3:
        out.append((t, t + 1.0))
        t += 1.0
    return out


def enforcer_mean(run: dict, a: float, b: float, col: int = 1) -> float | None:
    v = [r[col] for r in run.get("enforcer_view", []) if len(r) > col and r[col] is not None and a <= r[0] <= b]
    return statistics.fmean(v) if v else None


def fmt(x: float | None, w: int = 6) -> str:
    return f"{x:{w}.1f}" if x is not None else " " * (w - 1) + "-"


def main() -> None:
    d = Path(sys.argv[1])
    nv = Nvml(d / "nvml.jsonl")
    lines: list[str] = []
    out = lines.append
    env = (d / "env.txt").read_text().strip().splitlines() if (d / "env.txt").exists() else []
    out(f"== gpuslice compute benchmark: {' | '.join(env)}")
    out(f"   NVML samples: {sum(len(v) for v in nv.proc.values())} per-process, {len(nv.dev)} device")
    unit = {"matmul": "matmul/s", "resnet": "step/s"}
    xr: dict[str, float] = {}
    for k in ("matmul", "resnet"):
        run = load(d, f"excl_{k}")
        if not run:
            continue
        a, b = span(run, 0, 0.5)
        xr[k] = rate(run, a, b)
        out(f"exclusive {k:6}: {xr[k]:8.1f} {unit[k]}, NVML process SM {fmt(nv.sm(run['pid'], a, b))} %, "
            f"device util {fmt(nv.device('util', a, b))} %, SM clock {fmt(nv.device('sm_mhz', a, b), 5)} MHz")

    out("\n-- accuracy: set share -> achieved over 1-s windows (goal +-2 points, judged on NVML time share)")
    out(f"{'workload':8} {'set':>4} | {'NVML':>6} {'p5':>6} {'p95':>6} {'err':>6} | {'thrpt':>6} {'p5':>6} {'p95':>6} "
        f"| {'enforcer':>8} | {'MHz':>5} {'n':>2}")
    for k in ("matmul", "resnet"):
        run = load(d, f"acc_{k}")
        if not run:
            out(f"{k:8} missing")
            continue
        reps: dict[float, list[float]] = {}
        for i, ph in enumerate(run["phases"]):
            a, b = span(run, i)
            ws = wins(a, b)
            n = [x for x in (nv.sm(run["pid"], s, e) for s, e in ws) if x is not None]
            t = [100.0 * rate(run, s, e) / xr[k] for s, e in ws] if k in xr else []
            e = enforcer_mean(run, a, b)
            share = float(ph["share"])
            nm = statistics.fmean(n) if n else None
            out(f"{k:8} {ph['share']:>4} | {fmt(nm)} {fmt(percentile(n, 5) if n else None)} "
                f"{fmt(percentile(n, 95) if n else None)} {(f'{nm - share:+6.1f}' if nm is not None else '     -')} | "
                f"{fmt(statistics.fmean(t) if t else None)} {fmt(percentile(t, 5) if t else None)} "
                f"{fmt(percentile(t, 95) if t else None)} | {fmt(e, 8)} | {fmt(nv.device('sm_mhz', a, b), 5)} {len(ws):2d}")
            if nm is not None:
                reps.setdefault(share, []).append(nm)
        for share, v in reps.items():  # a schedule that repeats a share (ABBA, GS_COMPUTE_FOCUS=1)
            if len(v) > 1:
                out(f"{k:8} {share:4.0f}: NVML mean of {len(v)} repeats {statistics.fmean(v):6.1f} "
                    f"({statistics.fmean(v) - share:+.1f}), range {min(v):.1f}..{max(v):.1f}")

    out("\n-- overhead at share 100 % (enforcer preloaded vs not; goal <= 0.5 %)")
    for k in ("matmul", "resnet"):
        p = load(d, f"p100_{k}")
        if p and k in xr:
            r = rate(p, *span(p, 0, 0.5))
            out(f"{k:8} exclusive {xr[k]:9.2f}  enforcer@100 {r:9.2f} {unit[k]}  overhead {100 * (1 - r / xr[k]):+.2f} %")

    out("\n-- two slices on one GPU, matmul loops: throughput share of exclusive [enforcer says]")
    out("   (NVML per-process utilization is not usable here: with two time-sliced contexts each reads")
    out("   ~99 %; the device runs at the power-capped clock of the exclusive run, so throughput share")
    out("   is close to time share; aggregate goal >= 95 %)")
    out(f"{'method':26} {'A':>14} {'B':>14} {'sum':>7}")

    def pair(label: str, ra: dict, rb: dict, i: int) -> None:
        cells, st = [], 0.0
        for r in (ra, rb):
            a, b = span(r, i)
            t = 100 * rate(r, a, b) / xr["matmul"] if "matmul" in xr else None
            e = enforcer_mean(r, a, b)
            st += t or 0
            cells.append(f"{fmt(t, 5)} [{fmt(e, 4)}]")
        out(f"{label:26} {cells[0]:>14} {cells[1]:>14} {st:7.1f}")

    a, b = load(d, "split_a"), load(d, "split_b")
    if a and b:
        pair("gpuslice hard 50/50", a, b, 0)
        pair("gpuslice hard 30/70", a, b, 1)
    a, b = load(d, "ts_a"), load(d, "ts_b")
    if a and b:
        pair("time-slicing (no limits)", a, b, 0)
    for pct in ("50", "30"):
        a, b = load(d, f"mps{pct}_a"), load(d, f"mps{pct}_b")
        if a and b:
            pair(f"MPS thread % {pct}/{100 - int(pct)}", a, b, 0)

    out("\n-- priority: high-priority ResNet-18 inference (batch 8, 2 ms think) latency, alone vs beside a")
    out("   low-priority ResNet-50 trainer (goal: p99 beside <= 1.3x alone)")
    for tag, inf, tr in (("gpuslice", "prio_infer", "prio_train"), ("no enforcer", "noprio_infer", "noprio_train")):
        i, t = load(d, inf), load(d, tr)
        if not i or not t:
            continue
        ts0, ts1 = t["phases"][0]["t0"], t["phases"][0]["t1"]
        lat = i["latency"]
        alone = [x * 1e3 for t0, x in lat if i["phases"][0]["t0"] + 0.5 <= t0 < ts0]
        beside = [x * 1e3 for t0, x in lat if ts0 + 0.5 <= t0 < ts1]
        if len(alone) < 10 or len(beside) < 10:
            out(f"{tag}: too few requests ({len(alone)}, {len(beside)})")
            continue
        p50a, p99a, p50b, p99b = (percentile(alone, 50), percentile(alone, 99), percentile(beside, 50),
                                  percentile(beside, 99))
        tr_share = 100 * rate(t, ts0 + 0.5, ts1) / xr["resnet"] if "resnet" in xr else None
        out(f"{tag:12} alone p50 {p50a:6.2f} p99 {p99a:6.2f} ms | beside p50 {p50b:6.2f} p99 {p99b:6.2f} ms "
            f"| p99 ratio {p99b / p99a:5.2f} | trainer {fmt(tr_share, 5)} % of exclusive thrpt")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
