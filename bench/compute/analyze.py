"""Tables of the compute benchmark from the workloads' JSON files (see run_compute_bench.sh).

Achieved share = the workload's throughput in a 1-s window / its exclusive throughput x 100. The
first second of every phase is left out (the controller settling, and the live share change).
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
    return json.loads(p.read_text()) if p.exists() else None


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


def phase_rate(run: dict, i: int = 0, settle: float = 1.0) -> float:
    ph = run["phases"][i]
    return rate(run, ph["t0"] + settle, ph["t1"])


def windows(run: dict, ph: dict, excl: float, settle: float = 1.0) -> list[float]:
    out, t = [], ph["t0"] + settle
    while t + 1.0 <= ph["t1"] + 1e-3:
        out.append(100.0 * rate(run, t, t + 1.0) / excl)
        t += 1.0
    return out


def enforcer_mean(run: dict, ph: dict, settle: float = 1.0) -> float | None:
    v = [a for t, a, _s in run.get("enforcer_view", []) if a is not None and ph["t0"] + settle <= t <= ph["t1"]]
    return statistics.fmean(v) if v else None


def main() -> None:
    d = Path(sys.argv[1])
    lines: list[str] = []
    out = lines.append
    env = (d / "env.txt").read_text().strip().splitlines() if (d / "env.txt").exists() else []
    out(f"== gpuslice compute benchmark: {' | '.join(env)}")
    excl = {k: load(d, f"excl_{k}") for k in ("matmul", "resnet")}
    xr = {k: phase_rate(v, 0, 0.5) for k, v in excl.items() if v}
    unit = {"matmul": "matmul/s", "resnet": "step/s"}
    for k, r in xr.items():
        out(f"exclusive {k}: {r:.1f} {unit[k]}")

    out("\n-- accuracy: set share -> achieved (throughput vs exclusive, 1-s windows; goal +-2 points)")
    out(f"{'workload':8} {'set':>4} {'mean':>7} {'p5':>7} {'p95':>7} {'err':>6} {'n':>2}  {'enforcer says':>13}")
    for k in ("matmul", "resnet"):
        run = load(d, f"acc_{k}")
        if not run or k not in xr:
            out(f"{k:8} missing")
            continue
        for ph in run["phases"]:
            w = windows(run, ph, xr[k])
            if not w:
                continue
            m = statistics.fmean(w)
            e = enforcer_mean(run, ph)
            out(f"{k:8} {ph['share']:>4} {m:7.2f} {percentile(w, 5):7.2f} {percentile(w, 95):7.2f} "
                f"{m - float(ph['share']):+6.2f} {len(w):2d}  {'' if e is None else f'{e:13.2f}'}")

    out("\n-- overhead at share 100 % (enforcer preloaded vs not; goal <= 0.5 %)")
    for k in ("matmul", "resnet"):
        p = load(d, f"p100_{k}")
        if p and k in xr:
            r = phase_rate(p, 0, 0.5)
            out(f"{k:8} exclusive {xr[k]:9.2f}  enforcer@100 {r:9.2f} {unit[k]}  overhead {100 * (1 - r / xr[k]):+.2f} %")

    out("\n-- two slices on one GPU, matmul loops (share of exclusive throughput; aggregate goal >= 95 %)")
    out(f"{'method':28} {'A':>7} {'B':>7} {'sum':>7}")
    a, b = load(d, "split_a"), load(d, "split_b")
    if a and b and "matmul" in xr:
        for i, label in ((0, "gpuslice hard 50/50"), (1, "gpuslice hard 30/70")):
            ra, rb = (100 * phase_rate(r, i) / xr["matmul"] for r in (a, b))
            out(f"{label:28} {ra:7.2f} {rb:7.2f} {ra + rb:7.2f}")
    a, b = load(d, "ts_a"), load(d, "ts_b")
    if a and b and "matmul" in xr:
        ra, rb = (100 * phase_rate(r) / xr["matmul"] for r in (a, b))
        out(f"{'time-slicing (no limits)':28} {ra:7.2f} {rb:7.2f} {ra + rb:7.2f}")
    for pct in ("50", "30"):
        a, b = load(d, f"mps{pct}_a"), load(d, f"mps{pct}_b")
        if a and b and "matmul" in xr:
            ra, rb = (100 * phase_rate(r) / xr["matmul"] for r in (a, b))
            label = f"MPS thread % {pct}/{100 - int(pct)}"
            out(f"{label:28} {ra:7.2f} {rb:7.2f} {ra + rb:7.2f}")

    out("\n-- priority: high-priority ResNet-18 inference (batch 8) latency, alone vs beside a low-priority")
    out("   ResNet-50 trainer (goal: p99 beside <= 1.3x alone)")
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
        tr_share = 100 * rate(t, ts0 + 0.5, ts1) / xr["resnet"] if "resnet" in xr else float("nan")
        out(f"{tag:12} alone p50 {p50a:6.2f} p99 {p99a:6.2f} ms | beside p50 {p50b:6.2f} p99 {p99b:6.2f} ms "
            f"| p99 ratio {p99b / p99a:5.2f} | trainer got {tr_share:5.1f} % of exclusive")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
