"""The engine left to gpuslice (``gpuslice run`` without ``--engine``; ``"engine": "auto"`` in a socket API
request): issue 13's pair — a server and a trainer given only priorities — gets the spatial engine where the node
has MPS (the time-sliced yield path cost that trainer most of its time on the H100), anything else the time-sliced
one; either takes the other engine where only that one fits (a device runs one engine at a time), and the default
never fails where the time-sliced engine would serve: a node without MPS, or a daemon that cannot start, grants it
time-sliced. A named engine keeps its refusals. The MPS daemon is the stand-in (tests/support/mps_standin.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.host import procs
from gpuslice.host.mpsfleet import MpsDaemons
from gpuslice.local.ledger import Ledger
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord, auto_request
from gpuslice.placement import NoFit
from gpuslice.spec import Engine, GpusliceError, SpecError
from mpskit import failing_control, install_standin, mps_processes, short_root
from nodekit import AgentProcess, gpuslice
from gpuslice.host.devices import load_snapshot

DEVICES = load_snapshot("h100-80gb")
GPU0, GPU1 = DEVICES[0].uuid, DEVICES[1].uuid


@pytest.fixture
def root():
    yield from short_root("gsauto-")


@pytest.fixture
def ledger(root: Path) -> Ledger:
    state = StateDir(root / "s")
    return Ledger(state, DEVICES, node_name="n1", mps=MpsDaemons(state.mps, install_standin(root / "bin"),
                                                                 start_timeout=10))


def auto(devices: tuple[str, ...] = (), **fields) -> Ask:
    """An ask as `gpuslice run` builds it without --engine: the preferred engine, engine_auto set."""
    return Ask(request=auto_request({"memory": "4GiB", **fields}), owner="t", holder_pid=os.getpid(),
               holder_start=procs.start_time(os.getpid()), devices=devices, engine_auto=True)


@pytest.mark.parametrize("fields,engine", [
    ({"priority": "high"}, Engine.SPATIAL),
    ({"priority": "low"}, Engine.SPATIAL),  # the trainer of the pair
    ({}, Engine.TIMESLICE),  # no priority named: exact, paced shares as before
    ({"priority": "high", "compute": 30}, Engine.TIMESLICE),  # a share of its own: the paced engine's meaning
    ({"priority": "high", "count": 2}, Engine.TIMESLICE),  # a spatial slice covers one device
    ({"priority": "high", "exclusive": True}, Engine.TIMESLICE),
    ({"priority": "low", "colocation": "shared"}, Engine.TIMESLICE),
    ({"priority": "low", "colocation": "tidal"}, Engine.TIMESLICE),  # tidal needs the paced engine
    ({"priority": "high", "engine": "timeslice"}, Engine.SPATIAL),  # any engine among the fields is not read
])
def test_the_preferred_engine_follows_the_request(fields: dict, engine: Engine) -> None:
    assert auto_request({"memory": "4GiB", **fields}).engine is engine


def test_the_pair_given_only_priorities_shares_one_device_through_mps(ledger: Ledger, root: Path) -> None:
    server = ledger.acquire(auto(priority="high"))
    trainer = ledger.acquire(auto(priority="low"))
    assert isinstance(server, GrantRecord) and isinstance(trainer, GrantRecord)
    assert server.slices[0].engine is trainer.slices[0].engine is Engine.SPATIAL
    assert server.uuids == trainer.uuids and server.mps_pipe_dir == trainer.mps_pipe_dir != ""
    assert len(mps_processes(root)) == 1
    # a slice that names no priority prefers time-slicing: elsewhere where it can, on the pair's device as an
    # MPS client where only that device is allowed (the engine it runs)
    plain = ledger.acquire(auto())
    assert plain.slices[0].engine is Engine.TIMESLICE and plain.uuids != server.uuids
    joined = ledger.acquire(auto(devices=server.uuids))
    assert joined.slices[0].engine is Engine.SPATIAL and joined.uuids == server.uuids
    # and the other way round: a priority slice on a time-sliced device joins its engine
    beside = ledger.acquire(auto(devices=plain.uuids, priority="high"))
    assert beside.slices[0].engine is Engine.TIMESLICE and beside.mps_pipe_dir == ""
    # a named engine is kept: refused where the device runs the other one
    with pytest.raises(NoFit, match="devices with room run spatial slices"):
        ledger.acquire(Ask(request=auto_request({"memory": "4GiB"}), owner="t", holder_pid=os.getpid(),
                           holder_start=procs.start_time(os.getpid()), devices=server.uuids))
    for g in (server, trainer, plain, joined, beside):
        ledger.release(g.grant_id)
    assert mps_processes(root) == []


def test_without_mps_or_with_a_daemon_that_cannot_start_the_default_is_time_sliced(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLICE_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(root))
    bare = Ledger(StateDir(root / "bare"), DEVICES)
    got = bare.acquire(auto(priority="high"))
    assert got.slices[0].engine is Engine.TIMESLICE and got.request.engine is Engine.TIMESLICE
    named = Ask(request=got.request.__class__(engine=Engine.SPATIAL), owner="t", holder_pid=os.getpid(),
                holder_start=procs.start_time(os.getpid()))
    with pytest.raises(SpecError) as info:  # a named spatial engine is still refused, saying why
        bare.acquire(named)
    assert info.value.field == "engine" and "no nvidia-cuda-mps-control" in info.value.allowed

    state = StateDir(root / "s")
    broken = Ledger(state, DEVICES, mps=MpsDaemons(state.mps, failing_control(root / "bad", "device busy"),
                                                   start_timeout=2))
    got = broken.acquire(auto(priority="high"))
    assert got.slices[0].engine is Engine.TIMESLICE and got.mps_pipe_dir == ""
    assert [g.grant_id for g in broken.grants()] == [got.grant_id]  # the failed spatial try left nothing
    with pytest.raises(GpusliceError, match="engine spatial: .*device busy"):
        broken.acquire(named)


@pytest.fixture
def env(root: Path, enforcer_lib: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUSLICE_STATE_DIR=str(root / "s"), GPUSLICE_DEVICE_SNAPSHOT="h100-80gb", GPUSLICE_KILL_GRACE="2",
               GPUSLICE_MPS_CONTROL=str(install_standin(root / "bin")), GPUSLICE_ENFORCER_LIB=str(enforcer_lib),
               COLUMNS="200",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def test_run_without_engine_gives_a_priority_slice_its_mps_client_settings(env: dict[str, str], root: Path) -> None:
    """Issue 13's story as a new user types it: `gpuslice run --priority low -- train.py` is an MPS client, below
    normal; without --priority the command is not one (time-sliced, as before)."""
    show = 'env | grep ^CUDA_MPS_ | sort'
    proc = gpuslice("run", "--priority", "low", "--memory", "1GiB", "--", "sh", "-c", show, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "CUDA_MPS_CLIENT_PRIORITY=1" in out.splitlines() and "CUDA_MPS_PIPE_DIRECTORY=" in out
    assert "(spatial, MPS, below-normal client)" in err
    proc = gpuslice("run", "--memory", "1GiB", "--", "sh", "-c", show, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "" and "spatial" not in err
    proc = gpuslice("run", "--engine", "turbo", "--memory", "1GiB", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "auto (the default) or timeslice or spatial" in " ".join(err.split())
    assert mps_processes(root) == []


def test_the_socket_api_takes_engine_auto(env: dict[str, str], root: Path) -> None:
    """``"engine": "auto"`` through the agent chooses as `gpuslice run` does; a request without "engine" stays
    time-sliced (the wire's default, unchanged)."""
    agent = AgentProcess(env)
    try:
        who = {"owner": "alice", "holder_pid": os.getpid(), "holder_start": procs.start_time(os.getpid())}
        with agent.client() as http:
            reply = http.post("/v1/grants", json={"request": {"memory": "4GiB", "priority": "high", "engine": "auto"},
                                                  **who})
            assert reply.status_code == 201, reply.text
            spatial = reply.json()
            assert spatial["slices"][0]["engine"] == "spatial" and spatial["mps_pipe_dir"].endswith("/pipe")
            reply = http.post("/v1/grants", json={"request": {"memory": "4GiB", "priority": "high"}, **who})
            assert reply.status_code == 201, reply.text
            assert reply.json()["slices"][0].get("engine", "timeslice") == "timeslice"
            bad = http.post("/v1/grants", json={"request": {"memory": "4GiB", "engine": "auto", "count": 0}, **who})
            assert bad.status_code == 400 and bad.json()["field"] == "count"
            for g in (spatial, reply.json()):
                assert http.delete(f"/v1/grants/{g['grant']}").json() == {"released": True}
        assert mps_processes(root) == []
    finally:
        agent.stop()
