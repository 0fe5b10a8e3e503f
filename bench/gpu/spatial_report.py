"""The markdown report of bench/gpu/spatial.sh: one row per (workload, N, configuration) over its repetitions
(mean aggregate throughput and its spread), worst and median per-service p99, the SMs each service saw,
the memory check of gpuslice's runs, the ratios the goals name, the fault experiment, the lifecycle check."""

from __future__ import annotations

import statistics
from collections import defaultdict

GOALS = {4: {"plain": 4003, "mps": 5090, "mps-nolimit": 6131}, 8: {"plain": 4829, "mps": 5890, "mps-nolimit": 6913}}
ALONE = 1650


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def group(raw: list[dict]) -> dict[tuple, list[dict]]:
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for r in raw:
        mix = "+".join(f"{m}:{c}%" for m, _, c in r.get("extra") or ())
        rows[(r["model"], r["n"], mix, r["config"])].append(r)
    return rows


def services(run: dict) -> list[dict]:
    """The results of the run's N services (not the processes beside them)."""
    return [x for x in run["results"] if x.get("model") == run["model"]][:run["n"]]


def aggregate(run: dict) -> float | None:
    got = services(run)
    if run.get("error") or len(got) < run["n"] or any("error" in x for x in got):
        return None
    return sum(x["items_per_s"] for x in got)


def memory_check(runs: list[dict]) -> str:
    """gpuslice runs: the enforcer's books (peak <= limit) and nvidia-smi's per-process MiB (<= limit)."""
    over_books, smi_over, seen, smi_max = 0, 0, 0, 0.0
    for run in runs:
        for s in run.get("memory") or []:
            if "memory_limit" not in s:
                continue
            seen += 1
            over_books = max(over_books, s["memory_peak"] - s["memory_limit"])
            for pid in s["pids"]:
                mib = (run.get("smi") or {}).get(str(pid), (run.get("smi") or {}).get(pid))
                if mib is not None:
                    smi_max = max(smi_max, mib / (s["memory_limit"] / (1 << 20)))
                    smi_over = max(smi_over, mib * (1 << 20) - s["memory_limit"])
    if not seen:
        return "-"
    smi = f"smi max {smi_max:.0%} of limit" if smi_max else "smi: no per-process rows"
    return f"{max(0, over_books)} B over; {smi}{' (OVER)' if smi_over > 0 else ''}"


def table(raw: list[dict]) -> list[str]:
    lines = ["| workload | N | beside | config | aggregate (mean) | spread | runs | worst p99 ms | median p99 ms | "
             "SMs seen | memory (gpuslice) |", "|" + "---|" * 11]
    for (model, n, mix, config), runs in sorted(group(raw).items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        aggs = [a for a in (aggregate(r) for r in runs) if a is not None]
        p99s = [x["p99_ms"] for r in runs for x in services(r) if x.get("p99_ms") is not None]
        sms = sorted({x.get("sm_count") for r in runs for x in services(r) if x.get("sm_count")})
        mean = statistics.mean(aggs) if aggs else None
        spread = f"±{(max(aggs) - min(aggs)) / 2 / mean:.1%}" if len(aggs) > 1 and mean else "-"
        errors = [r.get("error") for r in runs if r.get("error")]
        lines.append(f"| {model} | {n} | {mix or '-'} | {config} | {_fmt(mean)} | {spread} | {len(aggs)}/{len(runs)}"
                     f"{' (' + errors[0][:60] + ')' if errors else ''} | {_fmt(max(p99s) if p99s else None, 1)} | "
                     f"{_fmt(statistics.median(p99s) if p99s else None, 1)} | {','.join(map(str, sms)) or '-'} | "
                     f"{memory_check(runs) if config.startswith('gs-') else '-'} |")
    return lines


def mixes(raw: list[dict]) -> list[str]:
    """Trainer + services: the trainer's own throughput next to the services'."""
    out = []
    for (model, n, mix, config), runs in sorted(group(raw).items()):
        if not mix:
            continue
        for r in runs:
            others = [x for x in r["results"] if x.get("model") != model]
            for x in others:
                out.append(f"- {config}: {x['model']} {_fmt(x.get('items_per_s'))} items/s beside {n} {model} "
                           f"services ({_fmt(aggregate(r))} items/s together, worst p99 "
                           f"{_fmt(max((y.get('p99_ms') or 0) for y in services(r)), 1)} ms)")
    return out


def ratios(raw: list[dict]) -> list[str]:
    means: dict[tuple[int, str], float] = {}
    for (model, n, mix, config), runs in group(raw).items():
        aggs = [a for a in (aggregate(r) for r in runs) if a is not None]
        if model == "resnet50" and not mix and aggs:
            means[(n, config)] = statistics.mean(aggs)
    out = []
    alone = means.get((1, "plain"))
    if alone:
        out.append(f"- ResNet-50 alone: {alone:,.0f} img/s (the issue measured {ALONE:,})")
    for n in (2, 4, 8):
        sp, mps, plain, ts = (means.get((n, c)) for c in ("gs-spatial", "mps", "plain", "gs-timeslice"))
        parts = []
        if sp and mps:
            parts.append(f"spatial / raw MPS = {sp / mps:.3f} (goal >= 0.95 for N >= 4)")
        if sp and plain:
            parts.append(f"spatial / plain time-slicing = {sp / plain:.2f} (≈ 1.2 expected)")
        if ts and plain:
            parts.append(f"gpuslice time-sliced / plain = {ts / plain:.2f}")
        goal = GOALS.get(n)
        if goal:
            parts.append("issue's numbers: " + ", ".join(f"{k} {v:,}" for k, v in goal.items()))
        if parts:
            out.append(f"- N={n}: " + "; ".join(parts))
    return out


def fault_lines(fault: dict) -> list[str]:
    out = []
    for name, res in fault.items():
        if "error" in res:
            out.append(f"- {name}: the experiment failed: {res['error']}")
            continue
        hit = [x for x in res.get("neighbours", []) if x.get("error")]
        out.append(f"- {name}: {len(hit)} of {len(res.get('neighbours', []))} neighbours got an error "
                   f"({', '.join(_fmt(x['error_after_s'], 2) + ' s' for x in hit) or 'none'} after the fault); "
                   f"gpuslice showed it after {_fmt(res.get('detected_after_s'), 2)} s")
        for x in res.get("neighbours", []):
            out.append(f"  - req/s before {_fmt(x['before_rps'], 1)}, after {_fmt(x['after_rps'], 1)}"
                       f"{'; error: ' + x['error'][:160] if x.get('error') else ''}")
        if "recovered_after_fault_s" in res:
            out.append(f"  - a new spatial service answered {_fmt(res['recovered_after_fault_s'], 2)} s after the "
                       f"fault ({_fmt(res.get('new_service_first_request_s'), 2)} s after it was started); daemon pid "
                       f"{res.get('daemon_pid_before')} -> {res.get('daemon_pid_after')}; faulter: "
                       f"{res.get('faulter_out', '')[:120]}")
        for e in res.get("view_errors", [])[:2]:
            out.append(f"  - node view: {e[:200]}")
    return out
