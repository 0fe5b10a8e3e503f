"""Run many replays (traces × policies × seeds) in parallel processes and collect their results."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from gpuslice.placement import POLICIES, PlacementPolicy
from gpuslice.sim.engine import InflationResult, SimConfig, TimelineResult, run_inflation, run_timeline
from gpuslice.sim.trace import load_nodes, load_tasks
from gpuslice.spec import SpecError

MODES = ("inflation", "timeline")


@dataclass(frozen=True)
class Job:
    trace: Path
    nodes: Path
    policy: str
    mode: str
    config: SimConfig


@dataclass
class Outcome:
    job: Job
    result: InflationResult | TimelineResult


def parse_policies(text: str) -> list[str]:
    """``fgd,bestfit`` → names, each checked (``node=…,gpu=…`` pairs use ``+``: ``node=spread+gpu=fgd``)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise SpecError("policy", text, "a comma list of " + ", ".join(POLICIES))
    for name in names:
        PlacementPolicy.parse(name.replace("+", ","))
    return names


def _run(job: Job) -> Outcome:
    tasks = load_tasks(job.trace)
    nodes = load_nodes(job.nodes)
    policy = PlacementPolicy.parse(job.policy.replace("+", ","), seed=job.config.seed)
    if job.mode == "inflation":
        return Outcome(job, run_inflation(tasks, nodes, policy, job.config))
    return Outcome(job, run_timeline(tasks, nodes, policy, job.config))


def plan(traces: Sequence[Path], nodes: Path, policies: Sequence[str], mode: str, config: SimConfig,
         repeats: int = 1) -> list[Job]:
    if mode not in MODES:
        raise SpecError("mode", mode, "inflation or timeline")
    if not 1 <= repeats <= 100:
        raise SpecError("repeats", repeats, "1 to 100")
    for path in [*traces, nodes]:
        if not Path(path).is_file():
            raise SpecError("trace" if path != nodes else "nodes", str(path), "an existing CSV file")
    seeds = [config.seed + r for r in range(repeats)] if mode == "inflation" else [config.seed]
    return [Job(Path(t), Path(nodes), p, mode, replace(config, seed=s))
            for t in traces for p in policies for s in seeds]


def run_jobs(jobs: Sequence[Job], workers: int | None = None,
             on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run jobs (in processes when more than one CPU and job), in the jobs' order."""
    workers = max(1, min(workers or (os.cpu_count() or 1), len(jobs)))
    outcomes: dict[int, Outcome] = {}
    if workers == 1:
        for i, job in enumerate(jobs):
            outcomes[i] = _run(job)
            if on_done:
                on_done(outcomes[i])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run, job): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                outcome = future.result()
                outcomes[futures[future]] = outcome
                if on_done:
                    on_done(outcome)
    return [outcomes[i] for i in range(len(jobs))]
