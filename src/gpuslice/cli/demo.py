"""``gpuslice demo`` — the main job of ``make run``.

On a machine with an NVIDIA GPU it runs two small workloads in two slices on GPU 0 and prints their live
usage (local mode). Without one it replays Alibaba's openb trace through the placement policies and
writes the report. It always says which path it took and why.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpuslice.host.console import stdout_console
from gpuslice.host.errors import NoGpuError
from gpuslice.host import devices as discovery


def demo(
    out: Path = typer.Option(Path("out/demo"), "--out", metavar="DIR", help="Where the simulation report is written."),
    force_simulation: bool = typer.Option(False, "--simulate", help="Run the trace simulation even on a GPU box."),
) -> None:
    """Run the demo: two live slices on GPU 0, or (no GPU) the openb trace simulation."""
    gpu_reason = None if not force_simulation else "--simulate was given"
    if gpu_reason is None:
        try:
            found = discovery.discover_nvml()
            typer.echo(f"demo: found {len(found)} GPU(s) through NVML ({found[0].name}); "
                       "running two slices on GPU 0 (local mode)")
            from gpuslice.local.demo import run_gpu_demo

            run_gpu_demo()
            return
        except NoGpuError as exc:
            gpu_reason = str(exc)
    typer.echo(f"demo: no GPU path ({gpu_reason}); running the openb trace simulation instead")
    from gpuslice.sim.demo import run_default
    from gpuslice.sim.explain import INTRO

    stdout_console().print(f"demo: {INTRO}", markup=False, highlight=False)

    report = run_default(out)
    typer.echo(f"demo: report written to {report}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
