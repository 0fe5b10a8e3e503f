"""Run many replays (traces × policies × seeds) in parallel processes and collect their results."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from gpuslice.placement import POLICIES, PlacementPolicy
from gpuslice.sim.engine import (
    InflationResult, SimConfig, TimelineResult, draw_inflation, run_inflation, run_timeline, timed_tasks,
)
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


@lru_cache(maxsize=8)
def _load(trace: Path, nodes: Path):
    return load_tasks(trace), load_nodes(nodes)


def _run(job: Job, progress: Callable[[int], None] | None = None) -> Outcome:
    tasks, nodes = _load(job.trace, job.nodes)
    policy = PlacementPolicy.parse(job.policy.replace("+", ","), seed=job.config.seed)
    if job.mode == "inflation":
        return Outcome(job, run_inflation(tasks, nodes, policy, job.config, progress))
    return Outcome(job, run_timeline(tasks, nodes, policy, job.config, progress))


def job_size(job: Job) -> int:
    """How many tasks the replay of ``job`` processes (the unit of the progress bar): the inflation
    draw is cheap to repeat, and a timeline replays every timed task once."""
    tasks, nodes = _load(job.trace, job.nodes)
    if job.mode == "inflation":
        capacity = float(sum(n.gpus for n in nodes))
        return len(draw_inflation(tasks, capacity, job.config))
    return len(timed_tasks(tasks, job.config))


# Tasks processed by all worker processes, shared with the parent (set by the pool's initializer).
_COUNTER = None


def _init_worker(counter) -> None:
    global _COUNTER
    _COUNTER = counter


def _count(n: int) -> None:
    with _COUNTER.get_lock():
        _COUNTER.value += n


def _run_counted(job: Job) -> Outcome:
    return _run(job, _count if _COUNTER is not None else None)


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
             on_done: Callable[[Outcome], None] | None = None,
             on_progress: Callable[[int], None] | None = None) -> list[Outcome]:
    """Run jobs (in processes when more than one CPU and job), in the jobs' order.

    ``on_done(outcome)`` is called as each replay ends; ``on_progress(n)`` as tasks are processed (n new
    tasks, every 256 per replay), so a long replay moves a progress bar too. Both are called in this
    process.
    """
    workers = max(1, min(workers or (os.cpu_count() or 1), len(jobs)))
    outcomes: dict[int, Outcome] = {}
    if workers == 1:
        for i, job in enumerate(jobs):
            outcomes[i] = _run(job, on_progress)
            if on_done:
                on_done(outcomes[i])
        return [outcomes[i] for i in range(len(jobs))]
    counter = multiprocessing.Value("q", 0)
    reported = 0
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(counter,)) as pool:
        futures = {pool.submit(_run_counted, job): i for i, job in enumerate(jobs)}
        pending = set(futures)
        while pending:
            # Wake up a few times a second to forward the workers' task counts to the bar.
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            if on_progress:
                now = counter.value
                if now > reported:
                    on_progress(now - reported)
                    reported = now
            for future in done:
                outcome = future.result()
                outcomes[futures[future]] = outcome
                if on_done:
                    on_done(outcome)
    return [outcomes[i] for i in range(len(jobs))]
