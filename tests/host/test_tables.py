"""Tables fit the terminal at 80, 100 and 200 columns: nothing printed past the edge, no value cut (`90.…`,
`g-a…`), the least useful columns left out first and named in the caption, every column and value with
--wide, and the same through the `ps` and `devices` verbs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from gpuslice.host.commands import devices_table
from gpuslice.host.console import Column, choose, fit_table, print_table, short_names, short_uuid
from gpuslice.host.devices import load_snapshot
from gpuslice.host.monitor import Monitor
from gpuslice.host.tables import view_renderable
from gpuslice.host.usage import Watched
from gpuslice.local.records import Waiter
from gpuslice.spec import GiB, Grant, Request, Slice, parse_memory

DEVICES = load_snapshot("h100-80gb")
WIDTHS = (80, 100, 200)


def _view(tmp_path: Path):
    grants = [Watched(Grant(f"g-{k:08x}", (Slice(DEVICES[k % 2].uuid, (4 + 8 * k) * GiB, 30),)), owner="alice",
                      region_file=str(tmp_path / f"r{k}"), created=time.time() - 65 * k,
                      command="python train.py --config configs/a-rather-long-experiment-name.yaml --epochs 90")
              for k in range(3)]
    waiter = Waiter(7, 1, time.time() - 30, os.getpid(), 0, "bob", Request(count=2, memory=parse_memory("4GiB")),
                    devices=(DEVICES[2].uuid, DEVICES[3].uuid))
    return Monitor(DEVICES, "node-a").sample(grants, [waiter])


def _render(renderable, width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    print_table(console, renderable, wide)
    return console.export_text()


@pytest.mark.parametrize("width", WIDTHS)
def test_ps_view_fits_and_cuts_no_value(tmp_path: Path, width: int) -> None:
    text = _render(view_renderable(_view(tmp_path)), width)
    assert max(len(line) for line in text.splitlines()) <= width
    for k in range(3):
        assert f"g-{k:08x}" in text  # grant ids whole
        assert f"{4 + 8 * k:.1f} GiB" in text  # limits whole
    assert "79.6 GiB" in text or width < 100  # device totals go only when the terminal is narrow
    assert not re.search(r"\d…", text)  # no number cut (only a long command is shortened, with …)
    if width == 200:
        assert "not shown" not in text and "throttled" in text and "pids" in text
    else:
        assert "not shown at this width:" in text and "--wide shows all" in text


def test_columns_leave_in_their_order_of_value(tmp_path: Path) -> None:
    """At 80 columns the slice table keeps grant, gpu, memory used, limit, compute, set; pids go first."""
    text = _render(view_renderable(_view(tmp_path)), 80)
    slices = text[re.search(r"^slices", text, re.M).start():re.search(r"^waiting", text, re.M).start()]
    for kept in ("grant", "gpu", "used", "limit", "compute", "set"):
        assert kept in slices, kept
    assert "pids" not in slices.split("not shown")[0] and "pids" in slices.split("not shown")[1]


def test_wide_shows_every_column_and_the_whole_command_at_80(tmp_path: Path) -> None:
    text = _render(view_renderable(_view(tmp_path), wide=True), 80, wide=True)
    assert "not shown" not in text and "pids" in text and "throttled" in text
    assert "a-rather-long-experiment-name.yaml --epochs 90" in text
    assert max(len(line) for line in text.splitlines()) > 80  # past the terminal's edge, on purpose


@pytest.mark.parametrize("width", WIDTHS)
def test_devices_table_shortens_uuids_before_leaving_anything_out(width: int) -> None:
    table = devices_table(DEVICES, "GPUs", width=width)
    text = _render(table, width)
    assert max(len(line) for line in text.splitlines()) <= width
    if width == 200:
        assert all(d.uuid in text for d in DEVICES)
    else:
        assert all(short_uuid(d.uuid) in text for d in DEVICES)
        assert short_uuid(DEVICES[0].uuid) == DEVICES[0].uuid[:12] + "…"
    assert all(f"│ {d.index} │" in text for d in DEVICES) and text.count("79.6 GiB") == len(DEVICES)


def test_ps_top_and_devices_verbs_follow_the_terminal_width(tmp_path: Path) -> None:
    env = {**os.environ, "GPUSLICE_DEVICE_SNAPSHOT": "h100-80gb", "GPUSLICE_STATE_DIR": str(tmp_path / "s")}
    for width in WIDTHS:
        for verb in (["ps"], ["devices"], ["top", "--count", "1"]):
            out = subprocess.run([sys.executable, "-m", "gpuslice.cli", *verb], capture_output=True, text=True,
                                 env={**env, "COLUMNS": str(width)}, timeout=60).stdout
            assert out and max(len(line) for line in out.splitlines()) <= width, (verb, width)
    wide = subprocess.run([sys.executable, "-m", "gpuslice.cli", "devices", "--wide"], capture_output=True,
                          text=True, env={**env, "COLUMNS": "80"}, timeout=60).stdout
    assert all(d.uuid in wide for d in DEVICES)


def test_fit_table_drops_highest_keep_first_and_never_keep_zero() -> None:
    columns = [Column("id", ["a" * 30], keep=0), Column("x", ["b" * 30], keep=2), Column("y", ["c" * 30], keep=1)]
    kept, _ = choose(columns, 70)
    assert [c.header for c in kept] == ["id", "y"]
    kept, _ = choose(columns, 10)
    assert [c.header for c in kept] == ["id"]  # too narrow even for it: it stays, rich wraps the edge
    assert "not shown at this width: x, y" in _render(fit_table(columns, 40), 40).replace("\n", " ")


def test_short_names_drop_the_shared_prefix() -> None:
    assert short_names(["openb_pod_list_default", "openb_pod_list_gpushare40"]) == ["default", "gpushare40"]
    assert short_names(["openb_pod_list_default"]) == ["openb_pod_list_default"]


def test_a_tenants_text_is_shown_as_written_and_nothing_more(tmp_path: Path) -> None:
    """A command line and an owner are anyone's to write: one with ``[/x]`` (rich markup) made ``ps`` and ``top``
    fail for every user, and one with ESC sequences cleared and rewrote the screen of whoever ran them (helper
    41). Both show as written, the control characters as escapes, at any width and with --wide."""
    evil = "train.py [/x] [bold]big[/bold] \x1b[2J\x1b]0;owned\x07 \x9b"
    grants = [Watched(Grant("g-0000000e", (Slice(DEVICES[0].uuid, 4 * GiB, 30),)), owner="eve[/]",
                      region_file=str(tmp_path / "r"), created=time.time(), command=evil)]
    waiter = Waiter(7, 1, time.time(), os.getpid(), 0, "mallory[/x]", Request(count=1, memory=parse_memory("4GiB")))
    view = Monitor(DEVICES, "node-a").sample(grants, [waiter])
    from dataclasses import replace  # a daemon's log line (the tenant's to write) reaches the problem lines too

    view = replace(view, errors=(*view.errors, "MPS daemon of GPU-x: died: \x1b]0;owned\x1b[2J\x1b[31mFAKE"))
    for width, wide in ((80, False), (200, True)):
        console = Console(width=width, record=True, file=open(os.devnull, "w"), force_terminal=True)
        print_table(console, view_renderable(view, wide), wide)
        raw = console.export_text(styles=True)
        assert "\x1b[2J" not in raw and "\x07" not in raw and "\x9b" not in raw
    text = _render(view_renderable(view, True), 250, wide=True)
    assert r"train.py [/x] [bold]big[/bold] \x1b[2J\x1b]0;owned\x07 \x9b" in text
    assert "eve[/]" in text and "mallory[/x]" in text and r"died: \x1b]0;owned\x1b[2J\x1b[31mFAKE" in text
