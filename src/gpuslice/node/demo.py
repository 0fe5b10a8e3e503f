"""``run_gpu_demo()``: what ``make run`` shows on a GPU box — two slices sharing GPU 0.

Two ``gpuslice run`` processes each run a PyTorch matmul loop (:mod:`gpuslice.node.workload`): one with
30 % compute and a 4 GiB limit, one with 60 % and 8 GiB. The live table (the same as ``gpuslice top``)
refreshes while they run; at the end each prints its matmul rate, the memory CUDA saw, and whether an
allocation above the limit was refused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from rich.live import Live

from gpuslice.console import stdout_console
from gpuslice.errors import GpusliceError
from gpuslice.node import workload as workload_module
from gpuslice.node.paths import STATE_ENV, StateDir
from gpuslice.node.tables import view_renderable
from gpuslice.node.viewsource import ViewSource

SLICES = (("slice-a", "4GiB", 30, 1024), ("slice-b", "8GiB", 60, 2048))  # name, memory, compute, MiB held


def _show_while_running(console, source: ViewSource, runs: list[subprocess.Popen], refresh: float) -> None:
    """A live table on a terminal; into a log (no terminal), a table every 5 refreshes."""
    if console.is_terminal:
        with Live(view_renderable(source.view()), console=console, auto_refresh=False) as live:
            while any(r.poll() is None for r in runs):
                time.sleep(refresh)
                live.update(view_renderable(source.view()), refresh=True)
        return
    ticks = 0
    while any(r.poll() is None for r in runs):
        time.sleep(refresh)
        ticks += 1
        if ticks % 5 == 0:
            console.print(f"--- {time.strftime('%H:%M:%S')}")
            console.print(view_renderable(source.view()))


def torch_workload() -> tuple[str, ...]:
    """The PyTorch workload command: this interpreter if it has torch, else ``python3`` on PATH (``make run``
    runs from a venv without torch; GPU boxes have torch in the system Python)."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    for python in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120)
        if probe.returncode == 0:
            return (python, str(Path(workload_module.__file__).resolve()))
    raise GpusliceError("no Python with PyTorch found for the demo workload (tried "
                        + ", ".join(c for c in candidates if c) + "); install torch in one of them")


def run_gpu_demo(seconds: float = 20.0, refresh: float = 1.0, workload: Sequence[str] | None = None) -> list[dict]:
    """Run the two slices for ``seconds``, print the live table, then a summary; returns the results.

    ``workload`` is the command each slice runs, given ``NAME SECONDS HELD_MIB`` (default: the PyTorch loop of
    :mod:`gpuslice.node.workload`); it prints one JSON line.
    """
    workload = tuple(workload) if workload is not None else torch_workload()
    state = os.environ.get(STATE_ENV) or tempfile.mkdtemp(prefix="gpuslice-demo-")
    env = {**os.environ, STATE_ENV: state}
    StateDir(Path(state)).ensure()
    logs = [Path(state) / f"{name}.log" for name, *_ in SLICES]  # stderr, so the live table stays readable
    runs = [subprocess.Popen(
        [sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", memory, "--compute", str(compute),
         "--", *workload, name, str(seconds), str(held)],
        env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        for (name, memory, compute, held), log in zip(SLICES, logs)]
    console = stdout_console()
    os.environ[STATE_ENV] = state
    source = ViewSource(StateDir(Path(state)))
    _show_while_running(console, source, runs, refresh)
    results = []
    for (name, memory, compute, _), run, log in zip(SLICES, runs, logs):
        out = run.stdout.read() if run.stdout else ""
        line = next((x for x in out.splitlines() if x.startswith("{")), "")
        result = {"name": name, "memory": memory, "compute": compute, "exit": run.returncode, "log": str(log),
                  **(json.loads(line) if line else {"error": "no result line; see " + str(log)})}
        results.append(result)
        console.print(f"{name}: compute {compute}%, limit {memory}: " + json.dumps(result))
    if all("matmul_per_s" in r for r in results) and results[0]["matmul_per_s"]:
        console.print(f"throughput ratio slice-b / slice-a = {results[1]['matmul_per_s'] / results[0]['matmul_per_s']:.2f}"
                      " (shares 60 / 30 = 2.00)")
    return results
