"""The node monitor over watched grants: region usage, rates, the pacer's state, history, tables."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from devstatekit import write_record
from regionfile import DeviceRecord, ProcRecord, write_region

from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.host.history import History
from gpuslice.host.monitor import Monitor, view_from_json
from gpuslice.host.usage import Watched, read_grant_usage
from gpuslice.spec import GiB, Grant, MiB, Request, Slice, parse_memory

DEVICES = load_snapshot("h100-80gb")


def watched(tmp_path: Path, memory=4 * GiB, compute=30, created=None) -> Watched:
    return Watched(Grant("g-1", (Slice(DEVICES[0].uuid, memory, compute),)), owner="bob",
                   region_file=str(tmp_path / "region"), created=created or time.time())


def test_region_usage_and_refusal_of_unknown_versions(tmp_path):
    g = watched(tmp_path)
    assert read_grant_usage(g).readable is False  # no GPU process yet: nothing used
    me = ProcRecord(os.getpid(), procs.start_time(os.getpid()), used={0: 300 * MiB}, throttled_ns={0: 10**9})
    write_region(Path(g.region_file), [DeviceRecord(DEVICES[0].uuid, 4 * GiB, used=300 * MiB, oom_refusals=2)], [me])
    usage = read_grant_usage(g)
    s = usage.slices[DEVICES[0].uuid]
    assert (s.used, s.oom_refusals, s.throttled_ns, usage.pids) == (300 * MiB, 2, 10**9, (os.getpid(),))
    data = bytearray(Path(g.region_file).read_bytes())
    data[8] = 9  # version 9
    Path(g.region_file).write_bytes(bytes(data))
    assert "version 9" in read_grant_usage(g).error


def test_monitor_view_and_json_round_trip(tmp_path):
    g = watched(tmp_path, created=100.0)
    me = ProcRecord(os.getpid(), procs.start_time(os.getpid()), used={0: GiB}, busy_ns={0: 0})
    write_region(Path(g.region_file), [DeviceRecord(DEVICES[0].uuid, 4 * GiB, used=GiB)], [me])
    monitor = Monitor(DEVICES, "n")
    first = monitor.sample([g], now=110.0)
    assert first.slices[0].compute_achieved is None and first.slices[0].age_seconds == 10.0
    me.busy_ns[0] = 500_000_000
    write_region(Path(g.region_file), [DeviceRecord(DEVICES[0].uuid, 4 * GiB, used=GiB)], [me])
    second = monitor.sample([g], now=112.0)
    assert second.slices[0].compute_achieved == pytest.approx(25.0)
    d0 = second.devices[0]
    assert (d0.memory_used, d0.memory_granted, d0.compute_granted, d0.slices) == (GiB, 4 * GiB, 30, 1)
    assert view_from_json(json.loads(json.dumps(second.to_json()))) == second


def test_history_keeps_the_last_points_and_drops_gone_slices(tmp_path):
    g = watched(tmp_path)
    monitor, history = Monitor(DEVICES, "n"), History(points=3)
    for t in range(5):
        history.add(monitor.sample([g], now=1000.0 + t))
    data = history.to_json()
    assert data["t"] == [1002.0, 1003.0, 1004.0] and data["slices"]["g-1/0"]["t"] == [1002.0, 1003.0, 1004.0]
    assert history.to_json(since=1003.0)["t"] == [1004.0]
    for t in range(5, 9):
        history.add(monitor.sample([], now=1000.0 + t))
    assert history.to_json()["slices"] == {}


def test_monitor_takes_achieved_share_and_throttling_from_the_pacer(tmp_path):
    """The slice's record file (``<stem>.slices/<grant>``) gives the achieved share and throttled time; with no
    window yet the busy-time rate stands in; a file its tenant spoiled is named among the errors, and an empty one
    (no process joined yet) is no error."""
    g = watched(tmp_path)
    states = tmp_path / "devices"
    kw = {"busy_ns": 4 * 10**9, "throttled_ns": 7 * 10**9, "throttled_bp": 500, "launches": 99}
    path = write_record(states, DEVICES[0].uuid, g.grant.grant_id, achieved_bp=2950, **kw)
    write_record(states, DEVICES[0].uuid, "g-neighbour", achieved_bp=1000)
    monitor = Monitor(DEVICES, "n", device_state_dir=states)
    view = monitor.sample([g], now=time.time())
    s = view.slices[0]
    assert s.compute_achieved == pytest.approx(29.5) and s.throttled_seconds == pytest.approx(7.0)
    assert view.devices[0].compute_achieved == pytest.approx(29.5) and view.errors == ()
    write_record(states, DEVICES[0].uuid, g.grant.grant_id, achieved_bp=-1, **kw)
    assert monitor.sample([g]).slices[0].compute_achieved is not None  # no window yet: busy-time rate (0 here)
    path.write_bytes(b"")
    assert monitor.sample([g]).errors == ()
    path.write_bytes(b"\0" * 300)
    (error,) = monitor.sample([g]).errors
    assert str(path) in error and "not a gpuslice slice record" in error


def test_busy_time_rate_is_smoothed_over_a_window(tmp_path):
    """Sampled 5×/s while the busy counter moves in 0.2-s steps every other sample (50 % on average), the
    achieved share stays near 50 % instead of jumping between 0 and 100 %."""
    g = watched(tmp_path)
    me = ProcRecord(os.getpid(), procs.start_time(os.getpid()), used={0: GiB}, busy_ns={0: 0})
    monitor = Monitor(DEVICES, "n")
    seen = []
    for k in range(40):
        me.busy_ns[0] = (k // 2) * 200_000_000  # +0.2 s of busy time every 0.4 s
        write_region(Path(g.region_file), [DeviceRecord(DEVICES[0].uuid, 4 * GiB, used=GiB)], [me])
        seen.append(monitor.sample([g], now=1000.0 + 0.2 * k).slices[0].compute_achieved)
    assert seen[0] is None
    steady = seen[12:]  # after the first 2-s window
    assert all(40.0 <= v <= 60.0 for v in steady), steady
    me.busy_ns[0] = 0  # a new region: the counter starts again, no negative rate
    write_region(Path(g.region_file), [DeviceRecord(DEVICES[0].uuid, 4 * GiB, used=GiB)], [me])
    assert monitor.sample([g], now=1010.0).slices[0].compute_achieved is None


def test_whole_devices_show_as_held_and_queue_shows_place_age_devices(tmp_path):
    from rich.console import Console

    from gpuslice.local.records import Waiter
    from gpuslice.host.tables import view_renderable

    whole = Watched(Grant("g-w", (Slice(DEVICES[1].uuid, DEVICES[1].memory_total, 0),), exclusive=True), owner="bob",
                    region_file=str(tmp_path / "r"), created=time.time())
    waiter = Waiter(7, 1, 1000.0, os.getpid(), 0, "ann", Request(count=2, memory=parse_memory("4GiB")),
                    devices=(DEVICES[2].uuid, DEVICES[3].uuid))
    view = Monitor(DEVICES, "n").sample([whole, watched(tmp_path)], [waiter], now=1065.0)
    assert view.devices[1].held_whole and view.devices[1].compute_granted == 100
    assert not view.devices[0].held_whole and view.devices[0].compute_granted == 30
    (w,) = view.to_json()["waiters"]
    assert (w["position"], w["age_seconds"], w["device_indexes"]) == (1, 65.0, [2, 3])
    console = Console(record=True, width=250)
    console.print(view_renderable(view))
    text = console.export_text()
    assert "100% (whole)" in text and "│ whole │" in text
    row = next(line for line in text.splitlines() if "ann" in line)
    assert "1m05s" in row and "2,3" in row and "2 × 4GiB (distinct devices), compute unpaced" in row
