"""Rich tables of a NodeView for ``gpuslice ps`` and ``gpuslice top``."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from gpuslice.node.monitor import NodeView
from gpuslice.spec import human_bytes


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def devices_table(view: NodeView) -> Table:
    table = Table(title=f"devices on {view.node}", title_justify="left")
    for name in ("#", "name", "memory used", "granted", "total", "compute achieved", "granted %", "slices"):
        table.add_column(name, justify="left" if name == "name" else "right")
    for d in view.devices:
        table.add_row(str(d.index), d.name, human_bytes(d.memory_used), human_bytes(d.memory_granted),
                      human_bytes(d.memory_total), _pct(d.compute_achieved), f"{d.compute_granted}%", str(d.slices))
    return table


def slices_table(view: NodeView) -> Table:
    table = Table(title="slices", title_justify="left")
    for name in ("grant", "owner", "gpu", "memory used", "limit", "peak", "compute", "set", "throttled",
                 "OOM refusals", "priority", "pids", "age", "command"):
        table.add_column(name, justify="right" if name in ("gpu", "memory used", "limit", "peak", "compute", "set",
                                                          "throttled", "OOM refusals", "age") else "left")
    for s in view.slices:
        table.add_row(s.grant_id, s.owner, str(s.device_index), human_bytes(s.memory_used), human_bytes(s.memory_limit),
                      human_bytes(s.memory_peak), _pct(s.compute_achieved), f"{s.compute_set}%" if s.compute_set else "-",
                      f"{s.throttled_seconds:.1f}s", str(s.oom_refusals), s.priority,
                      " ".join(map(str, s.pids)) or "-", _age(s.age_seconds), s.command[:40])
    return table


def view_renderable(view: NodeView) -> Group:
    parts = [devices_table(view), slices_table(view)]
    if view.waiters:
        queue = Table(title="waiting", title_justify="left")
        for name in ("ticket", "owner", "priority", "request"):
            queue.add_column(name)
        for w in view.waiters:
            r = w["request"]
            queue.add_row(str(w["ticket"]), w["owner"], "high" if w["priority"] == 0 else "low",
                          f"{r['count']} GPU, memory {r['memory'] or 'whole'}, compute {r['compute']}%")
        parts.append(queue)
    return Group(*parts)
