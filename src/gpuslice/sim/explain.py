"""What a replay means, in words: the table's columns with a plain glossary, and the takeaway.

The same column list drives the terminal table (fitted to its width: ``keep`` says what stays, 0 always),
the HTML table and the glossary, so a column and its explanation cannot drift apart. The takeaway
is computed from the rows of the run — which policy won, by how much, against what — and says plainly
when a run shows nothing (a timeline in which no task had to wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from rich.table import Table

from gpuslice.host.console import Column, fit_table, short_names

POLICY_WORDS = {
    "fgd": "fgd (fragmentation-aware: puts each task where it spoils the least of the free GPU space for the "
           "task sizes seen so far)",
    "bestfit": "bestfit (the GPU with the least room that still fits)",
    "binpack": "binpack (the fullest node and GPU first)",
    "spread": "spread (the emptiest node and GPU first)",
    "random": "random (any GPU that fits)",
}


@dataclass(frozen=True)
class Col:
    """A column of the replay table: value key, header (``\\n`` splits it in the terminal), format, what
    stays at a short width (``keep``, 0 = always), and its glossary line."""

    key: str
    label: str
    form: str
    keep: int
    meaning: str

    @property
    def flat(self) -> str:
        return self.label.replace("\n", " ")


INFLATION_COLUMNS = [
    Col("alloc_90", "alloc\n@90%", "{:.2f}", 5, "allocation (%) when demand had reached 90 % of the capacity"),
    Col("alloc_95", "alloc\n@95%", "{:.2f}", 4, "allocation (%) when demand had reached 95 %"),
    Col("alloc_100", "alloc\n@100%", "{:.2f}", 0,
        "share of the cluster's GPU capacity (%) holding tasks at the moment the tasks that had arrived asked "
        "for 100 % of it — a perfect placer would reach 100; higher is better"),
    Col("unalloc_100", "idle %\n@100%", "{:.2f}", 3, "100 − alloc@100%: the capacity (%) left idle at that moment"),
    Col("idle_gpus_100", "idle GPUs\n@100%", "{:.0f}", 1, "that idle capacity in GPUs"),
    Col("alloc_end", "alloc\n@end", "{:.2f}", 7, "allocation (%) after the last task (demand 130 % of capacity)"),
    Col("frag_100", "frag %\n@100%", "{:.2f}", 6,
        "free GPU capacity (%) that the typical task sizes cannot use (the FGD paper's fragmentation measure)"),
    Col("gain_vs_bestfit", "vs bestfit\n(points)", "{:+.2f}", 0,
        "alloc@100% minus best-fit's, over the seeds both ran; positive = more of the GPUs put to work"),
    Col("published_gain", "FGD paper\n(points)", "{:+.2f}", 8,
        "fgd's gain over best-fit as the FGD authors published it for this trace (their simulator, seeds 42–51)"),
    Col("unalloc_change_vs_bestfit", "idle vs\nbestfit", "{:+.1f}%", 2,
        "idle capacity relative to best-fit's: −34 % = a third fewer GPUs left idle"),
    Col("failed", "failed\ntasks", "{:.0f}", 6, "tasks that found no room (they are not retried)"),
    Col("seconds", "s/run", "{:.1f}", 9, "seconds one replay took"),
]
TIMELINE_COLUMNS = [
    Col("tasks", "tasks", "{:.0f}", 6, "tasks replayed (those with arrival and end times)"),
    Col("never_started", "never\nstarted", "{:.0f}", 5, "tasks still waiting when the replay ended"),
    Col("waited", "waited", "{:.0f}", 0, "tasks that could not start at once and queued"),
    Col("delay_mean", "mean\nwait s", "{:.1f}", 3, "mean seconds from arrival to start, over all started tasks"),
    Col("delay_p95", "p95\nwait s", "{:.1f}", 4, "95th percentile of that wait"),
    Col("delay_p99", "p99\nwait s", "{:.1f}", 0, "99th percentile of that wait"),
    Col("util_mean", "mean\nbusy %", "{:.2f}", 2,
        "allocated share of the GPU capacity (%), averaged over the arrival window (quiet stretches included)"),
    Col("util_peak", "peak\nbusy %", "{:.2f}", 0, "the highest allocated share (%) at any moment"),
    Col("queued_peak", "peak\nqueue", "{:.0f}", 1, "most tasks waiting at one moment"),
    Col("frag_mean", "mean\nfrag %", "{:.2f}", 7, "mean fragmented share of the capacity (%)"),
    Col("seconds", "s/run", "{:.1f}", 8, "seconds the replay took"),
]


def columns_of(mode: str, rows: Sequence = ()) -> list[Col]:
    """The columns of ``mode``; the published-gain column only when a row has a published number."""
    cols = INFLATION_COLUMNS if mode == "inflation" else TIMELINE_COLUMNS
    return [c for c in cols if c.key != "published_gain" or any("published_gain" in r.values for r in rows)]


def fmt(row, key: str, form: str) -> str:
    value = row.values.get(key)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    return form.format(value)


def _seeds_text(rows: Sequence) -> str:
    seeds = sorted({r.seeds for r in rows})
    if seeds == [1]:
        return "one seed per policy"
    return f"means over {'/'.join(map(str, seeds))} seeds per policy"


def rich_table(rows: Sequence, mode: str, width: int = 200, wide: bool = False) -> Table:
    """The replay table for the terminal, fitted to ``width``. One trace: its name goes in the title and
    the trace column is left out; several: the column shows them without their shared prefix."""
    rows = [r for r in rows if r.mode == mode]
    traces = list(dict.fromkeys(r.trace for r in rows))
    what = ("GPU capacity allocated (%) as demand arrives" if mode == "inflation"
            else "queueing and GPU use in arrival order")
    title = f"{traces[0]}: {what}" if len(traces) == 1 else what
    columns = [] if len(traces) == 1 else [Column("trace", [r.trace for r in rows],
                                                  short=short_names([r.trace for r in rows]))]
    columns.append(Column("policy", [r.policy for r in rows]))
    columns += [Column(c.label, [fmt(r, c.key, c.form) for r in rows], keep=c.keep, justify="right")
                for c in columns_of(mode, rows)]
    method = "workload inflation" if mode == "inflation" else "time-ordered replay"
    return fit_table(columns, width, wide=wide, title=title, caption=f"{method}, {_seeds_text(rows)}")


def glossary(mode: str, rows: Sequence = ()) -> list[tuple[str, str]]:
    """(column, meaning) for every column of ``mode``."""
    return [(c.flat, c.meaning) for c in columns_of(mode, rows)]


def glossary_grid(mode: str, rows: Sequence, shown: Table | None = None) -> Table:
    """The glossary as two aligned columns (meanings wrap under themselves); only the columns ``shown``
    has, when given."""
    names = None if shown is None else {str(c.header).replace("\n", " ") for c in shown.columns}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for name, meaning in glossary(mode, rows):
        if names is None or name in names:
            grid.add_row(name, meaning)
    return grid


# ------------------------------------------------------------------------------------------ takeaway
def _by_trace(rows: Sequence, mode: str) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for r in rows:
        if r.mode == mode:
            out.setdefault(r.trace, {})[r.policy] = r
    return out


def _inflation_takeaway(trace: str, by_policy: dict) -> str:
    ranked = sorted(by_policy.values(), key=lambda r: -r.values["alloc_100"])
    best = ranked[0]
    capacity = best.values.get("capacity", 0.0)
    base = by_policy.get("bestfit") if best.policy != "bestfit" else None
    base = base or (ranked[1] if len(ranked) > 1 else None)
    head = (f"{trace}: {len(ranked)} placement policies replayed on {capacity:,.0f} GPUs, the trace's tasks drawn "
            f"until they asked for 130 % of the cluster ({_seeds_text(ranked)}). ")
    if base is None:
        return head + (f"{best.policy} put {best.values['alloc_100']:.1f} % of the GPU capacity to work when demand "
                       f"reached 100 %.")
    idle_best, idle_base = best.values["unalloc_100"], base.values["unalloc_100"]
    if idle_base - idle_best < 0.005:  # equal to the table's precision: no winner to name
        return head + (f"No winner: {best.policy} and {base.policy} both had {best.values['alloc_100']:.1f} % of the "
                       f"GPU capacity working when demand reached the cluster's capacity.")
    less = (1 - idle_best / idle_base) * 100
    return head + (
        f"Winner: {best.policy} — when demand reached the cluster's capacity it had {best.values['alloc_100']:.1f} % "
        f"of the GPU capacity working, {base.policy} {base.values['alloc_100']:.1f} %: {best.policy} leaves "
        f"{less:.0f} % less of the GPU capacity idle than {base.policy} "
        f"({best.values['idle_gpus_100']:,.0f} instead of {base.values['idle_gpus_100']:,.0f} GPUs' worth).")


def _timeline_takeaway(trace: str, by_policy: dict) -> str:
    rows = list(by_policy.values())
    peak = max(r.values["util_peak"] for r in rows)
    if all(r.values["waited"] == 0 for r in rows):
        return (f"{trace}: no task had to wait under any policy — the cluster was at most {peak:.0f} % busy, so "
                f"the policies cannot differ here. Pack the arrivals closer with a larger --speedup (on openb's "
                f"default trace, about 50000 makes tasks queue under every policy).")
    ranked = sorted(rows, key=lambda r: (r.values["waited"], r.values["delay_p99"]))
    best, worst = ranked[0], ranked[-1]
    return (f"{trace}: arrivals replayed in order, up to {peak:.0f} % of the GPU capacity busy. Fewest tasks "
            f"kept waiting: {best.policy} ({best.values['waited']:,.0f} waited, p99 wait "
            f"{best.values['delay_p99']:.0f} s); most: {worst.policy} ({worst.values['waited']:,.0f}, p99 "
            f"{worst.values['delay_p99']:.0f} s).")


def takeaways(rows: Sequence) -> list[str]:
    """One plain sentence or two per trace and mode: what was compared and what won, with this run's numbers."""
    lines = [_inflation_takeaway(t, p) for t, p in _by_trace(rows, "inflation").items()]
    lines += [_timeline_takeaway(t, p) for t, p in _by_trace(rows, "timeline").items()]
    return lines


INTRO = ("gpuslice decides which GPU each slice goes to (`gpuslice run --policy`, and the Kubernetes scheduler "
         "extender's --policy). Many tasks ask for a fraction of a GPU, so the choice decides how much of a "
         "shared fleet stays usable: a GPU left with scraps no task fits into is as good as idle. This replay "
         "sends a real cluster trace (Alibaba's openb format) through the same placement code.")


__all__ = ["INFLATION_COLUMNS", "INTRO", "POLICY_WORDS", "TIMELINE_COLUMNS", "Col", "columns_of", "fmt",
           "glossary", "glossary_grid", "rich_table", "takeaways"]
