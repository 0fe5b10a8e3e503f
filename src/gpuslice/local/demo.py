"""``run_gpu_demo()``: what ``make run`` shows on a GPU box — two slices sharing GPU 0.

Two ``gpuslice run`` processes each run a PyTorch matmul loop (:mod:`gpuslice.local.workload`): one with
30 % compute and a 4 GiB limit, one with 60 % and 8 GiB. They use the normal state dir (``$GPUSLICE_STATE_DIR``,
else the default, or a root agent's), so ``gpuslice ps`` / ``top`` / the agent in another terminal see them and
they respect grants already held. The live table (the same as ``gpuslice top``) refreshes while they run; at the
end each prints its matmul rate, the memory CUDA saw, and whether an allocation above the limit was refused.

The two runs are started without the terminal (stdin ``/dev/null``, a session of their own), so Ctrl-C reaches
the demo alone; it then ends both runs (SIGINT, then SIGTERM, then SIGKILL), whose launchers release their
grants, and exits 130. A slice that failed makes :func:`run_gpu_demo` raise :class:`DemoFailed` (exit 1)
after the summary. The runs' stderr goes to a temporary folder that is removed at the end (a failed
slice's last lines are printed and kept in its result).
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from rich.live import Live

from gpuslice.host.console import ctrl_c_interrupts, stdout_console
from gpuslice.spec.errors import GpusliceError
from gpuslice.local import workload as workload_module
from gpuslice.local.paths import StateDir
from gpuslice.host.tables import view_renderable
from gpuslice.local.viewsource import ViewSource

SLICES = (("slice-a", "4GiB", 30, 1024), ("slice-b", "8GiB", 60, 2048))  # name, memory, compute, MiB held
INTERRUPT_WAIT_S = 5.0  # after SIGINT, then after SIGTERM (plus the launcher's kill grace), before SIGKILL
LOG_TAIL_LINES = 15


class DemoFailed(GpusliceError):
    """A slice of the demo did not run to its result (the CLI prints it and exits 1)."""

def _show_while_running(console, source: ViewSource, runs: list[subprocess.Popen], refresh: float) -> None:
    """A live table on a terminal; into a log (no terminal), a table every 5 refreshes and whenever a slice
    starts or ends (a short demo on a busy machine would otherwise end between two tables)."""
    if console.is_terminal:
        with Live(view_renderable(source.view()), console=console, auto_refresh=False) as live:
            while any(r.poll() is None for r in runs):
                time.sleep(refresh)
                live.update(view_renderable(source.view()), refresh=True)
        return
    ticks, shown = 0, -1
    while any(r.poll() is None for r in runs):
        time.sleep(refresh)
        ticks += 1
        view = source.view()
        if ticks % 5 == 0 or len(view.slices) != shown:  # and whenever a slice comes or goes
            shown = len(view.slices)
            console.print(f"--- {time.strftime('%H:%M:%S')}")
            console.print(view_renderable(view))


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


def _start_detached() -> None:
    """In each ``gpuslice run`` child before exec: end with the demo (PDEATHSIG; the launcher forwards it)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _end_runs(runs: list[subprocess.Popen]) -> None:
    """Stop the runs still going: SIGINT (the launcher forwards it to its command), then SIGTERM (forwarded,
    then the launcher kills the tree after its grace), then SIGKILL. The launchers release their grants;
    after SIGKILL the ledger reclaims them once the trees are gone."""
    from gpuslice.local.launcher import grace_seconds

    try:
        grace = grace_seconds()
    except Exception:
        grace = 10.0
    for signum, wait in ((signal.SIGINT, INTERRUPT_WAIT_S), (signal.SIGTERM, grace + INTERRUPT_WAIT_S),
                         (signal.SIGKILL, INTERRUPT_WAIT_S)):
        live = [r for r in runs if r.poll() is None]
        if not live:
            return
        for r in live:
            try:
                r.send_signal(signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while any(r.poll() is None for r in live) and time.monotonic() < deadline:
            time.sleep(0.05)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failed(results: Sequence[dict]) -> list[dict]:
    """The results of slices that did not run to a result line with a matmul rate, or exited non-zero."""
    return [r for r in results if r.get("exit") != 0 or "error" in r or "matmul_per_s" not in r]


def run_gpu_demo(seconds: float = 20.0, refresh: float = 1.0, workload: Sequence[str] | None = None, *,
                 check: bool = True) -> list[dict]:
    """Run the two slices for ``seconds``, print the live table, then a summary; returns the results.

    ``workload`` is the command each slice runs, given ``NAME SECONDS HELD_MIB`` (default: the PyTorch loop of
    :mod:`gpuslice.local.workload`); it prints one JSON line. With ``check`` a failed slice raises
    :class:`DemoFailed` after the summary. Ctrl-C ends both slices and exits 130 (``SystemExit``).
    """
    with ctrl_c_interrupts():  # Ctrl-C must stop the demo even when it was started with SIGINT ignored
        return _run(seconds, refresh, tuple(workload) if workload is not None else torch_workload(), check)


def _run(seconds: float, refresh: float, workload: tuple[str, ...], check: bool) -> list[dict]:
    state = StateDir.default()
    console = stdout_console()
    console.print(f"demo: state dir {state.root}; in another terminal: gpuslice ps, gpuslice top")
    with tempfile.TemporaryDirectory(prefix="gpuslice-demo-logs-") as logdir:
        logs = [Path(logdir) / f"{name}.log" for name, *_ in SLICES]  # stderr, so the live table stays readable
        runs: list[subprocess.Popen] = []
        try:
            for (name, memory, compute, held), log in zip(SLICES, logs):
                with log.open("w") as err:
                    runs.append(subprocess.Popen(
                        [sys.executable, "-m", "gpuslice.cli", "run", "--device", "0", "--memory", memory,
                         "--compute", str(compute), "--", *workload, name, str(seconds), str(held)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
                        start_new_session=True, preexec_fn=_start_detached))
            _show_while_running(console, ViewSource(state), runs, refresh)
            outputs = [run.communicate()[0] or "" for run in runs]
        except KeyboardInterrupt:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
            try:
                console.print("demo: interrupted; ending both slices and releasing their grants")
                _end_runs(runs)
            finally:
                signal.signal(signal.SIGINT, previous)
            console.print("demo: stopped")
            raise SystemExit(130) from None
        except BaseException:
            _end_runs(runs)
            raise
        results = []
        for (name, memory, compute, _), run, log, out in zip(SLICES, runs, logs, outputs):
            line = next((x for x in out.splitlines() if x.startswith("{")), "")
            result = {"name": name, "memory": memory, "compute": compute, "exit": run.returncode,
                      **(json.loads(line) if line else {"error": "no result line"})}
            if result in failed([result]):
                result["log_tail"] = _tail(log)
            results.append(result)
            console.print(f"{name}: compute {compute}%, limit {memory}: "
                          + json.dumps({k: v for k, v in result.items() if k != "log_tail"}))
    if all("matmul_per_s" in r for r in results) and results[0]["matmul_per_s"]:
        console.print(f"throughput ratio slice-b / slice-a = {results[1]['matmul_per_s'] / results[0]['matmul_per_s']:.2f}"
                      " (shares 60 / 30 = 2.00)")
    bad = failed(results)
    for r in bad:
        console.print(f"demo: {r['name']} failed (exit {r['exit']}); its gpuslice run said:\n{r.get('log_tail', '')}",
                      markup=False)
    if bad and check:
        raise DemoFailed(f"demo: {len(bad)} of {len(results)} slice(s) failed: "
                         + ", ".join(f"{r['name']} (exit {r['exit']})" for r in bad))
    return results
