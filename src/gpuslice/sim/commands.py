"""``gpuslice simulate`` — replay a cluster trace through the placement policies and report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from gpuslice.host.cliargs import existing_file, option_values
from gpuslice.host.console import print_table, stdout_console
from gpuslice.sim.engine import SimConfig
from gpuslice.sim.explain import glossary_grid, rich_table, takeaways
from gpuslice.sim.report import summarise, write_all
from gpuslice.sim.runner import MODES, Outcome, job_size, parse_policies, plan, run_jobs
from gpuslice.spec import GpusliceError, SpecError


def simulate(
    trace: list[Path] = typer.Option(..., "--trace", metavar="CSV",
                                     help="Pod list CSV (openb format); repeat for several."),
    nodes: Path = typer.Option(..., "--nodes", metavar="CSV", help="Node list CSV (openb format)."),
    policy: str = typer.Option("fgd,bestfit,binpack,spread,random", "--policy", metavar="LIST",
                               help="Comma list of binpack, spread, bestfit, fgd, random "
                                    "(or node=X+gpu=Y for different levels)."),
    mode: str = typer.Option("inflation", "--mode", metavar="inflation|timeline",
                             help="inflation (the FGD paper's method) or timeline."),
    seed: int = typer.Option(42, "--seed", metavar="N", help="Seed of the task draws and of the random policy."),
    repeats: int = typer.Option(1, "--repeats", metavar="N",
                                help="Inflation runs per policy with seeds seed, seed+1, …"),
    ratio: float = typer.Option(1.3, "--ratio", metavar="X",
                                help="Inflation: draw until demand reaches ratio × GPU capacity."),
    split_count: int = typer.Option(10, "--split-count", metavar="N",
                                    help="Slices per GPU at most (HAMi deviceSplitCount)."),
    memory_scaling: float = typer.Option(1.0, "--memory-scaling", metavar="X",
                                         help="Memory limits on a GPU may add up to this × its memory "
                                              "(HAMi deviceMemoryScaling: > 1 oversubscribes, < 1 keeps a reserve)."),
    cpu_tasks: str = typer.Option("include", "--cpu-tasks", metavar="include|skip",
                                  help="include (as the paper) or skip CPU-only tasks."),
    speedup: float = typer.Option(1.0, "--speedup", metavar="X",
                                  help="Timeline: arrivals this many times denser (durations kept). openb's own "
                                       "arrivals keep its cluster far from full; about 50000 makes tasks queue "
                                       "under every policy."),
    fgd_workload: str = typer.Option("learnt", "--fgd-workload", metavar="learnt|trace",
                                     help="What FGD weighs: the shapes learnt from the arrivals so far (what a "
                                          "scheduler knows), or counted over the whole trace up front (the FGD "
                                          "authors' simulator)."),
    out: Path = typer.Option(Path("out/simulate"), "--out", metavar="DIR",
                             help="Directory for summary.csv, curves.csv, report.html."),
    workers: int = typer.Option(0, "--workers", metavar="N", help="Processes (0 = one per CPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary rows and the takeaway as JSON (every "
                                 "value, unrounded) instead of the table; the files are written as well."),
    wide: bool = typer.Option(False, "--wide", help="Every column, even past the terminal's width."),
) -> None:
    """Replay a cluster trace through the placement policies: which one keeps more of the GPUs working.

    Prints a one-line takeaway, the table (fitted to the terminal; --wide for every column, --json for
    every value) and a glossary, and writes summary.csv, curves.csv and report.html (plots embedded)."""
    for path in trace:
        existing_file(path, "--trace", "CSV file")
    existing_file(nodes, "--nodes", "CSV file")
    with option_values():
        if mode not in MODES:
            raise SpecError("mode", mode, "inflation or timeline")
        for name, value, low in (("seed", seed, 0), ("split_count", split_count, 1), ("workers", workers, 0)):
            if value < low:
                raise SpecError(name, value, f"a whole number, {low} or more")
        config = SimConfig(ratio=ratio, seed=seed, split_count=split_count, memory_scaling=memory_scaling,
                           cpu_tasks=cpu_tasks, speedup=speedup, fgd_workload=fgd_workload)
        jobs = plan(trace, nodes, parse_policies(policy), mode, config, repeats)
    report = run_and_report(jobs, out, workers or None, as_json=as_json, wide=wide)
    if not as_json:
        typer.echo(f"report: {report}")


def run_and_report(jobs, out: Path, workers: int | None = None, *, as_json: bool = False,
                   wide: bool = False) -> Path:
    """Run the replays with a progress bar, print what they found, write the files; the report's path.
    The output folder is made first: a place that cannot hold the report fails before minutes of replay."""
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpusliceError(f"cannot write the report to {str(out)!r}: {exc.strerror}") from None
    console = stdout_console()
    rows = _run(jobs, workers, Console(stderr=True) if as_json else console)
    first = jobs[0]
    params = {
        "traces": ", ".join(dict.fromkeys(j.trace.name for j in jobs)), "nodes": first.nodes.name,
        "mode": first.mode, "seeds": ", ".join(str(s) for s in dict.fromkeys(j.config.seed for j in jobs)),
        "ratio": f"{first.config.ratio:g}", "split count": str(first.config.split_count),
        "CPU-only tasks": first.config.cpu_tasks, "memory scaling": f"{first.config.memory_scaling:g}",
        "FGD workload": first.config.fgd_workload,
    }
    if first.mode == "timeline":
        params["speedup"] = f"{first.config.speedup:g}"
    report = write_all(rows, out, params)
    if as_json:
        typer.echo(json.dumps({"takeaways": takeaways(rows), "report": str(report), "parameters": params,
                               "rows": [{"trace": r.trace, "policy": r.policy, "mode": r.mode, "seeds": r.seeds,
                                         "values": _finite(r.values)} for r in rows]}, indent=1))
    else:
        _print(console, rows, wide)
    return report


def _finite(values: dict[str, float]) -> dict[str, float | None]:
    """JSON has no NaN: a value a replay could not measure is null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


def _print(console: Console, rows, wide: bool) -> None:
    """The takeaway first, then per mode the fitted table and its glossary."""
    for line in takeaways(rows):
        console.print(Text(line, style="bold"))
    for mode in sorted({r.mode for r in rows}):
        table = rich_table(rows, mode, 10_000 if wide else console.width, wide)
        print_table(console, table, wide)
        console.print(glossary_grid(mode, rows, table))


def _run(jobs, workers: int | None, console: Console):
    """The replays, with a progress bar on ``console``; their summary rows."""
    # The bar counts tasks, not replays: one replay of a large trace takes seconds to minutes, and a bar
    # that moved only when a replay ended would look stuck.
    sizes = [job_size(job) for job in jobs]
    roomy = console.width >= 110  # the last replay's name and the task count fit only a wide terminal
    columns = [TextColumn("[bold]simulate[/bold] {task.description}"), BarColumn(bar_width=None if roomy else 20)]
    columns += [MofNCompleteColumn(), TextColumn("tasks")] if roomy else []
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task(f"0/{len(jobs)} replays", total=sum(sizes))
        finished = [0]

        def done(outcome: Outcome) -> None:
            finished[0] += 1
            last = f" (last: {outcome.job.trace.stem} {outcome.job.policy} seed {outcome.job.config.seed})"
            progress.update(bar, description=f"{finished[0]}/{len(jobs)} replays" + (last if roomy else ""))

        outcomes = run_jobs(jobs, workers, done, lambda n: progress.update(bar, advance=n))
        progress.update(bar, completed=sum(sizes))
    return summarise(outcomes)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
