"""The ledger: grants, placement, no over-commit under real concurrency, crash reclaim, the wait queue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.local.ledger import Ledger, slice_processes
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord, Queued
from gpuslice.placement import NoFit
from gpuslice.spec import GiB, Priority, Request, parse_memory

DEVICES = load_snapshot("h100-80gb")
GPU0 = DEVICES[0].uuid


def ask(memory: str, compute: int = 0, pid: int | None = None, priority: Priority = Priority.LOW,
        devices: tuple[str, ...] = (GPU0,)) -> Ask:
    pid = os.getpid() if pid is None else pid
    return Ask(request=Request(memory=parse_memory(memory), compute=compute, priority=priority), owner="t",
               holder_pid=pid, holder_start=procs.start_time(pid), devices=devices)


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1")


def test_grant_writes_slice_file_and_release_removes_it(ledger):
    grant = ledger.acquire(ask("4GiB", compute=30))
    assert isinstance(grant, GrantRecord)
    assert [s.device_uuid for s in grant.slices] == [GPU0]
    text = Path(grant.slice_file).read_text()
    assert "memory_limit=4294967296" in text and "compute=30" in text and f"devices={GPU0}" in text
    assert f"region={grant.region_file}" in text
    assert [g.grant_id for g in ledger.grants()] == [grant.grant_id]
    assert ledger.release(grant.grant_id) is True
    assert ledger.grants() == [] and not Path(grant.slice_file).exists()
    assert ledger.release(grant.grant_id) is False


def test_nofit_says_what_is_free(ledger):
    ledger.acquire(ask("60GiB"))
    with pytest.raises(NoFit) as err:
        ledger.acquire(ask("30GiB"))
    assert "30.0 GiB" in err.value.reason and "free now" in err.value.reason and "GPU 0" in err.value.reason
    ledger.acquire(ask("30GiB", devices=()))  # another device takes it


def test_nofit_names_devices_by_index_and_says_what_to_do_next(ledger):
    """The refusal speaks this machine's language — GPU 0, not a UUID or a node name — and offers next
    steps that work: --wait, a smaller size or share that really fits now, ps."""
    ledger.acquire(ask("60GiB", compute=50))
    with pytest.raises(NoFit) as err:
        ledger.acquire(ask("20GiB"))
    text = err.value.reason
    lines = text.splitlines()
    assert lines[0] == "does not fit now: needs 20.0 GiB on 1 device; largest free is 19.6 GiB on GPU 0"
    assert lines[1] == "free now: GPU 0: 19.6 GiB, 50% compute, 9 slots free"
    assert lines[2] == ("next: --wait queues it until it fits; --memory 19.6GiB fits now; "
                        "`gpuslice ps` shows who holds the devices")
    assert not any(d.uuid in text for d in DEVICES) and "n1" not in text
    with pytest.raises(NoFit, match="--compute 50 fits now"):
        ledger.acquire(ask("5GiB", compute=60))
    assert isinstance(ledger.acquire(ask("5GiB", compute=50)), GrantRecord)  # the share offered fits
    assert isinstance(ledger.acquire(ask("14.6GiB")), GrantRecord)  # and what is left of the size offered


def test_nofit_groups_devices_with_the_same_room_and_offers_fewer_whole_devices(ledger):
    ledger.acquire(ask("70GiB"))
    whole = Ask(request=Request(count=8, exclusive=True), owner="t", holder_pid=os.getpid(),
                holder_start=procs.start_time(os.getpid()))
    with pytest.raises(NoFit) as err:
        ledger.acquire(whole)
    text = err.value.reason
    assert "GPU 1–7: 79.6 GiB, 100% compute, 10 slots free each" in text and "--gpus 7 fits now" in text
    assert isinstance(ledger.acquire(replace(whole, request=Request(count=7, exclusive=True))), GrantRecord)


def test_compute_shares_cannot_exceed_100(ledger):
    ledger.acquire(ask("1GiB", compute=70))
    with pytest.raises(NoFit):
        ledger.acquire(ask("1GiB", compute=40))


def test_compute_only_requests_share_the_device(ledger):
    """``--compute 30`` without ``--memory`` (issue 12) gets 30 % of the device's memory, recorded in the
    grant's request, so more compute-only slices fit beside it; a request without a share still takes the
    whole memory, and an explicit size is kept."""
    total = DEVICES[0].memory_total
    only = Ask(request=Request(compute=30), owner="t", holder_pid=os.getpid(),
               holder_start=procs.start_time(os.getpid()), devices=(GPU0,))
    first = ledger.acquire(only)
    assert isinstance(first, GrantRecord) and first.slices[0].memory_limit == total * 30 // 100
    assert first.request.memory == parse_memory("30%") and f"memory_limit={total * 30 // 100}" in Path(
        first.slice_file).read_text()
    second = ledger.acquire(replace(only, request=Request(compute=60)))
    assert isinstance(second, GrantRecord) and second.slices[0].device_uuid == GPU0
    assert second.slices[0].memory_limit == total * 60 // 100
    with pytest.raises(NoFit):  # 90 % of the memory and of the time are spoken for
        ledger.acquire(replace(only, request=Request(compute=20)))
    third = ledger.acquire(ask("4GiB", compute=10))
    assert third.slices[0].memory_limit == 4 * GiB
    for g in (first, second, third):
        ledger.release(g.grant_id)
    whole = ledger.acquire(replace(only, request=Request()))
    assert whole.slices[0].memory_limit == total  # no compute share: the whole device, as before


HOLDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from gpuslice.host import procs
    from gpuslice.host.devices import load_snapshot
    from gpuslice.local.ledger import Ledger, slice_processes
    from gpuslice.local.paths import StateDir
    from gpuslice.local.records import Ask
    from gpuslice.placement import NoFit
    from gpuslice.spec import Request, parse_memory
    devices = load_snapshot("h100-80gb")
    ledger = Ledger(StateDir(Path(sys.argv[1])), devices)
    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.005)
    a = Ask(Request(memory=parse_memory("10GiB"), compute=5), "t", os.getpid(), procs.start_time(os.getpid()),
            devices=(devices[0].uuid,))
    try:
        ledger.acquire(a)
        print("granted", flush=True)
    except NoFit:
        print("nofit", flush=True)
    time.sleep(float(sys.argv[3]))
""")


def test_parallel_processes_never_overcommit(tmp_path):
    state = tmp_path / "state"
    Ledger(StateDir(state), DEVICES)  # create the file once, as a fresh box would on first use
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    workers = [subprocess.Popen([sys.executable, "-c", HOLDER, str(state), str(go), "4"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(12)]
    time.sleep(1.5)  # let every interpreter start and wait on the go file
    go.touch()
    answers = []
    for w in workers:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        answers.append(out.strip())
    # 79.6 GiB of one H100 holds exactly 7 slices of 10 GiB.
    assert sorted(answers).count("granted") == 7, answers
    assert answers.count("nofit") == 5


def test_crashed_holder_is_reclaimed(ledger):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        grant = ledger.acquire(ask("40GiB", pid=holder.pid))
        assert ledger.reclaim() == []
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert ledger.reclaim() == [grant.grant_id]
        assert not Path(grant.slice_file).parent.exists()
    finally:
        holder.kill()


def test_reused_pid_does_not_keep_a_grant(ledger):
    stale = ask("40GiB")
    # with its uid given (an ask without one whose holder is gone is refused at acquire): the reclaimer's check
    stale = Ask(stale.request, "t", os.getpid(), procs.start_time(os.getpid()) - 1, devices=stale.devices,
                uid=os.getuid())
    grant = ledger.acquire(stale)
    assert ledger.reclaim() == [grant.grant_id]  # same pid, other start time: not the holder


def _spawn(cmd: list[str], grant: GrantRecord | None = None, **kw) -> subprocess.Popen:
    """A real process; with ``grant``, carrying its marker as `gpuslice run` children do. Returns once its
    environment can be read: ``Popen`` returns before ``exec`` has laid it out (``procs.environ_has``)."""
    env = {k: v for k, v in os.environ.items() if k != "GPUSLICE_SLICE"}
    if grant is not None:
        env["GPUSLICE_SLICE"] = grant.slice_file
    proc = subprocess.Popen(cmd, env=env, **kw)
    deadline = time.monotonic() + 30.0
    while procs.environ_has(proc.pid, "GPUSLICE_SLICE=") is None:  # None until exec is done
        if time.monotonic() > deadline or proc.poll() is not None:
            _reap(proc)
            raise AssertionError(f"{cmd}: its environment never became readable")
        time.sleep(0.01)
    return proc


def _dead_holder(ledger: Ledger, memory: str = "40GiB") -> GrantRecord:
    holder = subprocess.Popen(["sleep", "60"])
    grant = ledger.acquire(ask(memory, pid=holder.pid))
    holder.kill()
    holder.wait()
    return grant


def _reclaimed(ledger: Ledger, timeout: float = 30.0) -> list[str]:
    """Reclaim passes until one releases something: a pass waits only SETTLE_S for signalled processes to go,
    which a loaded machine may outlast (the next pass, as the agent's, then frees the grant)."""
    deadline = time.monotonic() + timeout
    while not (released := ledger.reclaim()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return released


def _reap(*children: subprocess.Popen) -> None:
    for c in children:
        c.kill()
        c.wait()


def test_holder_died_launched_group_is_ended_then_released(tmp_path):
    ledger = Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1", kill_grace=5)
    holder = subprocess.Popen(["sleep", "60"])
    grant = ledger.acquire(ask("40GiB", pid=holder.pid))
    child = _spawn(["sleep", "60"], grant, process_group=0)
    try:
        ledger.set_child(grant.grant_id, child.pid, procs.start_time(child.pid))
        assert ledger.reclaim() == []  # the holder lives: nothing is touched
        assert child.poll() is None
        holder.kill()
        holder.wait()
        assert _reclaimed(ledger) == [grant.grant_id]  # SIGTERM to the group, gone at once, grant freed
        assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        _reap(holder, child)


def test_orphaned_grandchildren_are_ended_when_the_leader_is_gone(ledger):
    """The leader (sh) died with the holder; its children live on in the group: those carrying the grant's
    marker are ended, a group member without it is a stranger to the slice and left alone."""
    grant = _dead_holder(ledger)
    leader = _spawn(["sleep", "60"], grant, process_group=0)
    marked = _spawn(["sleep", "61"], grant, process_group=leader.pid)
    unmarked = _spawn(["sleep", "62"], None, process_group=leader.pid)
    try:
        ledger.set_child(grant.grant_id, leader.pid, procs.start_time(leader.pid))
        leader.kill()
        leader.wait()
        assert procs.stat(marked.pid).pgrp == leader.pid
        assert _reclaimed(ledger) == [grant.grant_id]
        assert marked.wait(timeout=5) == -signal.SIGTERM
        assert unmarked.poll() is None
    finally:
        _reap(leader, marked, unmarked)


def test_a_reused_group_leader_pid_is_never_signalled(ledger):
    """child_pid names a live process with another start time: the launched group emptied before that pid
    was reused, so that process and its group are not the slice's."""
    grant = _dead_holder(ledger)
    stranger = _spawn(["sleep", "60"], grant, process_group=0)  # even with the marker: wrong start time
    try:
        ledger.set_child(grant.grant_id, stranger.pid, procs.start_time(stranger.pid) - 1)
        with_marker_scan_off = replace(ledger.grant(grant.grant_id), slice_file="")
        stats = procs.all_stats()
        assert slice_processes(with_marker_scan_off, stats).empty
        assert slice_processes(ledger.grant(grant.grant_id), stats).ours  # the marker alone still proves it
    finally:
        _reap(stranger)


def test_a_process_ignoring_sigterm_gets_sigkill_after_the_grace(tmp_path):
    ledger = Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1", kill_grace=0.6)
    grant = _dead_holder(ledger)
    stubborn = _spawn(["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], grant,
                      process_group=0, stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline() == "ready\n"
        ledger.set_child(grant.grant_id, stubborn.pid, procs.start_time(stubborn.pid))
        started = time.monotonic()
        assert ledger.reclaim() == []  # SIGTERM is ignored: the grant is kept, the time recorded
        assert stubborn.poll() is None and ledger.grant(grant.grant_id).ending_since > 0
        while (released := ledger.reclaim()) == []:
            assert time.monotonic() - started < 10
            time.sleep(0.1)
        assert released == [grant.grant_id] and time.monotonic() - started >= 0.6
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
    finally:
        _reap(stubborn)


def test_processes_started_before_child_pid_was_recorded_are_found_by_marker(ledger):
    """The launcher was killed between spawn and set_child: child_pid is 0, the marker still finds them."""
    grant = _dead_holder(ledger)
    escaped = _spawn(["sleep", "60"], grant, start_new_session=True)
    try:
        assert ledger.grant(grant.grant_id).child_pid == 0
        assert _reclaimed(ledger) == [grant.grant_id]
        assert escaped.wait(timeout=5) == -signal.SIGTERM
    finally:
        _reap(escaped)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start processes as other users")
def test_a_users_grant_never_signals_another_users_process(tmp_path):
    """Anyone can put a grant's marker in their own environment: of a grant with uid 4242, the user's own
    marked process is ended, and another user's marked process is neither signalled nor keeps the grant."""
    state = StateDir(tmp_path / "state")
    ledger = Ledger(state, DEVICES, node_name="n1", kill_grace=0)
    holder = subprocess.Popen(["sleep", "60"])
    a = ask("4GiB", pid=holder.pid)
    grant = ledger.acquire(Ask(a.request, "u", a.holder_pid, a.holder_start, uid=4242, devices=a.devices))
    victim = _spawn(["sleep", "60"], grant, user=65534, group=65534)
    owned = _spawn(["sleep", "60"], grant, user=4242, group=4242)
    try:
        holder.kill()
        holder.wait()
        # the user's own process is ended (grace 0: SIGKILL) and the stranger's marker keeps nothing alive
        assert _reclaimed(ledger) == [grant.grant_id]
        assert owned.wait(timeout=5) == -signal.SIGKILL
        assert victim.poll() is None  # ... and nobody else's process is touched
    finally:
        _reap(holder, victim, owned)


def test_bad_kill_grace_is_refused_naming_the_variable(tmp_path, monkeypatch):
    from gpuslice.spec import SpecError

    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("GPUSLICE_KILL_GRACE", bad)
        with pytest.raises(SpecError, match="GPUSLICE_KILL_GRACE"):
            Ledger(StateDir(tmp_path / "state"), DEVICES)


def test_wait_queue_is_priority_then_fifo(ledger):
    big = ledger.acquire(ask("70GiB"))
    low = ledger.acquire(ask("30GiB"), wait=True)
    high = ledger.acquire(ask("30GiB", priority=Priority.HIGH), wait=True)
    assert isinstance(low, Queued) and isinstance(high, Queued)
    assert high.position == 1
    low = ledger.acquire(ask("30GiB"), wait=True, ticket=low.ticket)
    assert low.position == 2 and "ahead" in low.reason
    with pytest.raises(NoFit, match="wait ahead"):  # a newcomer that does not wait does not jump the queue
        ledger.acquire(ask("1GiB"))
    ledger.release(big.grant_id)
    low_again = ledger.acquire(ask("30GiB"), wait=True, ticket=low.ticket)
    assert isinstance(low_again, Queued)  # the high-priority waiter goes first
    assert isinstance(ledger.acquire(ask("30GiB", priority=Priority.HIGH), wait=True, ticket=high.ticket),
                      GrantRecord)
    assert isinstance(ledger.acquire(ask("30GiB"), wait=True, ticket=low.ticket), GrantRecord)
    assert ledger.waiters() == []


def test_dead_waiters_leave_the_queue(ledger):
    ledger.acquire(ask("70GiB"))
    ghost = subprocess.Popen(["sleep", "60"])
    queued = ledger.acquire(ask("30GiB", pid=ghost.pid), wait=True)
    assert isinstance(queued, Queued) and len(ledger.waiters()) == 1
    ghost.kill()
    ghost.wait()
    ledger.reclaim()
    assert ledger.waiters() == []


def test_used_memory_sums_stay_within_capacity_after_many_grants(ledger):
    granted = 0
    for _ in range(100):
        try:
            ledger.acquire(ask("7GiB", compute=0, devices=()))
            granted += 1
        except NoFit:
            break
    node = ledger.node_state()
    assert all(d.used_memory <= d.memory_capacity for d in node.devices)
    # 79.6 GiB holds 11 slices of 7 GiB, but a device takes at most 10 slices: 8 GPUs × 10.
    assert granted == sum(d.slice_count for d in node.devices) == 80
    assert sum(d.used_memory for d in node.devices) == granted * 7 * GiB


def test_device_restriction_covers_mig_instances(tmp_path):
    from gpuslice.spec import Device, MigInstance

    insts = tuple(MigInstance(uuid=f"MIG-{i}", profile="3g.40gb", memory_total=40 * GiB, sm_count=42) for i in (1, 2))
    card = Device(uuid="GPU-mig", index=0, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108,
                  mig_enabled=True, mig_instances=insts)
    plain = Device(uuid="GPU-plain", index=1, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108)
    ledger = Ledger(StateDir(tmp_path / "state"), [card, plain], node_name="n1")
    grant = ledger.acquire(ask("1GiB", devices=("MIG-2",)))
    assert [s.device_uuid for s in grant.slices] == ["MIG-2"]
    on_card = ledger.acquire(ask("40GiB", devices=("GPU-mig",)))  # the card's UUID means its instances
    assert on_card.slices[0].device_uuid == "MIG-1"  # MIG-2 has 39 GiB left
    with pytest.raises(NoFit):
        ledger.acquire(ask("40GiB", devices=("GPU-mig",)))


# ------------------------------------------------------------------------------ the queue: who waits for what
def test_waiter_for_one_device_does_not_block_another_device(ledger):
    ledger.acquire(ask("70GiB"))
    waiting = ledger.acquire(ask("30GiB"), wait=True)  # GPU 0 only, full: waits
    assert isinstance(waiting, Queued)
    gpu3 = DEVICES[3].uuid
    other = ledger.acquire(ask("1GiB", devices=(gpu3,)))  # idle GPU 3: not held back by the GPU 0 waiter
    assert isinstance(other, GrantRecord) and other.slices[0].device_uuid == gpu3
    anywhere = ledger.acquire(ask("1GiB", devices=()))  # may use GPU 0 too: goes ahead only elsewhere
    assert isinstance(anywhere, GrantRecord) and anywhere.slices[0].device_uuid != GPU0
    with pytest.raises(NoFit, match="wait ahead"):  # competes for GPU 0 only: behind the waiter
        ledger.acquire(ask("1GiB"))
    queued = ledger.acquire(ask("1GiB"), wait=True)
    assert isinstance(queued, Queued) and queued.position == 2


def test_queue_position_counts_only_waiters_for_the_same_devices(ledger):
    gpu1 = DEVICES[1].uuid
    ledger.acquire(ask("70GiB"))
    ledger.acquire(ask("70GiB", devices=(gpu1,)))
    first = ledger.acquire(ask("30GiB"), wait=True)
    on_gpu1 = ledger.acquire(ask("30GiB", devices=(gpu1,)), wait=True)
    assert (first.position, on_gpu1.position) == (1, 1)  # different devices: both are next for theirs
    second_gpu0 = ledger.acquire(ask("30GiB"), wait=True)
    assert second_gpu0.position == 2 and "wait ahead" not in second_gpu0.reason  # does not fit anyway
    assert "free now" in second_gpu0.reason and "1 request(s) ahead" in second_gpu0.reason


def test_waiter_reserves_only_devices_it_could_be_placed_on(tmp_path):
    """A waiter too big for the small card does not hold back requests that fit there."""
    devices = [DEVICES[0], *load_snapshot("l4")[:1]]
    devices[1] = type(devices[1])(**{**devices[1].__dict__, "index": 1})
    ledger = Ledger(StateDir(tmp_path / "state"), devices, node_name="n1")
    big, small = devices[0].uuid, devices[1].uuid
    ledger.acquire(ask("50GiB", devices=(big,)))
    waiting = ledger.acquire(ask("60GiB", devices=()), wait=True)  # only the H100 can ever hold 60 GiB
    assert isinstance(waiting, Queued)
    grant = ledger.acquire(ask("4GiB", devices=()))
    assert isinstance(grant, GrantRecord) and grant.slices[0].device_uuid == small


def test_high_priority_newcomer_is_not_held_back_by_low_waiters(ledger):
    ledger.acquire(ask("70GiB"))
    ledger.acquire(ask("30GiB"), wait=True)
    assert isinstance(ledger.acquire(ask("5GiB", priority=Priority.HIGH)), GrantRecord)


@pytest.mark.parametrize("memory, count, devices, field, words", [
    ("200GiB", 1, (), "memory", "79.6 GiB"),
    ("1GiB", 9, (), "count", "8 device(s)"),
    ("1GiB", 2, (GPU0,), "count", "--device"),
    ("60GiB", 2, (), None, None),  # fits on an empty node: two distinct H100s
])
def test_request_that_can_never_fit_is_refused_not_queued(ledger, memory, count, devices, field, words):
    from gpuslice.spec import SpecError

    a = Ask(request=Request(count=count, memory=parse_memory(memory)), owner="t", holder_pid=os.getpid(),
            holder_start=procs.start_time(os.getpid()), devices=devices)
    if field is None:
        assert isinstance(ledger.acquire(a, wait=True), GrantRecord)
        return
    for wait in (False, True):
        with pytest.raises(SpecError) as err:
            ledger.acquire(a, wait=wait)
        assert err.value.field == field and words in str(err.value), str(err.value)
    assert ledger.waiters() == []


def test_bad_policy_names_the_field_and_the_choices(ledger):
    from gpuslice.spec import SpecError

    bad = Ask(**{**ask("1GiB").__dict__, "policy": "foo"})
    with pytest.raises(SpecError) as err:
        ledger.acquire(bad)
    assert err.value.field == "policy" and "binpack" in err.value.allowed and "spread" in err.value.allowed


def test_count_two_with_memory_follows_placement_shared_slices(ledger):
    """--gpus 2 --memory 4GiB: two 4 GiB slices on distinct devices, not whole devices."""
    a = Ask(request=Request(count=2, memory=parse_memory("4GiB"), compute=10), owner="t", holder_pid=os.getpid(),
            holder_start=procs.start_time(os.getpid()))
    grant = ledger.acquire(a)
    assert len({s.device_uuid for s in grant.slices}) == 2 and not grant.exclusive
    assert all(s.memory_limit == 4 * GiB for s in grant.slices)
    node = ledger.node_state()
    assert not any(d.exclusive_taken for d in node.devices)  # others may share those devices


def test_old_ledger_without_waiter_devices_is_upgraded(tmp_path):
    import sqlite3

    state = StateDir(tmp_path / "state").ensure()
    db = sqlite3.connect(state.ledger)
    db.executescript("CREATE TABLE waiters (ticket INTEGER PRIMARY KEY AUTOINCREMENT, priority INTEGER NOT NULL, "
                     "enqueued REAL NOT NULL, pid INTEGER NOT NULL, pid_start INTEGER NOT NULL, "
                     "owner TEXT NOT NULL, request TEXT NOT NULL);")
    db.close()
    ledger = Ledger(state, DEVICES, node_name="n1")
    ledger.acquire(ask("70GiB"))
    assert isinstance(ledger.acquire(ask("30GiB"), wait=True), Queued)
    assert ledger.waiters()[0].devices == (GPU0,)
