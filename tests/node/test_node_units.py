"""Small pieces of local mode: records, device resolution, enforcer lookup, state dir, monitor, history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from regionfile import DeviceRecord, ProcRecord, write_region

from gpuslice.node import enforcer, paths, procs
from gpuslice.node.devices import load_snapshot
from gpuslice.node.errors import EnforcerNotFound
from gpuslice.node.history import History
from gpuslice.node.launcher import child_environment, resolve_devices, shell_code
from gpuslice.node.monitor import Monitor, view_from_json
from gpuslice.node.records import Ask, GrantRecord, request_from_json, request_to_json
from gpuslice.node.region_usage import read_grant_usage
from gpuslice.spec import GiB, MiB, Priority, Request, Slice, SpecError, parse_memory

DEVICES = load_snapshot("h100-80gb")


def grant(tmp_path: Path, memory=4 * GiB, compute=30, created=None) -> GrantRecord:
    return GrantRecord(grant_id="g-1", owner="bob", slices=(Slice(DEVICES[0].uuid, memory, compute),),
                       request=Request(memory=parse_memory(memory), compute=compute), created=created or time.time(),
                       holder_pid=os.getpid(), holder_start=procs.start_time(os.getpid()),
                       slice_file=str(tmp_path / "slice"), region_file=str(tmp_path / "region"))


def test_records_round_trip(tmp_path):
    r = Request(count=2, memory=parse_memory("50%"), compute=20, priority=Priority.HIGH)
    assert request_from_json(json.loads(json.dumps(request_to_json(r)))) == r
    a = Ask(r, "me", 12, 34, uid=1000, devices=("GPU-x",), command="python x.py", policy="spread")
    assert Ask.from_json(json.loads(json.dumps(a.to_json()))) == a
    g = grant(tmp_path)
    assert GrantRecord.from_json(json.loads(json.dumps(g.to_json()))) == g


def test_ask_refuses_missing_fields():
    with pytest.raises(SpecError, match="holder_pid"):
        Ask.from_json({"owner": "x", "holder_start": 1, "request": {}})
    with pytest.raises(SpecError, match="compute"):
        Ask.from_json({"owner": "x", "holder_pid": 1, "holder_start": 1, "request": {"compute": 130}})


def test_resolve_devices_by_index_and_uuid():
    assert resolve_devices("1,0", DEVICES) == (DEVICES[1].uuid, DEVICES[0].uuid)
    assert resolve_devices(DEVICES[3].uuid, DEVICES) == (DEVICES[3].uuid,)
    assert resolve_devices(None, DEVICES) == ()
    with pytest.raises(SpecError) as err:
        resolve_devices("8", DEVICES)
    assert err.value.field == "device" and "0, 1" in err.value.allowed


def test_child_environment_prepends_the_enforcer(tmp_path):
    env = child_environment(grant(tmp_path), "/lib/libgpuslice.so", {"LD_PRELOAD": "/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == "/lib/libgpuslice.so /other.so"
    assert env["CUDA_VISIBLE_DEVICES"] == DEVICES[0].uuid and env["GPUSLICE_SLICE"] == str(tmp_path / "slice")


def test_shell_codes():
    assert shell_code(3) == 3 and shell_code(-15) == 143 and shell_code(-9) == 137


def test_enforcer_lookup(tmp_path, monkeypatch):
    lib = tmp_path / "libgpuslice.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(lib))
    assert enforcer.find_enforcer() == lib
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(EnforcerNotFound, match="names no file"):
        enforcer.find_enforcer()
    monkeypatch.delenv("GPUSLICE_ENFORCER_LIB")
    monkeypatch.setattr(enforcer, "candidates", lambda: [tmp_path / "nowhere.so"])
    with pytest.raises(EnforcerNotFound, match="make -C native"):
        enforcer.find_enforcer()


def test_state_dir_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "s"))
    assert paths.default_state_dir() == tmp_path / "s"
    monkeypatch.delenv("GPUSLICE_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert paths.default_state_dir() == Path("/var/lib/gpuslice")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert paths.default_state_dir() == tmp_path / "xdg" / "gpuslice"


def test_region_usage_and_refusal_of_unknown_versions(tmp_path):
    g = grant(tmp_path)
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
    g = grant(tmp_path, created=100.0)
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
    g = grant(tmp_path)
    monitor, history = Monitor(DEVICES, "n"), History(points=3)
    for t in range(5):
        history.add(monitor.sample([g], now=1000.0 + t))
    data = history.to_json()
    assert data["t"] == [1002.0, 1003.0, 1004.0] and data["slices"]["g-1/0"]["t"] == [1002.0, 1003.0, 1004.0]
    assert history.to_json(since=1003.0)["t"] == [1004.0]
    for t in range(5, 9):
        history.add(monitor.sample([], now=1000.0 + t))
    assert history.to_json()["slices"] == {}


def test_ps_and_top_json(state_env):
    cli = [sys.executable, "-m", "gpuslice.cli"]
    ps = subprocess.run([*cli, "ps"], env=state_env, capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0 and "NVIDIA H100" in ps.stdout and "slices" in ps.stdout
    top = subprocess.run([*cli, "top", "--json", "--count", "2", "--interval", "0.1"], env=state_env,
                         capture_output=True, text=True, timeout=60)
    lines = [json.loads(x) for x in top.stdout.splitlines()]
    assert len(lines) == 2 and len(lines[0]["devices"]) == 8
    live = subprocess.run([*cli, "top", "--count", "2", "--interval", "0.1"], env=state_env, capture_output=True,
                          text=True, timeout=60)
    assert live.returncode == 0 and "slices" in live.stdout and "NVIDIA H100" in live.stdout
    bad = subprocess.run([*cli, "top", "--interval", "0"], env=state_env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--interval" in bad.stderr  # a usage error, like every bad option value


def _device_state(path: Path, uuid: str, grant_id: str, achieved_bp: int, busy_ns: int, throttled_ns: int) -> None:
    from gpuslice.node import compute

    buf = bytearray(compute.FILE_SIZE)
    compute._HEADER.pack_into(buf, 0, compute.MAGIC, compute.VERSION, compute.FILE_SIZE, compute.MAX_SLICES,
                              compute.MAX_PROCS, compute.SLICE_OFF, compute.SLICE_SIZE, compute.PROC_OFF,
                              compute.PROC_SIZE, 0, 0, 7, uuid.encode())
    compute._SLICE.pack_into(buf, compute.SLICE_OFF, 1, 3000, 0, 1, 1, 1, 3000, grant_id.encode(), 0, 0, 0,
                             busy_ns, throttled_ns, 99, 0, 0, 0, achieved_bp, 500, 0)
    path.write_bytes(bytes(buf))


def test_monitor_takes_achieved_share_and_throttling_from_the_pacer(tmp_path):
    g = grant(tmp_path)
    states = tmp_path / "devices"
    states.mkdir()
    _device_state(states / f"{DEVICES[0].uuid}.dev", DEVICES[0].uuid, g.grant_id, 2950, 4 * 10**9, 7 * 10**9)
    monitor = Monitor(DEVICES, "n", device_state_dir=states)
    view = monitor.sample([g], now=time.time())
    s = view.slices[0]
    assert s.compute_achieved == pytest.approx(29.5) and s.throttled_seconds == pytest.approx(7.0)
    assert view.devices[0].compute_achieved == pytest.approx(29.5)
    _device_state(states / f"{DEVICES[0].uuid}.dev", DEVICES[0].uuid, g.grant_id, -1, 4 * 10**9, 7 * 10**9)
    assert monitor.sample([g]).slices[0].compute_achieved is not None  # no window yet: busy-time rate (0 here)
    (states / f"{DEVICES[0].uuid}.dev").write_bytes(b"\0" * 300)
    assert "not a gpuslice device state" in monitor.sample([g]).errors[0]


def test_busy_time_rate_is_smoothed_over_a_window(tmp_path):
    """Sampled 5×/s while the busy counter moves in 0.2-s steps every other sample (50 % on average), the
    achieved share stays near 50 % instead of jumping between 0 and 100 %."""
    g = grant(tmp_path)
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

    from gpuslice.node.records import Waiter
    from gpuslice.node.tables import view_renderable

    whole = GrantRecord(grant_id="g-w", owner="bob", slices=(Slice(DEVICES[1].uuid, DEVICES[1].memory_total, 0),),
                        request=Request(count=1, exclusive=True), created=time.time(), holder_pid=os.getpid(),
                        holder_start=procs.start_time(os.getpid()), exclusive=True,
                        slice_file=str(tmp_path / "s"), region_file=str(tmp_path / "r"))
    waiter = Waiter(7, 1, 1000.0, os.getpid(), 0, "ann", Request(count=2, memory=parse_memory("4GiB")),
                    devices=(DEVICES[2].uuid, DEVICES[3].uuid))
    view = Monitor(DEVICES, "n").sample([whole, grant(tmp_path)], [waiter], now=1065.0)
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


def test_private_ledger_warning_only_where_users_can_over_commit_each_other(monkeypatch, tmp_path):
    import pwd

    from gpuslice.node import service
    from gpuslice.node.client import AgentClient

    def account(name, uid, shell="/bin/bash"):
        return pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", shell))

    accounts = [account("root", 0), account("me", 1000), account("alice", 1001), account("svc", 1002, "/usr/sbin/nologin"),
                account("nobody", 65534)]
    monkeypatch.setattr(pwd, "getpwall", lambda: accounts)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("GPUSLICE_STATE_DIR", raising=False)
    state = paths.StateDir(tmp_path / "s")
    ledger = object()
    line = service.private_ledger_warning(ledger, state)
    assert line is not None and "alice" in line and "svc" not in line and str(state.ledger) in line
    assert "gpuslice agent" in line and "\n" not in line
    assert service.private_ledger_warning(AgentClient.__new__(AgentClient), state) is None  # an agent: one ledger
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "chosen"))
    assert service.private_ledger_warning(ledger, state) is None  # a dir the user chose (maybe shared)
    monkeypatch.delenv("GPUSLICE_STATE_DIR")
    accounts[:] = [account("root", 0), account("me", 1000)]
    assert service.private_ledger_warning(ledger, state) is None  # a one-person machine
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert service.private_ledger_warning(ledger, state) is None  # root: the system ledger
