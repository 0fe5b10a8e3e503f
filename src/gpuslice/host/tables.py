"""Rich tables of a NodeView for ``gpuslice ps`` and ``gpuslice top``."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuslice.host.monitor import NodeView
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


def _set(share: int, whole: bool) -> str:
    """A compute share as set: whole devices are all theirs; 0 on a shared device is not paced."""
    return "whole" if whole else (f"{share}%" if share else "unpaced")


def describe_request(r: dict) -> str:
    """A request (its JSON) in a few words: `2 × 4GiB shared`, `2 whole devices`, `1 × 8GiB, compute 30%`."""
    count, memory = r["count"], r["memory"]
    if r.get("exclusive") or (count > 1 and memory is None):
        text = f"{count} whole device(s)"
    else:
        text = f"{count} × {memory or 'whole memory'}" + (" (distinct devices)" if count > 1 else "")
    return text + (f", compute {r['compute']}%" if r["compute"] else ", compute unpaced")


def devices_table(view: NodeView) -> Table:
    table = Table(title=f"devices on {view.node}", title_justify="left")
    for name in ("#", "name", "memory used", "granted", "total", "compute achieved", "granted %", "slices"):
        table.add_column(name, justify="left" if name == "name" else "right")
    for d in view.devices:
        table.add_row(str(d.index), d.name, human_bytes(d.memory_used), human_bytes(d.memory_granted),
                      human_bytes(d.memory_total), _pct(d.compute_achieved),
                      "100% (whole)" if d.held_whole else f"{d.compute_granted}%", str(d.slices))
    return table


def slices_table(view: NodeView) -> Table:
    table = Table(title="slices", title_justify="left")
    for name in ("grant", "owner", "gpu", "memory used", "limit", "peak", "compute", "set", "throttled",
                 "OOM refusals", "priority", "pids", "age", "command"):
        table.add_column(name, justify="right" if name in ("gpu", "memory used", "limit", "peak", "compute", "set",
                                                          "throttled", "OOM refusals", "age") else "left")
    for s in view.slices:
        table.add_row(s.grant_id, s.owner, str(s.device_index), human_bytes(s.memory_used), human_bytes(s.memory_limit),
                      human_bytes(s.memory_peak), _pct(s.compute_achieved), _set(s.compute_set, s.exclusive),
                      f"{s.throttled_seconds:.1f}s", str(s.oom_refusals), s.priority,
                      " ".join(map(str, s.pids)) or "-", _age(s.age_seconds), s.command[:40])
    return table


def view_renderable(view: NodeView) -> Group:
    parts = [devices_table(view), slices_table(view)]
    if view.waiters:
        parts.append(queue_table(view))
    if (view.backstop or {}).get("overruns") or (view.backstop or {}).get("unattributed"):
        parts.append(backstop_table(view))
    if view.errors:  # what the node could not read (a region, a pacing file, a ledger row): never hidden
        parts.append(Text("\n".join(f"problem: {e}" for e in view.errors), style="yellow"))
    return Group(*parts)


def queue_table(view: NodeView) -> Table:
    """The wait queue in order: place (1 = first), ticket, who, priority, how long it waits, for what."""
    queue = Table(title="waiting", title_justify="left")
    for name in ("#", "ticket", "owner", "priority", "waiting", "devices", "request"):
        queue.add_column(name, justify="right" if name in ("#", "ticket", "waiting") else "left")
    for i, w in enumerate(view.waiters, 1):
        indexes = w.get("device_indexes") or []
        devices = ",".join(str(x) if x >= 0 else "?" for x in indexes) if indexes else "any"
        age = w.get("age_seconds", max(0.0, view.time - w.get("enqueued", view.time)))
        queue.add_row(str(w.get("position", i)), str(w["ticket"]), w["owner"],
                      "high" if w["priority"] == 0 else "low", _age(age), devices, describe_request(w["request"]))
    return queue


def backstop_table(view: NodeView) -> Table:
    """What the backstop found in NVML's count: slices above their limit (and what was done), GPU processes of
    no slice (placed by nothing, limited by nothing)."""
    report = view.backstop
    table = Table(title=f"backstop (NVML; policy {report.get('policy', '?')})", title_justify="left")
    for name in ("what", "grant / pid", "gpu", "memory (NVML)", "limit", "action", "pids / command"):
        table.add_column(name, justify="right" if name in ("memory (NVML)", "limit") else "left")
    index = {d.uuid: d.index for d in view.devices}
    for o in report.get("overruns", ()):
        table.add_row("over limit", o["grant_id"], str(index.get(o["device_uuid"], "?")), human_bytes(o["used"]),
                      human_bytes(o["limit"]), f"{o['action']} ({o['over_for']:.0f}s over)",
                      " ".join(map(str, o["pids"])))
    for p in report.get("unattributed", ()):
        table.add_row("no slice", str(p["pid"]), str(index.get(p["device_uuid"], "?")),
                      "?" if p["used"] is None else human_bytes(p["used"]), "-", "reported",
                      (p.get("command") or "")[:40])
    return table
