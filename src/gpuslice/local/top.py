"""``gpuslice top``: the node view, refreshed in place (rich Live), or one JSON line per refresh."""

from __future__ import annotations

import json
import time

from rich.live import Live

from gpuslice.host.console import ctrl_c_interrupts, print_table, stdout_console
from gpuslice.local.paths import StateDir
from gpuslice.host.tables import view_renderable
from gpuslice.local.viewsource import ViewSource


def run_top(state: StateDir, interval: float, count: int, as_json: bool, wide: bool = False) -> None:
    """Until ``count`` refreshes, or Ctrl-C (taken as the end even when SIGINT was inherited ignored)."""
    with ctrl_c_interrupts():
        try:
            _refresh(state, interval, count, as_json, wide)
        except KeyboardInterrupt:
            pass


def _refresh(state: StateDir, interval: float, count: int, as_json: bool, wide: bool) -> None:
    source = ViewSource(state)
    shown = 0
    if as_json:
        while count == 0 or shown < count:
            print(json.dumps(source.view().to_json()), flush=True)
            shown += 1
            if count == 0 or shown < count:
                time.sleep(interval)
        return
    console = stdout_console()
    if not console.is_terminal:  # a pipe or a log: one table per refresh, nothing redrawn
        while count == 0 or shown < count:
            print_table(console, view_renderable(source.view(), wide), wide)
            shown += 1
            if count == 0 or shown < count:
                time.sleep(interval)
        return
    with Live(view_renderable(source.view(), wide), console=console, auto_refresh=False) as live:
        shown = 1
        while count == 0 or shown < count:
            time.sleep(interval)
            live.update(view_renderable(source.view(), wide), refresh=True)
            shown += 1
