"""The no-GPU path of ``gpuslice demo`` / ``make run``: the openb trace through every policy, quickly."""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.sim.engine import SimConfig
from gpuslice.sim.runner import plan
from gpuslice.spec import SpecError

DEFAULT_POLICIES = ("fgd", "bestfit", "binpack", "spread", "random")


def data_dir() -> Path:
    """Where the bundled trace copy lives: ``$GPUSLICE_TRACE_DIR``, else the repository's ``bench/data``."""
    env = os.environ.get("GPUSLICE_TRACE_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3] / "bench" / "data")
    for path in candidates:
        if (path / "openb_pod_list_default.csv").is_file():
            return path
    raise SpecError("GPUSLICE_TRACE_DIR", env or str(candidates[-1]),
                    "a directory with openb_pod_list_default.csv and openb_node_list_gpu_node.csv")


def run_default(out_dir: Path | str, *, policies: tuple[str, ...] = DEFAULT_POLICIES, seed: int = 42,
                workers: int | None = None) -> Path:
    """Run workload inflation on openb_pod_list_default with all policies, print the table, write the
    report; returns the path of ``report.html``. About half a minute on two cores."""
    from gpuslice.sim.commands import run_and_report

    data = data_dir()
    jobs = plan([data / "openb_pod_list_default.csv"], data / "openb_node_list_gpu_node.csv", list(policies),
                "inflation", SimConfig(seed=seed))
    return run_and_report(jobs, Path(out_dir), workers)
