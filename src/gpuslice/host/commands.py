"""``gpuslice devices``: the device table of this node (NVML) or of a snapshot."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuslice.host.console import stdout_console
from gpuslice.host import devices as discovery
from gpuslice.spec import Device, human_bytes


def devices_table(devices: list[Device], title: str, unreadable: tuple[discovery.Unreadable, ...] = (),
                  caption: str | None = None) -> Table:
    """A rich table with one row per device (MIG instances indented below their card); GPUs NVML could
    not read get a row that says so."""
    table = Table(title=title, caption=caption)
    for column in ("#", "UUID", "name", "memory", "SMs", "NUMA", "NVLink peers", "MIG", "compute mode"):
        table.add_column(column, justify="right" if column in ("#", "memory", "SMs", "NUMA") else "left")
    rows: list[tuple[int, list[list[str]]]] = []
    for d in devices:
        numa = "-" if d.numa_node is None else str(d.numa_node)
        mig = "on" if d.mig_enabled else "off"
        block = [[str(d.index), d.uuid, d.name, human_bytes(d.memory_total), str(d.sm_count or "?"),
                  numa, str(len(d.nvlink_peers)) if d.nvlink_peers else "-", mig, d.compute_mode]]
        for m in d.mig_instances:
            block.append(["", f"  └ {m.uuid}", m.profile, human_bytes(m.memory_total), str(m.sm_count or "?"),
                          "", "", "", ""])
        rows.append((d.index, block))
    for u in unreadable:
        rows.append((u.index, [[str(u.index), u.uuid or "-", f"[red]unreadable: {escape(u.error)}[/red]",
                                "", "", "", "", "", ""]]))
    for _, block in sorted(rows, key=lambda r: r[0]):
        for row in block:
            table.add_row(*row)
    return table


def _title(report: discovery.Discovery) -> str:
    if report.origin != "NVML":
        return f"GPUs ({report.origin})"
    facts = [f"on {report.host}"] if report.host else []
    facts += [f"driver {report.driver_version}"] if report.driver_version else []
    facts += [f"CUDA {report.cuda_driver_version}"] if report.cuda_driver_version else []
    return f"GPUs (NVML {', '.join(facts)})" if facts else "GPUs (NVML)"


def _caption(report: discovery.Discovery) -> str | None:
    """For a snapshot: what the document says about itself."""
    if report.origin == "NVML":
        return None
    parts = [report.source] if report.source else []
    read = " ".join(x for x in (f"captured {report.captured}" if report.captured else "",
                                f"on {report.host}" if report.host else "",
                                f"driver {report.driver_version}" if report.driver_version else "") if x)
    if read:
        parts.append(read)
    return escape(" · ".join(parts)) if parts else None


def devices(
    as_json: bool = typer.Option(False, "--json", help="Print a snapshot document (loadable with --snapshot), "
                                 "with the capture time, host and driver version when read from NVML."),
    snapshot: Optional[str] = typer.Option(
        None, "--snapshot", help="Read a snapshot file or bundled name instead of NVML "
        f"(bundled: {', '.join(discovery.bundled_snapshots())})."),
) -> None:
    """List the GPUs of this node: UUID, memory, SMs, NUMA, NVLink, MIG, compute mode."""
    report = discovery.load_snapshot_report(snapshot) if snapshot else discovery.discover_report()
    if as_json:
        typer.echo(json.dumps(discovery.report_json(report), indent=1))
    else:
        stdout_console().print(devices_table(list(report.devices), _title(report), report.unreadable,
                                             _caption(report)))
    err = Console(stderr=True)
    for u in report.unreadable:
        err.print(f"[yellow]warning:[/yellow] {escape(u.line())} — left out of placement", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("devices")(devices)
