"""The job list of the openb side-by-side benchmark (shared by openb.py and device_run.py)."""

from __future__ import annotations

from pathlib import Path

from gpuslice.sim.engine import SimConfig
from gpuslice.sim.runner import Job, plan

DATA = Path(__file__).resolve().parents[1] / "data"
POLICIES = ["fgd", "bestfit", "binpack", "spread", "random"]
VARIANTS = ["gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100", "multigpu20", "multigpu30"]


def build_jobs(repeats_default: int, repeats: int, variants: list[str] | None = None) -> list[Job]:
    nodes = DATA / "openb_node_list_gpu_node.csv"
    config = SimConfig(seed=42)
    jobs = plan([DATA / "openb_pod_list_default.csv"], nodes, POLICIES, "inflation", config, repeats_default)
    variants = VARIANTS if variants is None else variants
    if variants and repeats:
        jobs += plan([DATA / f"openb_pod_list_{v}.csv" for v in variants], nodes, POLICIES, "inflation", config,
                     repeats)
    return jobs


def build_timeline_jobs(speedups: list[float], traces: list[str] | None = None) -> list[Job]:
    """Time-ordered replays of the traces that carry creation/deletion times, at several speed-ups."""
    nodes = DATA / "openb_node_list_gpu_node.csv"
    names = traces or ["default"]
    jobs: list[Job] = []
    for speedup in speedups:
        jobs += plan([DATA / f"openb_pod_list_{t}.csv" for t in names], nodes, POLICIES, "timeline",
                     SimConfig(seed=42, speedup=speedup))
    return jobs
