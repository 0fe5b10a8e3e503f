"""Live resize of local grants: the ledger's check (placement's rules, usage), the slice file rewritten
atomically with a new generation, no over-commit under concurrent resizes and grants (a real race between
processes), eviction, the socket API (status/metrics show the new limits at once) and the CLI verb."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstatekit import write_record
from nodekit import gpuslice
from regionfile import DeviceRecord, ProcRecord, write_region
from squatter import KINDS, take_name

from gpuslice.enforcer.policy import folder_name, read_policies
from gpuslice.enforcer.slicefile import read_slice_file
from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.local.ledger import Ledger, recorded_pids
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord
from gpuslice.placement import NoFit
from gpuslice.spec import ComputeMode, GiB, Priority, Request, Resize, SpecError, parse_memory

DEVICES = load_snapshot("h100-80gb")
GPU0 = DEVICES[0].uuid


def ask(memory: str, compute: int = 0, devices: tuple[str, ...] = (GPU0,), pid: int | None = None) -> Ask:
    pid = os.getpid() if pid is None else pid
    return Ask(request=Request(memory=parse_memory(memory), compute=compute), owner="t", holder_pid=pid,
               holder_start=procs.start_time(pid), devices=devices)


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1", region_pids=recorded_pids)


def grant(ledger: Ledger, memory: str, compute: int = 0) -> GrantRecord:
    g = ledger.acquire(ask(memory, compute))
    assert isinstance(g, GrantRecord)
    return g


def test_raise_and_lower_rewrite_the_slice_file_with_a_new_generation(ledger):
    g = grant(ledger, "4GiB", compute=30)
    folder_before = os.stat(Path(g.slice_file).parent)
    done = ledger.resize(g.grant_id, Resize(memory=parse_memory("8GiB"), compute=40, priority=Priority.HIGH,
                                            mode=ComputeMode.SOFT))
    assert done.evicted == () and done.record.generation == 1
    s = done.record.slices[0]
    assert (s.memory_limit, s.compute, s.priority, s.mode) == (8 * GiB, 40, Priority.HIGH, ComputeMode.SOFT)
    cfg = read_slice_file(g.slice_file)
    assert (cfg.memory_limit, cfg.compute, cfg.priority, cfg.mode, cfg.generation) == (8 * GiB, 40, 0, "soft", 1)
    st = os.stat(g.slice_file)  # the same folder, a whole new file: not writable by group or others
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
    assert os.stat(Path(g.slice_file).parent).st_ino == folder_before.st_ino
    assert not [p for p in Path(g.slice_file).parent.iterdir() if p.name.startswith(".")]  # no temp file left
    assert ledger.grant(g.grant_id).slices[0].memory_limit == 8 * GiB
    assert ledger.grant(g.grant_id).request.compute == 40
    lowered = ledger.resize(g.grant_id, Resize(memory=parse_memory("2GiB")))
    assert lowered.record.generation == 2 and read_slice_file(g.slice_file).memory_limit == 2 * GiB
    half = ledger.resize(g.grant_id, Resize(memory=parse_memory("50%")))
    assert half.record.slices[0].memory_limit == DEVICES[0].memory_total // 2


def test_a_resize_that_does_not_fit_is_refused_and_changes_nothing(ledger):
    grant(ledger, "40GiB", compute=60)
    g = grant(ledger, "30GiB", compute=30)
    before = Path(g.slice_file).read_text()
    with pytest.raises(NoFit) as err:
        ledger.resize(g.grant_id, Resize(memory=parse_memory("50GiB")))
    assert "50.0 GiB on GPU 0 does not fit" in err.value.reason and "free there" in err.value.reason
    with pytest.raises(NoFit) as err:
        ledger.resize(g.grant_id, Resize(compute=50))
    assert "compute: 50% on GPU 0" in err.value.reason and "40% is free" in err.value.reason
    assert Path(g.slice_file).read_text() == before and ledger.grant(g.grant_id) == g
    ledger.resize(g.grant_id, Resize(memory=parse_memory("39GiB"), compute=40))  # exactly what is free


def test_lower_below_usage_is_refused_saying_how_much_is_in_use_unless_evict(ledger):
    g = grant(ledger, "8GiB")
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    # the slice's process carries its marker; a stranger a tenant lists in the region does not
    holder = subprocess.Popen(sleep, env={**os.environ, "GPUSLICE_SLICE": g.slice_file})
    stranger = subprocess.Popen(sleep)
    try:
        region = Path(g.region_file)
        write_region(region, [DeviceRecord(GPU0, 8 * GiB, used=6 * GiB)],
                     [ProcRecord(pid=p.pid, start_time=procs.start_time(p.pid), used={0: 3 * GiB})
                      for p in (holder, stranger)])
        with pytest.raises(NoFit) as err:
            ledger.resize(g.grant_id, Resize(memory=parse_memory("4GiB")))
        assert "4.0 GiB on GPU 0 is below the 6.0 GiB the slice's processes hold now" in err.value.reason
        assert "--evict" in err.value.reason
        assert read_slice_file(g.slice_file).memory_limit == 8 * GiB
        ledger.resize(g.grant_id, Resize(memory=parse_memory("6GiB")))  # at what is held: fine
        done = ledger.resize(g.grant_id, Resize(memory=parse_memory("4GiB"), evict=True))
        assert done.evicted == (holder.pid,) and read_slice_file(g.slice_file).memory_limit == 4 * GiB
        assert holder.wait(timeout=10) == -15  # SIGTERM
        assert stranger.poll() is None  # listed in the region, but not provably the slice's: spared
    finally:
        for p in (holder, stranger):
            p.kill()
            p.wait()


def test_resize_refuses_spatial_exclusive_and_unknown(ledger):
    whole = ledger.acquire(Ask(request=Request(exclusive=True), owner="t", holder_pid=os.getpid(),
                               holder_start=procs.start_time(os.getpid())))
    with pytest.raises(SpecError) as err:
        ledger.resize(whole.grant_id, Resize(memory=parse_memory("4GiB")))
    assert err.value.field == "exclusive"
    ledger.resize(whole.grant_id, Resize(priority=Priority.HIGH))  # priority of a whole device may change
    with pytest.raises(SpecError) as err:
        Resize()
    assert err.value.field == "resize"
    with pytest.raises(SpecError) as err:
        Resize.from_mapping({"memroy": "4GiB"})
    assert err.value.field == "memroy"


def _race_worker(state: str, barrier, results, what: str, grant_id: str, size: str, holder: int) -> None:
    ledger = Ledger(StateDir(Path(state)), DEVICES, node_name="n1")
    barrier.wait()
    try:
        if what == "grant":
            ledger.acquire(ask(size, pid=holder))
        else:
            ledger.resize(grant_id, Resize(memory=parse_memory(size)))
        results.put((what, "ok"))
    except NoFit:
        results.put((what, "nofit"))


def test_concurrent_resizes_and_grants_never_over_commit(tmp_path):
    """Two 30 GiB slices on an 80 GB card (79.6 GiB); four processes at once grow one to 45 GiB, the other to
    46 GiB, or add a 15 or a 16 GiB slice: any one of them fits, no two do. Exactly one wins each round, and
    the books hold."""
    state = tmp_path / "state"
    ledger = Ledger(StateDir(state), DEVICES, node_name="n1")
    ctx = multiprocessing.get_context("fork")
    for _ in range(3):
        for g in ledger.grants():
            ledger.release(g.grant_id)
        a, b = grant(ledger, "30GiB"), grant(ledger, "30GiB")
        jobs = [("resize", a.grant_id, "45GiB"), ("resize", b.grant_id, "46GiB"), ("grant", "", "15GiB"),
                ("grant", "", "16GiB")]
        barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
        workers = [ctx.Process(target=_race_worker, args=(str(state), barrier, results, *job, os.getpid()))
                   for job in jobs]
        for w in workers:
            w.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for w in workers:
            w.join(timeout=60)
        assert sum(1 for _, o in outcomes if o == "ok") == 1, outcomes
        on_gpu0 = [s.memory_limit for g in ledger.grants() for s in g.slices if s.device_uuid == GPU0]
        assert sum(on_gpu0) in (75 * GiB, 76 * GiB) and sum(on_gpu0) <= DEVICES[0].memory_total
        ledger.node_state()  # the node's books build: DeviceState refuses any over-commit


def test_socket_api_resize_shows_at_once(agent):
    with agent.client() as http:
        body = {"request": {"memory": "4GiB", "compute": 30}, "owner": "t", "holder_pid": os.getpid(),
                "holder_start": procs.start_time(os.getpid())}
        g = http.post("/v1/grants", json=body).json()
        reply = http.post(f"/v1/grants/{g['grant']}/resize", json={"memory": "12GiB", "compute": 50})
        assert reply.status_code == 200, reply.text
        assert reply.json()["generation"] == 1 and reply.json()["evicted"] == []
        slices = [s for s in http.get("/v1/status").json()["slices"] if s["grant_id"] == g["grant"]]
        assert slices[0]["memory_limit"] == 12 * GiB and slices[0]["compute_set"] == 50, slices
        limits = [s.samples[0].value for s in text_string_to_metric_families(httpx.get(agent.url + "metrics",
                  timeout=10).text) if s.name == "gpuslice_slice_memory_limit_bytes"]
        assert limits == [12 * GiB]
        nofit = http.post(f"/v1/grants/{g['grant']}/resize", json={"memory": "90GiB"})
        assert nofit.status_code == 409 and "does not fit" in nofit.json()["message"]
        bad = http.post(f"/v1/grants/{g['grant']}/resize", json={"compute": 130})
        assert bad.status_code == 400 and bad.json()["field"] == "compute"
        empty = http.post(f"/v1/grants/{g['grant']}/resize", json={})
        assert empty.status_code == 400 and empty.json()["field"] == "resize"
        missing = http.post("/v1/grants/g-00000000/resize", json={"memory": "1GiB"})
        assert missing.status_code == 404
        assert read_slice_file(g["slice_file"]).memory_limit == 12 * GiB


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = gpuslice(*args, env=env)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_cli_resize(state_env):
    ledger = Ledger(StateDir.default(), DEVICES, node_name="n1")
    g = grant(ledger, "4GiB")
    out = cli("resize", g.grant_id, "--memory", "6GiB", "--priority", "high", env=state_env)
    assert out.returncode == 0, out.stderr
    assert f"resized {g.grant_id} (generation 1)" in out.stdout and "memory 6.0 GiB" in out.stdout
    assert "priority high" in out.stdout
    too_big = cli("resize", g.grant_id, "--memory", "90GiB", env=state_env)
    assert too_big.returncode == 1 and "does not fit" in too_big.stderr
    nothing = cli("resize", g.grant_id, env=state_env)
    assert nothing.returncode == 2 and "at least one of --memory" in nothing.stderr


def test_the_ledger_writes_again_a_grant_missing_from_the_roster(ledger):
    """A grant the ledger holds but the roster lacks (granted before the roster existed, its file removed) would count
    for nothing in its neighbours' allocation: the agent reconciles at start and after each reclaim pass. A grant
    the ledger lost whose processes still run keeps its entry."""
    g = grant(ledger, "4GiB", compute=30)
    entry = ledger.state.device_state / folder_name(GPU0) / g.grant_id
    entry.unlink()
    done = ledger.reconcile_rosters()
    assert done.written == (g.grant_id,) and read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 30
    assert ledger.reconcile_rosters().written == ()
    # an entry of no grant of the ledger's, older than the grace, is taken off
    from gpuslice.enforcer.policy import write_policies
    from gpuslice.spec.model import Slice
    write_policies(ledger.state.device_state, "g-ended", (Slice(GPU0, 1 << 30, compute=20),))
    assert ledger.reconcile_rosters().gone == ()  # written just now: may be a grant this read predates
    assert ledger.reconcile_rosters(older_than=0).gone == ("g-ended",)
    assert list(read_policies(ledger.state.device_state, GPU0)) == [g.grant_id]


def test_the_reconcile_keeps_and_rewrites_the_entry_of_a_grant_whose_row_no_longer_decodes(ledger):
    """A damaged ledger row keeps its slices reserved (ledgercheck); its roster entry must not go either, however old,
    or the running slice would count as unlisted (share 0, low priority) in every neighbour's allocation."""
    import sqlite3
    import time as _time

    g = grant(ledger, "4GiB", compute=30)
    entry = ledger.state.device_state / folder_name(GPU0) / g.grant_id
    old = _time.time() - 600
    os.utime(entry, (old, old))
    record = json.loads(sqlite3.connect(ledger.state.ledger).execute(
        "SELECT record FROM grants WHERE id = ?", (g.grant_id,)).fetchone()[0])
    del record["owner"]  # damaged, but its slices still read
    with sqlite3.connect(ledger.state.ledger) as db:
        db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record), g.grant_id))
    entry.unlink()
    done = ledger.reconcile_rosters(older_than=0)
    assert done.gone == () and done.written == (g.grant_id,)  # written again from the slices that still read
    assert read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 30
    with sqlite3.connect(ledger.state.ledger) as db:
        db.execute("UPDATE grants SET record = '{not json' WHERE id = ?", (g.grant_id,))
    assert ledger.reconcile_rosters(older_than=0).gone == ()  # unreadable slices: kept as it is
    assert g.grant_id in read_policies(ledger.state.device_state, GPU0)


def test_a_new_share_mode_and_priority_reach_the_devices_roster(ledger):
    """A live resize goes through root's roster beside the slice records (``gpuslice.enforcer.policy``), where the
    device's running pacers read every slice's policy (within 100 ms: native tests/test_pacer.c pins that)."""
    g = grant(ledger, "4GiB", compute=30)
    roster = read_policies(ledger.state.device_state, GPU0)
    assert (roster[g.grant_id].compute, roster[g.grant_id].mode, roster[g.grant_id].priority) == (30, "hard", 1)
    done = ledger.resize(g.grant_id, Resize(compute=45))
    assert done.live_share == (GPU0,) and done.to_json()["live_share"] == [GPU0]
    assert read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 45
    done = ledger.resize(g.grant_id, Resize(priority=Priority.HIGH, mode=ComputeMode.SOFT))
    rec = read_policies(ledger.state.device_state, GPU0)[g.grant_id]
    assert done.live_share == (GPU0,) and (rec.compute, rec.mode, rec.priority) == (45, "soft", 0)
    # a share of 100 % means "not paced", which only a process start decides: no running pacer takes it live
    assert ledger.resize(g.grant_id, Resize(compute=100)).live_share == ()
    assert read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 100
    ledger.release(g.grant_id)
    assert g.grant_id not in read_policies(ledger.state.device_state, GPU0)


def test_a_resize_never_writes_the_slices_record_file(ledger):
    """The slice's tenant writes its record file; root writes only its roster (issue 15): a resize keeps the file
    as the slice's processes left it (same bytes, same inode: they map it)."""
    g = grant(ledger, "4GiB", compute=30)
    dev = write_record(ledger.state.device_state, GPU0, g.grant_id, pids=(os.getpid(),))
    before = (dev.read_bytes(), os.stat(dev).st_ino)
    assert ledger.resize(g.grant_id, Resize(compute=45)).live_share == (GPU0,)
    assert (dev.read_bytes(), os.stat(dev).st_ino) == before


@pytest.mark.parametrize("taken", KINDS)
def test_a_name_taken_in_place_of_the_roster_is_moved_aside_never_followed(ledger, tmp_path, taken):
    """The device-state folder is sticky and world-writable: a tenant may take the roster's name first. Root never
    follows or writes into what it finds there; it moves it aside and makes its own folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = ledger.state.device_state / folder_name(GPU0)
    take_name(name, elsewhere, taken)
    g = grant(ledger, "4GiB", compute=30)
    assert name.is_dir() and not name.is_symlink() and stat.S_IMODE(name.stat().st_mode) == 0o755
    assert list(elsewhere.iterdir()) == []
    assert read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 30
    assert [p.name for p in ledger.state.device_state.iterdir() if p.name.startswith(f".{name.name}.refused-")]


def test_a_slice_with_no_process_yet_finds_its_new_share_in_the_slice_file_and_the_roster(ledger):
    g = grant(ledger, "4GiB", compute=30)
    done = ledger.resize(g.grant_id, Resize(compute=45))
    assert done.live_share == (GPU0,) and read_slice_file(g.slice_file).compute == 45
    assert read_policies(ledger.state.device_state, GPU0)[g.grant_id].compute == 45
