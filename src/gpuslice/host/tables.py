"""Rich tables of a NodeView for ``gpuslice ps`` and ``gpuslice top``, fitted to the terminal.

What stays when the terminal is narrow (``Column.keep``, 0 = always): which grant, on which device, its
memory used and limit, compute achieved and set; then priority, the command, OOM refusals, owner, age;
the peak, throttling and pids go first. ``--wide`` shows every column and the whole command; ``--json`` every value.
"""

from __future__ import annotations

import time

from typing import Callable

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuslice.host.console import Column, fit_table, literal, visible
from gpuslice.host.monitor import NodeView
from gpuslice.spec import human_bytes

COMMAND_SHORT = 40  # characters of a command shown when not --wide


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _set(share: int, whole: bool, engine: str = "timeslice") -> str:
    """A compute share as set: whole devices are all theirs; 0 on a shared device is not paced; a spatial
    slice's share is its fraction of the SMs (MPS)."""
    if engine == "spatial":
        return f"{share}% SMs" if 0 < share < 100 else "all SMs"
    return "whole" if whole else (f"{share}%" if share else "unpaced")


def _command(text: str, wide: bool) -> str:
    return literal(text if wide or len(text) <= COMMAND_SHORT else text[:COMMAND_SHORT - 1] + "…")


def describe_request(r: dict) -> str:
    """A request (its JSON) in a few words: `2 × 4GiB shared`, `2 whole devices`, `1 × 8GiB, compute 30%`."""
    count, memory = r["count"], r["memory"]
    if r.get("exclusive") or (count > 1 and memory is None):
        text = f"{count} whole device(s)"
    else:
        text = f"{count} × {memory or 'whole memory'}" + (" (distinct devices)" if count > 1 else "")
    return text + (f", compute {r['compute']}%" if r["compute"] else ", compute unpaced")


def devices_table(view: NodeView, width: int = 200, wide: bool = False) -> Table:
    d = view.devices
    columns = [
        Column("#", [str(x.index) for x in d], justify="right"),
        Column("name", [x.name for x in d], keep=3, wrap=True),
        Column("memory\nused", [human_bytes(x.memory_used) for x in d], justify="right"),
        Column("granted", [human_bytes(x.memory_granted) for x in d], justify="right"),
        Column("total", [human_bytes(x.memory_total) for x in d], keep=2, justify="right"),
        Column("compute\nachieved", [_pct(x.compute_achieved) for x in d], justify="right"),
        Column("granted\n%", ["100% (whole)" if x.held_whole else f"{x.compute_granted}%" for x in d],
               justify="right", short=["100%" if x.held_whole else f"{x.compute_granted}%" for x in d]),
        Column("slices", [str(x.slices) for x in d], keep=1, justify="right"),
    ]
    return fit_table(columns, width, wide=wide, title=f"devices on {view.node}", title_justify="left")


def slices_table(view: NodeView, width: int = 200, wide: bool = False) -> Table:
    s = view.slices
    columns = [
        Column("grant", [x.grant_id for x in s]),
        Column("owner", [literal(x.owner) for x in s], keep=4),  # keep: see the module's docstring
        Column("gpu", [str(x.device_index) for x in s], justify="right"),
        Column("memory\nused", [human_bytes(x.memory_used) for x in s], justify="right"),
        Column("limit", [human_bytes(x.memory_limit) for x in s], justify="right"),
        Column("peak", [human_bytes(x.memory_peak) for x in s], keep=6, justify="right"),
        Column("compute", [_pct(x.compute_achieved) for x in s], justify="right"),
        Column("set", [_set(x.compute_set, x.exclusive, x.engine) for x in s], justify="right"),
        Column("throttled", [f"{x.throttled_seconds:.1f}s" for x in s], keep=7, justify="right"),
        Column("OOM\nrefusals", [str(x.oom_refusals) for x in s], keep=3, justify="right"),
        *([Column("OOM\nwaiting", [_waiting(x) for x in s], keep=3, justify="right")]  # oom_policy=wait in use
          if any(x.oom_waits for x in s) else []),
        # the co-location mode beside the priority when it is not the default (preemptive): "low tidal"
        Column("priority", [x.priority + ("" if x.colocation == "preemptive" else f" {x.colocation}") for x in s],
               keep=1),
        Column("pids", [" ".join(map(str, x.pids)) or "-" for x in s], keep=8, wrap=True),
        Column("age", [_age(x.age_seconds) for x in s], keep=5, justify="right"),
        Column("command", [_command(x.command, wide) for x in s], keep=2, wrap=True),
    ]
    return fit_table(columns, width, wide=wide, title="slices", title_justify="left")


def _waiting(x) -> str:
    """Allocations waiting now for device memory, and of all that waited, how many timed out."""
    return f"{x.oom_waiting} ({x.oom_wait_timeouts}/{x.oom_waits} timed out)" if x.oom_waits else "-"


def mps_table(view: NodeView, width: int = 200, wide: bool = False) -> Table:
    """The MPS daemons of spatial slices: device, user, pid, state and the last fault their logs report."""
    index = {d.uuid: d.index for d in view.devices}
    m = view.mps
    last = [(d.get("faults") or [""])[-1] or _restart_fault(d.get("last_restart")) for d in m]
    columns = [
        Column("gpu", [str(index.get(d["device"], "?")) for d in m], justify="right"),
        Column("user", ["agent" if d["uid"] < 0 else str(d["uid"]) for d in m]),
        Column("pid", [str(d["pid"] or "-") for d in m], keep=2, justify="right"),
        Column("state", [d["state"] for d in m]),
        Column("restarts", [_restarts(d) for d in m], keep=1),
        Column("last fault", [literal(f if wide else f[:80]) for f in last], keep=1, wrap=True),
    ]
    return fit_table(columns, width, wide=wide, title="MPS daemons (spatial slices)", title_justify="left")


def _restarts(daemon: dict) -> str:
    """'0', or the count with the last one's reason and age: '2 (fault, 3m ago)'."""
    last = daemon.get("last_restart")
    if not daemon.get("restarts") or not last:
        return "0"
    return f"{daemon['restarts']} ({last['reason']}, {_age(max(0.0, time.time() - last['at']))} ago)"


def _restart_fault(last: dict | None) -> str:
    """The fault line that made the last restart, once the fresh daemon's logs have none."""
    return f"before the restart: {last['faults'][-1]}" if last and last.get("faults") else ""


def queue_table(view: NodeView, width: int = 200, wide: bool = False) -> Table:
    """The wait queue in order: place (1 = first), ticket, who, priority, how long it waits, for what."""
    rows = []
    for i, w in enumerate(view.waiters, 1):
        indexes = w.get("device_indexes") or []
        devices = ",".join(str(x) if x >= 0 else "?" for x in indexes) if indexes else "any"
        age = w.get("age_seconds", max(0.0, view.time - w.get("enqueued", view.time)))
        rows.append((str(w.get("position", i)), str(w["ticket"]), literal(w["owner"]), "high" if w["priority"] == 0 else "low",
                     _age(age), devices, describe_request(w["request"])))
    spec = [("#", 0, "right", False), ("ticket", 2, "right", False), ("owner", 3, "left", False),
            ("priority", 1, "left", False), ("waiting", 0, "right", False), ("devices", 1, "left", False),
            ("request", 0, "left", True)]
    columns = [Column(h, [r[k] for r in rows], keep=keep, justify=justify, wrap=wrap)
               for k, (h, keep, justify, wrap) in enumerate(spec)]
    return fit_table(columns, width, wide=wide, title="waiting", title_justify="left")


def backstop_table(view: NodeView, width: int = 200, wide: bool = False) -> Table:
    """What the backstop found in NVML's count: slices above their limit (and what was done), GPU processes of
    no slice (placed by nothing, limited by nothing)."""
    report = view.backstop or {}
    index = {d.uuid: d.index for d in view.devices}
    rows = [("over limit", o["grant_id"], str(index.get(o["device_uuid"], "?")), human_bytes(o["used"]),
             human_bytes(o["limit"]), f"{o['action']} ({o['over_for']:.0f}s over)", " ".join(map(str, o["pids"])))
            for o in report.get("overruns", ())]
    rows += [("no slice", str(p["pid"]), str(index.get(p["device_uuid"], "?")),
              "?" if p["used"] is None else human_bytes(p["used"]), "-", "reported",
              _command(p.get("command") or "", wide)) for p in report.get("unattributed", ())]
    spec = [("what", 0, "left", False), ("grant / pid", 0, "left", False), ("gpu", 0, "right", False),
            ("memory\n(NVML)", 0, "right", False), ("limit", 0, "right", False), ("action", 1, "left", True),
            ("pids / command", 2, "left", True)]
    columns = [Column(h, [r[k] for r in rows], keep=keep, justify=justify, wrap=wrap)
               for k, (h, keep, justify, wrap) in enumerate(spec)]
    return fit_table(columns, width, wide=wide, title=f"backstop (NVML; policy {report.get('policy', '?')})",
                     title_justify="left")


class Fitted:
    """A renderable built for the width it is drawn at (``top`` redraws after a terminal resize, and a
    ``Live`` display knows its width only when it renders)."""

    def __init__(self, build: Callable[[int], Group]):
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.build(options.max_width))


def view_renderable(view: NodeView, wide: bool = False) -> Fitted:
    """The node view (devices, slices, MPS daemons when there are spatial slices, the queue when anyone
    waits, the backstop's findings when it has any, and what could not be read) at whatever width it is drawn."""
    def build(width: int) -> Group:
        parts = [devices_table(view, width, wide), slices_table(view, width, wide)]
        if view.mps:
            parts.append(mps_table(view, width, wide))
        if view.waiters:
            parts.append(queue_table(view, width, wide))
        if (view.backstop or {}).get("overruns") or (view.backstop or {}).get("unattributed"):
            parts.append(backstop_table(view, width, wide))
        if view.errors:  # what the node could not read (a region, a slice record file, a ledger row): never hidden
            parts.append(Text("\n".join(f"problem: {visible(e)}" for e in view.errors), style="yellow"))
        return Group(*parts)
    return Fitted(build)
