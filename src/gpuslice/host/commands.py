"""``gpuslice devices``: the device table of this node (NVML) or of a snapshot."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuslice.host.cliargs import named_file
from gpuslice.host.console import PIPE_WIDTH, Column, fit_table, print_table, short_uuid, stdout_console
from gpuslice.host import devices as discovery
from gpuslice.spec import Device, human_bytes


def devices_table(devices: list[Device], title: str, unreadable: tuple[discovery.Unreadable, ...] = (),
                  caption: str | None = None, width: int = PIPE_WIDTH, wide: bool = False) -> Table:
    """A table with one row per device (MIG instances indented below their card), fitted to ``width``:
    UUIDs shorten to their first eight hex digits before anything is left out (--wide: all, in full);
    GPUs NVML could not read get a row that says so."""
    rows: list[tuple[int, list[list[str]]]] = []
    for d in devices:
        numa = "-" if d.numa_node is None else str(d.numa_node)
        mig = "on" if d.mig_enabled else "off"
        block = [[str(d.index), d.uuid, d.name, human_bytes(d.memory_total), str(d.sm_count or "?"),
                  numa, str(len(d.nvlink_peers)) if d.nvlink_peers else "-", mig, d.compute_mode]]
        for m in d.mig_instances:
            block.append(["", f"└ {m.uuid}", m.profile, human_bytes(m.memory_total), str(m.sm_count or "?"),
                          "", "", "", ""])
        rows.append((d.index, block))
    for u in unreadable:
        rows.append((u.index, [[str(u.index), u.uuid or "-", f"[red]unreadable: {escape(u.error)}[/red]",
                                "", "", "", "", "", ""]]))
    table_rows = [row for _, block in sorted(rows, key=lambda r: r[0]) for row in block]
    spec = [("#", 0, "right", False), ("UUID", 0, "left", False), ("name", 2, "left", True),
            ("memory", 0, "right", False), ("SMs", 4, "right", False), ("NUMA", 5, "right", False),
            ("NVLink\npeers", 6, "right", False), ("MIG", 3, "left", False), ("compute\nmode", 7, "left", False)]
    columns = [Column(h, [r[k] for r in table_rows], keep=keep, justify=justify, wrap=wrap)
               for k, (h, keep, justify, wrap) in enumerate(spec)]
    columns[1].short = [_short_uuid_cell(v) for v in columns[1].values]
    return fit_table(columns, width, wide=wide, title=title, caption=caption)


def _short_uuid_cell(text: str) -> str:
    prefix = "└ " if text.startswith("└ ") else ""
    return prefix + short_uuid(text[len(prefix):])


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
        None, "--snapshot", metavar="NAME|FILE", help="Read a snapshot file or bundled name instead of NVML "
        f"(bundled: {', '.join(discovery.bundled_snapshots())})."),
    wide: bool = typer.Option(False, "--wide", help="Every column and whole UUIDs, even past the terminal's width."),
) -> None:
    """List the GPUs of this node: UUID, memory, SMs, NUMA, NVLink, MIG, compute mode."""
    with named_file("--snapshot"):
        report = discovery.load_snapshot_report(snapshot) if snapshot else discovery.discover_report()
    if as_json:
        typer.echo(json.dumps(discovery.report_json(report), indent=1))
    else:
        console = stdout_console()
        width = 10_000 if wide else console.width
        print_table(console, devices_table(list(report.devices), _title(report), report.unreadable, _caption(report),
                                           width, wide), wide)
    err = Console(stderr=True)
    for u in report.unreadable:
        err.print(f"[yellow]warning:[/yellow] {escape(u.line())} — left out of placement", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("devices")(devices)
