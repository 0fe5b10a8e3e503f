"""``gpuslice devices``: the device table of this node (NVML) or of a snapshot."""

from __future__ import annotations

import json
from typing import Optional

import typer
from gpuslice.console import stdout_console
from rich.table import Table

from gpuslice.node import devices as discovery
from gpuslice.spec import Device, human_bytes


def devices_table(devices: list[Device], title: str) -> Table:
    """A rich table with one row per device (MIG instances indented below their card)."""
    table = Table(title=title)
    for column in ("#", "UUID", "name", "memory", "SMs", "NUMA", "NVLink peers", "MIG", "compute mode"):
        table.add_column(column, justify="right" if column in ("#", "memory", "SMs", "NUMA") else "left")
    for d in devices:
        numa = "-" if d.numa_node is None else str(d.numa_node)
        mig = "on" if d.mig_enabled else "off"
        table.add_row(str(d.index), d.uuid, d.name, human_bytes(d.memory_total), str(d.sm_count or "?"),
                      numa, str(len(d.nvlink_peers)), mig, d.compute_mode)
        for m in d.mig_instances:
            table.add_row("", f"  └ {m.uuid}", m.profile, human_bytes(m.memory_total), str(m.sm_count), "", "", "", "")
    return table


def devices(
    as_json: bool = typer.Option(False, "--json", help="Print a snapshot document (loadable with --snapshot)."),
    snapshot: Optional[str] = typer.Option(
        None, "--snapshot", help="Read a snapshot file or bundled name instead of NVML "
        f"(bundled: {', '.join(discovery.bundled_snapshots())})."),
) -> None:
    """List the GPUs of this node: UUID, memory, SMs, NUMA, NVLink, MIG, compute mode."""
    found = discovery.load_snapshot(snapshot) if snapshot else discovery.discover()
    source = f"snapshot {snapshot}" if snapshot else "NVML"
    if as_json:
        typer.echo(json.dumps(discovery.snapshot_json(found, source), indent=1))
        return
    stdout_console().print(devices_table(found, f"GPUs ({source})"))


def register(app: typer.Typer) -> None:
    app.command("devices")(devices)
