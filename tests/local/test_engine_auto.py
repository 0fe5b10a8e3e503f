"""The engine left to gpuslice (``gpuslice run`` without ``--engine``; ``"engine": "auto"`` in a socket API
request): issue 13's pair — a server and a trainer given only priorities — gets the spatial engine where the node
has MPS (the time-sliced yield path cost that trainer most of its time on the H100), anything else the time-sliced
one; either takes the other engine where only that one fits (a device runs one engine at a time), and the default
never fails where the time-sliced engine would serve: a node without MPS, or a daemon that cannot start, grants it
time-sliced. A named engine keeps its refusals. The MPS daemon is the stand-in (tests/support/mps_standin.py)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuslice.host import procs
from gpuslice.host.mps import MpsError
from gpuslice.host.mpsfleet import MpsDaemons
from gpuslice.local.ledger import Ledger, daemon_keys
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord, Queued, auto_request
from gpuslice.placement import NoFit
from gpuslice.spec import Engine, GpusliceError, Priority, Request, SpecError, parse_memory
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


def root_ledger(root: Path, why: str) -> Ledger:
    """A ledger as root keeps it: each user's daemon runs as that user (the stand-in and its interpreter are
    ones they may run); ``why`` the test needs root for (skipped without it)."""
    from tenantkit import tenant_python

    if os.geteuid() != 0:
        pytest.skip(f"{why}: needs root")
    root.chmod(0o755)
    state = StateDir(root / "s")
    return Ledger(state, DEVICES, node_name="n1",
                  mps=MpsDaemons(state.mps, install_standin(root / "bin", tenant_python()), start_timeout=10))


def auto(devices: tuple[str, ...] = (), uid: int = -1, **fields) -> Ask:
    """An ask as `gpuslice run` builds it without --engine: the preferred engine, engine_auto set."""
    return Ask(request=auto_request({"memory": "4GiB", **fields}), owner="t", holder_pid=os.getpid(),
               holder_start=procs.start_time(os.getpid()), devices=devices, engine_auto=True, uid=uid)


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


def test_the_default_never_joins_another_users_mps_daemon(root: Path) -> None:
    """MPS serves each user apart: another user's spatial slice on the device is time-sliced against this user's
    daemon with no priority between them. A default ask is spatial only where no other user's spatial slice is,
    and does not join one by the other-engine rule either (that user's high-priority server would be disturbed
    as by plain time-slicing); a named --engine spatial still may."""
    ledger = root_ledger(root, "daemons of two users")
    alice = ledger.acquire(auto(devices=(GPU0,), uid=1001, priority="high"))
    assert alice.slices[0].engine is Engine.SPATIAL
    for fields in ({"priority": "low"}, {}):  # bob's trainer, bob's plain job: both refused on alice's device
        with pytest.raises(NoFit, match="spatial"):
            ledger.acquire(auto(devices=(GPU0,), uid=1002, **fields))
    server = ledger.acquire(auto(uid=1002, priority="high"))  # anywhere: a device of bob's own
    trainer = ledger.acquire(auto(uid=1002, priority="low"))  # ... beside his own server
    assert server.slices[0].engine is trainer.slices[0].engine is Engine.SPATIAL
    assert trainer.uuids == server.uuids != alice.uuids and len(mps_processes(root)) == 2
    own = ledger.acquire(auto(devices=(GPU0,), uid=1001))  # alice's own plain job joins her daemon
    assert own.slices[0].engine is Engine.SPATIAL and own.mps_pipe_dir == alice.mps_pipe_dir
    named = Ask(request=Request(memory=parse_memory("4GiB"), engine=Engine.SPATIAL), owner="bob", holder_pid=os.getpid(), holder_start=procs.start_time(os.getpid()), devices=(GPU0,),
                uid=1002)
    assert ledger.acquire(named).uuids == alice.uuids  # named: bob's choice, as before
    for g in ledger.grants():
        ledger.release(g.grant_id)
    assert mps_processes(root) == []


def test_a_root_callers_ask_without_uid_gets_its_holders_daemon(root: Path) -> None:
    """A root caller of the socket API may leave the uid out: the grant is then its holder's real user's, and so
    is the MPS daemon its processes are clients of. The grant used to record the pipe folder of root's own
    daemon while every later pass kept the holder's user's (a client of another user's daemon, which MPS
    refuses; root's daemon stopped at the next pass as one no grant needs)."""
    import subprocess

    ledger = root_ledger(root, "a daemon run as another user")
    holder = subprocess.Popen(["sleep", "600"], user=65534, group=65534)
    try:
        ask = Ask(request=auto_request({"memory": "4GiB", "priority": "high"}), owner="root-for-nobody",
                  holder_pid=holder.pid, holder_start=procs.start_time(holder.pid), engine_auto=True)
        grant = ledger.acquire(ask)
        assert isinstance(grant, GrantRecord) and grant.uid == 65534 and grant.slices[0].engine is Engine.SPATIAL
        kept = ledger.mps.pipe_dir(daemon_keys(grant.slices, grant.uid)[0])
        assert grant.mps_pipe_dir == str(kept) and "-65534" in kept.parent.name
        ledger.reclaim()  # a pass (reconciles the daemons): the daemon the grant names is the one kept
        (daemon,) = mps_processes(root)
        assert procs.real_uid(daemon) == 65534
        ledger.release(grant.grant_id)
        assert mps_processes(root) == []
    finally:
        holder.kill()
        holder.wait()


def test_an_ask_without_uid_whose_holder_is_gone_is_refused(ledger: Ledger) -> None:
    """A root caller's ask without a uid belongs to its holder's user, read from the pid; the pid is read with its
    start time, so that a holder gone before the read, its pid taken by another user's process, does not make the
    grant (its files, its MPS daemon) that user's (helper 47): it is refused, naming the field, nothing kept."""
    me = procs.start_time(os.getpid())
    ask = Ask(request=auto_request({"memory": "4GiB", "priority": "high"}), owner="root-for-gone",
              holder_pid=os.getpid(), holder_start=me + 1, engine_auto=True)  # another process had the pid
    with pytest.raises(SpecError) as info:
        ledger.acquire(ask)
    assert info.value.field == "holder_pid" and ledger.grants() == []
    same = ledger.acquire(replace(ask, holder_start=me))
    assert same.uid == os.getuid()
    ledger.release(same.grant_id)


def test_a_low_priority_default_is_spatial_only_beside_its_users_high_priority_server(ledger: Ledger) -> None:
    """A yielding spatial process takes its SM cap from the roster when it starts: a trainer made spatial before
    its server would keep every SM (a server of short kernels read 3.6x its alone p50 beside one on the H100).
    So a low-priority default is spatial only where its user's high-priority server already is; started first,
    it is time-sliced, and the server that comes later joins its engine (the time-sliced yield path decides at
    every launch, whatever the order)."""
    trainer = ledger.acquire(auto(devices=(GPU0,), priority="low"))
    assert trainer.slices[0].engine is Engine.TIMESLICE and trainer.mps_pipe_dir == ""
    server = ledger.acquire(auto(devices=(GPU0,), priority="high"))
    assert server.slices[0].engine is Engine.TIMESLICE
    alone = ledger.acquire(auto(devices=(GPU1,), priority="low"))  # alone on a device: time-sliced, every SM
    assert alone.slices[0].engine is Engine.TIMESLICE
    for g in (trainer, server, alone):
        ledger.release(g.grant_id)
    server = ledger.acquire(auto(devices=(GPU0,), priority="high"))
    trainer = ledger.acquire(auto(priority="low"))  # beside it, wherever it is
    assert trainer.uuids == server.uuids and trainer.slices[0].engine is Engine.SPATIAL
    # the server gone, the trainer's later processes start uncapped: a new default server does not join them
    ledger.release(server.grant_id)
    with pytest.raises(NoFit, match="devices with room run spatial slices"):
        ledger.acquire(auto(devices=(GPU0,), priority="high"))
    assert ledger.acquire(auto(priority="high")).uuids != trainer.uuids  # elsewhere, where it can
    for g in ledger.grants():
        ledger.release(g.grant_id)


def test_a_default_that_does_not_fit_is_refused_for_its_real_reason(ledger: Ledger) -> None:
    """Where a low-priority default may not be spatial (no server of its own) and does not fit time-sliced either,
    the refusal is the time-sliced try's (memory), not that of a spatial try on no device at all."""
    full = Ask(request=Request(memory=parse_memory("79GiB")), owner="t", holder_pid=os.getpid(),
               holder_start=procs.start_time(os.getpid()), devices=(GPU0,))
    held = ledger.acquire(full)
    with pytest.raises(NoFit) as info:
        ledger.acquire(auto(devices=(GPU0,), priority="low"))
    assert "memory" in str(info.value) and "model" not in str(info.value), str(info.value)
    ledger.release(held.grant_id)


def test_a_refusal_offers_only_sizes_the_engine_can_take_there(ledger: Ledger) -> None:
    """A device running the other engine takes no size of this one: the refusal's "--memory N fits now" counts
    only devices the ask may take with an engine it may have (it offered 75.6GiB on the spatial pair's device to
    a job that could never join it: helper 45)."""
    server = ledger.acquire(auto(devices=(GPU0,), priority="high"))
    assert server.slices[0].engine is Engine.SPATIAL
    timeslice = Ask(request=Request(memory=parse_memory("4GiB")), owner="t", holder_pid=os.getpid(),
                    holder_start=procs.start_time(os.getpid()), devices=(GPU0,))
    with pytest.raises(NoFit) as info:  # named time-sliced: GPU 0 runs spatial slices
        ledger.acquire(timeslice)
    assert "fits now" not in str(info.value) and "spatial" in str(info.value), str(info.value)
    held = ledger.acquire(auto(devices=(GPU0,), priority="low", memory="72GiB"))  # the pair fills GPU 0
    assert held.slices[0].engine is Engine.SPATIAL
    with pytest.raises(NoFit) as info:  # an auto ask may join it: a smaller size fits there
        ledger.acquire(auto(devices=(GPU0,), priority="high"))
    assert "--memory 3.6GiB fits now" in str(info.value), str(info.value)
    offered = ledger.acquire(auto(devices=(GPU0,), priority="high", memory="3.6GiB"))  # and is granted
    for g in (offered, held, server):
        ledger.release(g.grant_id)


def test_a_refusal_offers_no_size_on_devices_the_queue_holds_back(ledger: Ledger) -> None:
    """A size offered as "fits now" is granted when asked for: none is counted on a device that a waiter ahead
    holds back (it offered GPU 1's free memory, and the retry was refused with "use --wait": helper 47)."""
    def ask(memory: str, devices: tuple[str, ...], priority: str = "low") -> Ask:
        return Ask(request=Request(memory=parse_memory(memory), priority=Priority.parse(priority)), owner="t",
                   holder_pid=os.getpid(), holder_start=procs.start_time(os.getpid()), devices=devices)

    held = [ledger.acquire(ask("76GiB", (GPU0,))), ledger.acquire(ask("60GiB", (GPU1,)))]
    waiter = ledger.acquire(ask("30GiB", (GPU1,), priority="high"), wait=True)  # GPU 1 is its, once it frees
    assert not isinstance(waiter, GrantRecord)
    with pytest.raises(NoFit) as info:
        ledger.acquire(ask("20GiB", (GPU0, GPU1)))
    text = str(info.value)
    assert "--memory 3.6GiB fits now" in text and "19.6GiB" not in text, text  # GPU 0's room, not GPU 1's
    assert "hold GPU 1 back for themselves" in text, text  # why GPU 1's free memory is not offered
    held.append(ledger.acquire(ask("3.6GiB", (GPU0, GPU1))))
    ledger.cancel(waiter.ticket)
    for g in held:
        ledger.release(g.grant_id)


def test_a_compute_share_keeps_its_engine(ledger: Ledger) -> None:
    """A share of the device's time (time-sliced) would become a share of its SMs if the default took the spatial
    engine where a device runs it: such a request keeps its engine and is refused there, saying why."""
    pair = ledger.acquire(auto(devices=(GPU0,), priority="high"))
    with pytest.raises(NoFit, match="spatial"):
        ledger.acquire(auto(devices=(GPU0,), compute=30, mode="soft"))
    ledger.release(pair.grant_id)


def test_the_wire_says_auto_and_reads_back_the_same_ask() -> None:
    """An auto ask travels as "engine": "auto" (an agent that predates it refuses it, naming the field) and reads
    back as the same ask, the priority it counted as named included."""
    for fields in ({"priority": "high"}, {"priority": "low"}, {}, {"priority": "high", "compute": 30},
                   {"priority": "low", "compute": 30}, {"count": 2, "priority": "high"}):
        ask = auto(**fields)
        wire = ask.to_json()
        assert wire["request"]["engine"] == "auto" and "engine_auto" not in wire
        assert Ask.from_json(wire) == ask, fields
    plain = Ask(request=Request(memory=parse_memory("4GiB"), priority=Priority.HIGH), owner="t", holder_pid=1,
                holder_start=0)
    assert "engine" not in plain.to_json()["request"] and Ask.from_json(plain.to_json()) == plain


def test_without_mps_or_with_a_daemon_that_cannot_start_the_default_is_time_sliced(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLICE_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(root))
    bare = Ledger(StateDir(root / "bare"), DEVICES)
    got = bare.acquire(auto(priority="high"))
    assert got.slices[0].engine is Engine.TIMESLICE and got.request.engine is Engine.TIMESLICE
    named = Ask(request=Request(memory=parse_memory("4GiB"), engine=Engine.SPATIAL), owner="t",
                holder_pid=os.getpid(), holder_start=procs.start_time(os.getpid()))
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


def test_a_grant_whose_own_files_fail_is_not_retried_time_sliced(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a daemon that cannot start sends an auto ask to the time-sliced engine: the grant's own files
    failing (a full disk) is raised as it is, nothing granted, and not reported as the spatial engine's fault
    (it was, and the ask was tried twice)."""
    import errno

    from gpuslice.local import ledger as ledger_module

    tries = []

    def full_disk(record, state):
        tries.append(record.slices[0].engine)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ledger_module, "write_grant_files", full_disk)
    with pytest.raises(OSError) as info:
        ledger.acquire(auto(priority="high"))
    assert not isinstance(info.value, GpusliceError) and info.value.errno == errno.ENOSPC
    assert tries == [Engine.SPATIAL] and ledger.grants() == []


def test_a_daemon_whose_folders_cannot_be_made_sends_the_default_time_sliced(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon that cannot start for want of its folders (an OSError, not the daemon's own MpsError) is the
    spatial engine failing, like any other: the default is granted time-sliced, nothing of the try kept."""
    import errno

    def no_folders(key):
        raise OSError(errno.EACCES, "Permission denied", str(key))

    monkeypatch.setattr(ledger.mps, "ensure", no_folders)
    got = ledger.acquire(auto(priority="high"))
    assert got.slices[0].engine is Engine.TIMESLICE and got.mps_pipe_dir == ""
    assert [g.grant_id for g in ledger.grants()] == [got.grant_id]
    ledger.release(got.grant_id)


def test_a_default_refused_after_its_daemon_failed_says_so(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """An auto ask whose daemon could not start is tried time-sliced; where that is refused too, the refusal says
    the daemon was why (it read as a plain time-sliced refusal, the daemon's error only in the agent's log)."""
    server = ledger.acquire(auto(devices=(GPU0,), priority="high"))
    assert server.slices[0].engine is Engine.SPATIAL

    def dead(key):
        raise MpsError("nvidia-cuda-mps-control: daemon not answering")

    monkeypatch.setattr(ledger.mps, "ensure", dead)
    with pytest.raises(NoFit) as info:  # spatial beside its server, but the daemon is gone; GPU 0 runs spatial
        ledger.acquire(auto(devices=(GPU0,), priority="low"))
    text = str(info.value)
    assert "spatial slices" in text and "daemon not answering, so the time-sliced engine was tried" in text, text
    queued = ledger.acquire(auto(devices=(GPU0,), priority="low"), wait=True)  # waiting: its reason says so too
    assert isinstance(queued, Queued) and "daemon not answering" in queued.reason, queued
    ledger.cancel(queued.ticket)
    monkeypatch.undo()
    ledger.release(server.grant_id)


@pytest.fixture
def env(root: Path, enforcer_lib: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUSLICE_STATE_DIR=str(root / "s"), GPUSLICE_DEVICE_SNAPSHOT="h100-80gb", GPUSLICE_KILL_GRACE="2",
               GPUSLICE_MPS_CONTROL=str(install_standin(root / "bin")), GPUSLICE_ENFORCER_LIB=str(enforcer_lib),
               COLUMNS="200",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def test_run_without_engine_gives_a_priority_slice_its_mps_client_settings(env: dict[str, str], root: Path) -> None:
    """Issue 13's story as a new user types it: `gpuslice run --priority high -- serve.py` is an MPS client, and
    `gpuslice run --priority low -- train.py` beside it one below normal; without --priority the command is not
    one (time-sliced, as before)."""
    show = 'env | grep ^CUDA_MPS_ | sort'
    done = root / "done"
    server = gpuslice("run", "--priority", "high", "--memory", "1GiB", "--", "sh", "-c",
                      f'{show}; touch "{done}.started"; while [ ! -e "{done}" ]; do sleep 0.05; done', env=env)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{done}.started").exists():
            assert server.poll() is None and time.monotonic() < deadline, server.communicate()[1]
            time.sleep(0.05)
        proc = gpuslice("run", "--priority", "low", "--memory", "1GiB", "--", "sh", "-c", show, env=env)
        out, err = proc.communicate(timeout=60)
    finally:
        done.touch()
        s_out, s_err = server.communicate(timeout=60)
    assert server.returncode == 0 and proc.returncode == 0, s_err + err
    assert "CUDA_MPS_PIPE_DIRECTORY=" in s_out and "CUDA_MPS_CLIENT_PRIORITY=1" not in s_out
    assert "(spatial, MPS)" in s_err and "gpuslice's choice (--engine auto)" in s_err
    assert "CUDA_MPS_CLIENT_PRIORITY=1" in out.splitlines() and "CUDA_MPS_PIPE_DIRECTORY=" in out
    assert "(spatial, MPS, below-normal client)" in err
    assert "gpuslice's choice (--engine auto)" in err and "--engine timeslice keeps" in err
    proc = gpuslice("run", "--memory", "1GiB", "--", "sh", "-c", show, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "" and "spatial" not in err
    proc = gpuslice("run", "--engine", "turbo", "--memory", "1GiB", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "auto (the default) or timeslice or spatial" in " ".join(err.split())
    assert mps_processes(root) == []


def test_run_says_why_a_slice_naming_its_priority_was_time_sliced(env: dict[str, str], root: Path) -> None:
    """The trainer started before its server (the issue's pair the other way round) is time-sliced: `run` says
    so and what to do, instead of leaving the user to find the engine in `ps`. A high-priority slice on a node
    without MPS says why it is not spatial."""
    proc = gpuslice("run", "--priority", "low", "--memory", "1GiB", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    said = " ".join(err.split())
    assert "engine timeslice, gpuslice's choice (--engine auto)" in said and "start the server first" in said
    no_mps = {**env, "GPUSLICE_MPS_CONTROL": str(root / "missing" / "nvidia-cuda-mps-control")}
    proc = gpuslice("run", "--priority", "high", "--memory", "1GiB", "--", "true", env=no_mps)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    said = " ".join(err.split())
    assert "engine timeslice, gpuslice's choice" in said and "no MPS binaries" in said and "spatial, MPS" not in said
    proc = gpuslice("run", "--memory", "1GiB", "--", "true", env=env)  # preferred time-slicing: nothing to say
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "gpuslice's choice" not in err, err


def test_the_note_says_which_way_the_choice_went(ledger: Ledger) -> None:
    """The grant's note follows what happened: spatial as preferred, spatial by joining (a plain job on the
    pair's device), none for a time-sliced job that preferred it."""
    from gpuslice.local.launcher import engine_note

    server_ask = auto(priority="high")
    server = ledger.acquire(server_ask)
    assert "for a slice that names its priority" in engine_note(server_ask, server)
    joiner_ask = auto(devices=server.uuids)
    joined = ledger.acquire(joiner_ask)
    assert joined.slices[0].engine is Engine.SPATIAL
    assert "it joined your spatial slices there" in engine_note(joiner_ask, joined)
    plain_ask = auto()
    plain = ledger.acquire(plain_ask)
    assert plain.slices[0].engine is Engine.TIMESLICE and engine_note(plain_ask, plain) is None
    named = Ask(request=Request(memory=parse_memory("4GiB"), engine=Engine.SPATIAL), owner="t", holder_pid=os.getpid(),
                holder_start=procs.start_time(os.getpid()))
    assert engine_note(named, ledger.acquire(named)) is None  # named: nothing was chosen
    for g in ledger.grants():
        ledger.release(g.grant_id)


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
