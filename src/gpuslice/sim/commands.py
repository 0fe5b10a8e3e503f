"""``gpuslice simulate`` — replay a cluster trace through the placement policies and report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuslice.host.console import stdout_console
from gpuslice.sim.engine import SimConfig
from gpuslice.sim.report import rich_table, summarise, write_all
from gpuslice.sim.runner import MODES, Outcome, job_size, parse_policies, plan, run_jobs
from gpuslice.spec import SpecError


def simulate(
    trace: list[Path] = typer.Option(..., "--trace", help="Pod list CSV (openb format); repeat for several."),
    nodes: Path = typer.Option(..., "--nodes", help="Node list CSV (openb format)."),
    policy: str = typer.Option("fgd,bestfit,binpack,spread,random", "--policy",
                               help="Comma list of binpack, spread, bestfit, fgd, random "
                                    "(or node=X+gpu=Y for different levels)."),
    mode: str = typer.Option("inflation", "--mode", help="inflation (the FGD paper's method) or timeline."),
    seed: int = typer.Option(42, "--seed", help="Seed of the task draws and of the random policy."),
    repeats: int = typer.Option(1, "--repeats", help="Inflation runs per policy with seeds seed, seed+1, …"),
    ratio: float = typer.Option(1.3, "--ratio", help="Inflation: draw until demand reaches ratio × GPU capacity."),
    split_count: int = typer.Option(10, "--split-count", help="Slices per GPU at most (HAMi deviceSplitCount)."),
    memory_scaling: float = typer.Option(1.0, "--memory-scaling",
                                         help="Memory limits on a GPU may add up to this × its memory "
                                              "(HAMi deviceMemoryScaling: > 1 oversubscribes, < 1 keeps a reserve)."),
    cpu_tasks: str = typer.Option("include", "--cpu-tasks", help="include (as the paper) or skip CPU-only tasks."),
    speedup: float = typer.Option(1.0, "--speedup", help="Timeline: arrivals this many times denser (durations kept)."),
    out: Path = typer.Option(Path("out/simulate"), "--out", help="Directory for summary.csv, curves.csv, report.html."),
    workers: int = typer.Option(0, "--workers", help="Processes (0 = one per CPU)."),
) -> None:
    """Replay a trace through the placement policies: table, CSV and an HTML report with plots."""
    if mode not in MODES:
        raise SpecError("mode", mode, "inflation or timeline")
    config = SimConfig(ratio=ratio, seed=seed, split_count=split_count, memory_scaling=memory_scaling,
                       cpu_tasks=cpu_tasks, speedup=speedup)
    jobs = plan(trace, nodes, parse_policies(policy), mode, config, repeats)
    report = run_and_report(jobs, out, workers or None)
    typer.echo(f"report: {report}")


def run_and_report(jobs, out: Path, workers: int | None = None) -> Path:
    console = stdout_console()
    # The bar counts tasks, not replays: one replay of a large trace takes seconds to minutes, and a bar
    # that moved only when a replay ended would look stuck.
    sizes = [job_size(job) for job in jobs]
    with Progress(TextColumn("[bold]simulate[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("tasks"), TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task(f"0/{len(jobs)} replays", total=sum(sizes))
        finished = [0]

        def done(outcome: Outcome) -> None:
            finished[0] += 1
            progress.update(bar, description=f"{finished[0]}/{len(jobs)} replays (last: {outcome.job.trace.stem} "
                                             f"{outcome.job.policy} seed {outcome.job.config.seed})")

        outcomes = run_jobs(jobs, workers, done, lambda n: progress.update(bar, advance=n))
        progress.update(bar, completed=sum(sizes))
    rows = summarise(outcomes)
    modes = sorted({r.mode for r in rows})
    for mode in modes:
        console.print(rich_table(rows, mode))
    first = jobs[0]
    params = {
        "traces": ", ".join(dict.fromkeys(j.trace.name for j in jobs)), "nodes": first.nodes.name,
        "mode": first.mode, "seeds": ", ".join(str(s) for s in dict.fromkeys(j.config.seed for j in jobs)),
        "ratio": f"{first.config.ratio:g}", "split count": str(first.config.split_count),
        "CPU-only tasks": first.config.cpu_tasks, "memory scaling": f"{first.config.memory_scaling:g}",
    }
    if first.mode == "timeline":
        params["speedup"] = f"{first.config.speedup:g}"
    return write_all(rows, out, params)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
