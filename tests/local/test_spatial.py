"""Spatial slices in local mode: the ledger owns one MPS control daemon per device — started with the first
spatial grant on it (inside the grant's transaction), stopped with the last — and leaves no daemon and no
pipe directory behind after any ending: a release, a reclaimed grant, a killed launcher, a killed agent.
The daemon is the stand-in control daemon (tests/support/mps_standin.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslice.enforcer.policy import folder_name, read_policies
from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.host.mps import YIELD_THREADS
from gpuslice.host.mpsfleet import MpsDaemons
from gpuslice.local.ledger import Ledger
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord
from gpuslice.placement import NoFit
from gpuslice.spec import Engine, GpusliceError, Request, SpecError, parse_memory
from mpskit import failing_control, install_standin, mps_processes, short_root
from nodekit import AgentProcess, gpuslice
from tenantkit import write_double_snapshot

REPO = Path(__file__).resolve().parents[2]

DEVICES = load_snapshot("h100-80gb")
GPU0, GPU1 = DEVICES[0].uuid, DEVICES[1].uuid


def wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(0.05)


def ask(memory: str = "4GiB", compute: int = 25, engine: Engine = Engine.SPATIAL, pid: int | None = None,
        devices: tuple[str, ...] = (GPU0,)) -> Ask:
    pid = os.getpid() if pid is None else pid
    return Ask(request=Request(memory=parse_memory(memory), compute=compute, engine=engine), owner="t",
               holder_pid=pid, holder_start=procs.start_time(pid), devices=devices)


@pytest.fixture
def root():
    yield from short_root("gsloc-")


@pytest.fixture
def standin(root: Path) -> Path:
    return install_standin(root / "bin")


@pytest.fixture
def ledger(root: Path, standin: Path) -> Ledger:
    state = StateDir(root / "s")
    return Ledger(state, DEVICES, node_name="n1", mps=MpsDaemons(state.mps, standin, start_timeout=10))


def daemon_devices(ledger: Ledger) -> list[str]:
    return sorted(s.device for s in ledger.mps.status() if s.pid is not None)


def test_first_spatial_grant_starts_the_daemon_and_the_last_release_stops_it(ledger: Ledger, root: Path) -> None:
    first = ledger.acquire(ask())
    assert isinstance(first, GrantRecord) and first.slices[0].engine is Engine.SPATIAL
    assert daemon_devices(ledger) == [GPU0]
    pipe = Path(first.mps_pipe_dir)
    assert pipe.is_dir() and (pipe / "nvidia-cuda-mps-control.pid").exists()
    text = Path(first.slice_file).read_text()
    assert "engine=spatial" in text and f"mps_pipe_dir={pipe}" in text and "compute=25" in text
    second = ledger.acquire(ask("8GiB"))
    assert second.mps_pipe_dir == first.mps_pipe_dir and len(mps_processes(root)) == 1  # one daemon per device
    ledger.release(first.grant_id)
    assert daemon_devices(ledger) == [GPU0]  # the second slice still uses it
    ledger.release(second.grant_id)
    assert daemon_devices(ledger) == [] and mps_processes(root) == [] and not pipe.exists()


def test_the_roster_names_a_spatial_grants_daemon(ledger: Ledger, root: Path) -> None:
    """A spatial grant's roster entry names its MPS daemon (its pipe directory): the enforcer caps a yielding
    process only beside a high-priority slice of the same daemon (another user's daemon is time-sliced against
    its own anyway). The ledger's periodic reconcile writes the same entry, and writes it again when lost."""
    grant = ledger.acquire(ask())
    uuid = grant.slices[0].device_uuid
    entry = read_policies(ledger.state.device_state, uuid)[grant.grant_id]
    assert entry.engine == "spatial" and entry.mps_pipe_dir == grant.mps_pipe_dir != ""
    assert ledger.reconcile_rosters(older_than=0).written == ()
    (ledger.state.device_state / folder_name(uuid) / grant.grant_id).unlink()
    assert ledger.reconcile_rosters(older_than=0).written == (grant.grant_id,)
    assert read_policies(ledger.state.device_state, uuid)[grant.grant_id].mps_pipe_dir == grant.mps_pipe_dir
    ledger.release(grant.grant_id)


def test_engines_keep_to_their_devices(ledger: Ledger) -> None:
    spatial = ledger.acquire(ask(devices=()))
    timeslice = ledger.acquire(ask(engine=Engine.TIMESLICE, devices=()))
    assert spatial.uuids != timeslice.uuids and timeslice.mps_pipe_dir == ""
    assert "engine" not in Path(timeslice.slice_file).read_text()
    with pytest.raises(NoFit, match="devices with room run spatial slices"):
        ledger.acquire(ask(engine=Engine.TIMESLICE, devices=spatial.uuids))
    assert daemon_devices(ledger) == list(spatial.uuids)
    for g in (spatial, timeslice):
        ledger.release(g.grant_id)


def test_a_daemon_that_cannot_start_refuses_the_grant_leaving_nothing(root: Path) -> None:
    bad = failing_control(root / "bad", "device busy")
    state = StateDir(root / "s")
    ledger = Ledger(state, DEVICES, mps=MpsDaemons(state.mps, bad, start_timeout=2))
    with pytest.raises(GpusliceError, match="engine spatial: .*device busy"):
        ledger.acquire(ask())
    assert ledger.grants() == [] and list(state.grants.iterdir()) == []
    ledger.acquire(ask(engine=Engine.TIMESLICE))  # the device is not held by the failed grant


def test_spatial_is_refused_on_a_node_without_mps(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLICE_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(root))
    ledger = Ledger(StateDir(root / "s"), DEVICES)
    with pytest.raises(SpecError) as info:
        ledger.acquire(ask())
    assert info.value.field == "engine" and "no nvidia-cuda-mps-control" in info.value.allowed


def test_a_reclaimed_grant_takes_its_daemon_with_it(ledger: Ledger, root: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ledger.acquire(ask(pid=holder.pid))
        assert daemon_devices(ledger) == [GPU0]
    finally:
        holder.kill()
        holder.wait()
    ledger.reclaim()
    assert ledger.grants() == [] and mps_processes(root) == [] and ledger.mps.known() == {}


def test_a_daemon_that_died_under_a_live_grant_is_started_again(ledger: Ledger, root: Path) -> None:
    grant = ledger.acquire(ask())
    ctl = ledger.mps.control(ledger.mps.known()[next(iter(ledger.mps.known()))])
    old = ctl.pid()
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not procs.alive(old, 0), what="the daemon gone")
    ledger.reclaim()
    assert ctl.pid() not in (None, old)
    ledger.release(grant.grant_id)
    assert mps_processes(root) == []


def test_a_fault_is_shown_and_the_daemon_restarted_only_once_its_clients_are_gone(root: Path, standin: Path) -> None:
    clients: list[int] = []
    state = StateDir(root / "s")
    ledger = Ledger(state, DEVICES, mps=MpsDaemons(state.mps, standin, start_timeout=10),
                    region_pids=lambda g: list(clients))
    grant = ledger.acquire(ask())
    key = next(iter(ledger.mps.known().values()))
    ctl = ledger.mps.control(key)
    first = ctl.pid()
    clients.append(os.getpid())  # a live process of the slice: a client of the faulted server
    ctl.query("standin_fault")
    from gpuslice.host.monitor import Monitor

    view = Monitor(DEVICES, "n1", mps=ledger.mps).sample([grant.watched()])
    assert view.slices[0].engine == "spatial" and view.slices[0].mps == "fault"
    assert view.slices[0].compute_achieved is None  # not paced: nothing measured, not a false 0 %
    assert any("MPS daemon of" in e and "fatal GPU exception" in e for e in view.errors)
    ledger.reclaim()
    assert ctl.pid() == first  # a client is still attached: not restarted under it
    clients.clear()
    ledger.reclaim()
    assert ctl.pid() not in (None, first) and [s.state for s in ledger.mps.status()] == ["running"]
    # the restart stays visible after the fresh daemon runs: ps's MPS table and the metrics say so
    from gpuslice.host.metrics import exposition
    from gpuslice.host.tables import mps_table
    from prometheus_client.parser import text_string_to_metric_families
    from rich.console import Console

    view = Monitor(DEVICES, "n1", mps=ledger.mps).sample([grant.watched()])
    [daemon] = view.mps
    assert daemon["state"] == "running" and daemon["restarts"] == 1 and daemon["last_restart"]["reason"] == "fault"
    console = Console(record=True, width=200)
    console.print(mps_table(view))
    text = console.export_text()
    assert "1 (fault," in text and "before the restart:" in text  # the line itself is cut to 80 characters
    fams = {f.name: f.samples for f in text_string_to_metric_families(exposition(lambda: view).decode())}
    assert [s.value for s in fams["gpuslice_mps_daemon_restarts"]] == [1]
    assert [s.value for s in fams["gpuslice_mps_faults"]] == [1] and view.mps_faults == 1
    assert any("restarted after a fault" in e and "encountered" in e for e in view.errors)
    ledger.release(grant.grant_id)


# ------------------------------------------------------------------------------------------ whole processes
@pytest.fixture
def env(root: Path, standin: Path, enforcer_lib: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUSLICE_STATE_DIR=str(root / "s"), GPUSLICE_DEVICE_SNAPSHOT="h100-80gb", GPUSLICE_KILL_GRACE="2",
               GPUSLICE_MPS_CONTROL=str(standin), GPUSLICE_ENFORCER_LIB=str(enforcer_lib), COLUMNS="200",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


SHOW = 'env | grep ^CUDA_ | sort; cat "$GPUSLICE_SLICE"'


def test_run_engine_spatial_gives_the_command_its_mps_client_settings(env: dict[str, str], root: Path) -> None:
    proc = gpuslice("run", "--engine", "spatial", "--memory", "4GiB", "--compute", "25", "--", "sh", "-c", SHOW,
                    env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    pipe = next(line.split("=", 1)[1] for line in lines if line.startswith("CUDA_MPS_PIPE_DIRECTORY="))
    assert pipe.startswith(str(root / "s" / "mps")) and pipe.endswith("/pipe")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in lines and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in lines
    assert "engine=spatial" in lines and f"mps_pipe_dir={pipe}" in lines
    assert "compute 25% of the SMs (spatial, MPS, below-normal client)" in err  # low priority, the default
    assert "CUDA_MPS_CLIENT_PRIORITY=1" in lines  # MPS runs normal clients' work first
    assert mps_processes(root) == [] and not Path(pipe).exists()  # stopped with its only slice


def test_run_refuses_a_spatial_request_of_two_devices(env: dict[str, str]) -> None:
    proc = gpuslice("run", "--engine", "spatial", "--gpus", "2", "--memory", "1GiB", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "'--engine'" in err and "more than one device" in " ".join(err.split())


def _spatial_run(env: dict[str, str], marker: Path, *opts: str) -> subprocess.Popen:
    """A spatial `gpuslice run` whose command says it started (``<marker>.started``: the grant was answered),
    then waits until ``marker`` exists."""
    run = gpuslice("run", "--engine", "spatial", "--memory", "2GiB", *(opts or ("--compute", "30")), "--", "sh", "-c",
                   f'touch "{marker}.started"; while [ ! -e "{marker}" ]; do sleep 0.05; done', env=env)
    wait_for(lambda: Path(f"{marker}.started").exists() or run.poll() is not None, what="the command started")
    assert run.poll() is None, run.communicate()[1]
    return run


@pytest.fixture(scope="module")
def probe() -> Path:
    """native/tests/helpers/slice_probe (built with ``make -C native all``; a failed build fails the test)."""
    done = subprocess.run(["make", "-C", str(REPO / "native"), "all"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return REPO / "native" / "build" / "helpers" / "slice_probe"


def test_a_yielding_spatial_process_started_beside_a_high_priority_slice_gets_the_yield_cap(
        env: dict[str, str], root: Path, probe: Path) -> None:
    """A low-priority spatial process with no compute share of its own keeps every SM when it starts alone, and
    gets GS_MPS_YIELD_THREADS (60 % of the SMs) as its MPS active-thread percentage when it starts while a
    high-priority preemptive spatial slice holds the device: the node side's roster says so, the enforcer reads it
    before the driver starts (issue 13: MPS's priority preempts no running block). An explicit --compute 100 asks
    for every SM and gets it."""
    env = dict(env, GPUSLICE_DEVICE_SNAPSHOT=str(write_double_snapshot(root / "double.json")),
               LD_LIBRARY_PATH=str(probe.parents[1] / "double"), GSDOUBLE_NOBACK="1")

    def threads(*opts: str) -> str:
        proc = gpuslice("run", "--engine", "spatial", "--memory", "1GiB", *opts, "--", str(probe), env=env,
                        stdin=subprocess.PIPE)
        out, err = proc.communicate("init\nenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\n", timeout=60)
        assert proc.returncode == 0, err
        if not opts:  # the grant line says what the enforcer decides at each process's start
            assert "compute: every SM, 60% beside a high-priority slice (spatial, MPS, below-normal client)" in err
        return next(line for line in out.splitlines() if line.startswith("env ")).split(" ", 1)[1]

    assert threads() == "(unset)"  # alone
    server = _spatial_run(env, root / "done", "--priority", "high")
    try:
        assert threads() == str(YIELD_THREADS) == "60"
        assert threads("--compute", "100") == "(unset)"
        assert threads("--compute", "80") == "80"
        assert threads("--colocation", "shared") == "(unset)"  # a low slice that does not yield
    finally:
        (root / "done").touch()
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert threads() == "(unset)"  # the server gone: every SM again


def test_the_spatial_yield_gate_runs_the_pacer_only_when_asked(env: dict[str, str], root: Path, probe: Path) -> None:
    """A spatial process joins its device's slice records (the pacer, for the yield gate only: never paced to its
    share) only when its environment asks with GPUSLICE_SPATIAL_YIELD=1; without it, as before, no record is
    joined (native/include/gpuslice/mps.h: the gate's drain records cost a server 1-2 ms a request on the H200,
    so it is opt-in). Whole path: `gpuslice run` grants the slice, the preloaded enforcer reads the slice file."""
    from gpuslice.enforcer.devstate import read_device_state

    env = dict(env, GPUSLICE_DEVICE_SNAPSHOT=str(write_double_snapshot(root / "double.json")),
               LD_LIBRARY_PATH=str(probe.parents[1] / "double"), GSDOUBLE_NOBACK="1")

    def joined(ask: str | None) -> list[tuple[str, bool, str]]:
        e = {k: v for k, v in env.items() if k != "GPUSLICE_SPATIAL_YIELD"}
        if ask is not None:
            e["GPUSLICE_SPATIAL_YIELD"] = ask
        proc = gpuslice("run", "--engine", "spatial", "--memory", "1GiB", "--compute", "30", "--", str(probe), env=e,
                        stdin=subprocess.PIPE)
        try:
            proc.stdin.write("init\nlaunch\npid\n")
            proc.stdin.flush()
            pid = None
            while pid is None:  # the probe answers each line in order: its pid comes after the launch
                line = proc.stdout.readline()
                assert line, proc.stderr.read()
                pid = int(line.split()[1]) if line.startswith("pid ") else None
            folders = list((root / "s").glob("**/*.slices"))
            return [(s.grant, s.paced, p.path) for f in folders for s in read_device_state(f).slices
                    for p in s.processes if p.pid == pid]
        finally:
            proc.stdin.close()  # the probe exits at the end of its input
            proc.wait(timeout=60)
            proc.stdout.close()
            proc.stderr.close()

    assert joined(None) == [] and joined("0") == []
    (grant, paced, path), = joined("1")
    assert grant.startswith("g-") and not paced and path == "light"  # alone: nobody to yield to, no share paced


def test_a_killed_agent_leaves_no_daemon_once_the_slice_ends(env: dict[str, str], root: Path) -> None:
    """The agent dies with a spatial slice running; when the slice ends its launcher releases the grant in
    the ledger file itself, and the daemon goes with it — no new agent needed."""
    agent = AgentProcess(env)
    marker = root / "done"
    run = _spatial_run(env, marker)
    try:
        assert mps_processes(root)  # started through the agent with the grant
        agent.proc.kill()
        agent.proc.wait()
        marker.touch()
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        assert "released grant" in err and "in its ledger file" in err
        assert mps_processes(root) == [] and not list((root / "s" / "mps").glob("*/pipe"))
    finally:
        run.kill()
        agent.stop()


def test_a_killed_agent_and_launcher_leave_no_daemon_after_the_next_agent_starts(env: dict[str, str],
                                                                                 root: Path) -> None:
    """Everything of the node side is SIGKILLed while a spatial slice runs: the daemon outlives them (MPS
    daemonizes). The next agent reclaims the dead grant and stops the daemon, stale pipes and all."""
    agent = AgentProcess(env)
    run = _spatial_run(env, root / "never")
    try:
        assert mps_processes(root)  # started with the grant
        agent.proc.kill()
        agent.proc.wait()
        run.kill()  # its command gets SIGTERM (PDEATHSIG) and ends
        run.wait()
        assert mps_processes(root)  # the orphan, until someone reconciles
        agent = AgentProcess(env)
        wait_for(lambda: not mps_processes(root) and not list((root / "s" / "mps").glob("*/pipe")),
                 what="the next agent stopping the orphaned daemon and removing its pipe directory")
    finally:
        run.kill()
        agent.stop()


def test_the_socket_api_grants_spatial_slices_and_shows_their_daemon(env: dict[str, str], root: Path) -> None:
    """``"engine": "spatial"`` in a request through the agent: the grant carries its pipe directory, the
    node view and the metrics show the engine and the daemon; the release stops the daemon."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    agent = AgentProcess(env)
    try:
        body = {"request": {"memory": "4GiB", "compute": 25, "engine": "spatial"}, "owner": "alice",
                "holder_pid": os.getpid(), "holder_start": procs.start_time(os.getpid())}
        with agent.client() as http:
            reply = http.post("/v1/grants", json=body)
            assert reply.status_code == 201, reply.text
            grant = reply.json()
            assert grant["slices"][0]["engine"] == "spatial" and grant["mps_pipe_dir"].endswith("/pipe")
            assert mps_processes(root)
            bad = http.post("/v1/grants", json={**body, "request": {**body["request"], "engine": "turbo"}})
            assert bad.status_code == 400 and bad.json()["field"] == "engine"

            def shown() -> bool:
                view = http.get("/v1/status").json()
                return bool(view["mps"]) and view["slices"] and view["slices"][0]["mps"] == "running"
            wait_for(shown, what="the daemon in the node view")
            view = http.get("/v1/status").json()
            assert view["slices"][0]["engine"] == "spatial" and view["slices"][0]["compute_achieved"] is None
            text = httpx.get(agent.url + "metrics", timeout=10).text
            fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
            assert [s.labels["state"] for s in fams["gpuslice_mps_daemon"]] == ["running"]
            assert [s.labels["engine"] for s in fams["gpuslice_slice_info"]] == ["spatial"]
            assert http.delete(f"/v1/grants/{grant['grant']}").json() == {"released": True}
            assert mps_processes(root) == []
    finally:
        agent.stop()


def test_a_failing_mps_pass_fails_no_grant_or_release(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPS pass runs inside every grant, release and reclaim transaction; whatever it raises (helper 41: a
    RecursionError from a tenant's deep tree) is kept as the daemons' problem for ps, and the ledger's own change
    stands."""
    first = ledger.acquire(ask())
    assert isinstance(first, GrantRecord)

    def broken(*a, **k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(ledger.mps, "reconcile", broken)
    second = ledger.acquire(ask("8GiB"))
    assert isinstance(second, GrantRecord)
    assert any("RecursionError" in p for p in ledger.mps_problems.values())
    ledger.release(second.grant_id)
    assert [g.grant_id for g in ledger.grants()] == [first.grant_id]
    monkeypatch.undo()
    ledger.release(first.grant_id)
    assert daemon_devices(ledger) == []
