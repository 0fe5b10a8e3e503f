"""The node's MPS daemons as a set (MpsDaemons.reconcile), against the stand-in control daemon: started on
first use, stopped with the last wanted key, folders of crashed daemons cleared, faults reported and the
faulted daemon restarted only once no client of it is left; concurrent reconcilers start one daemon."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from gpuslice.host.mps import MpsError
from gpuslice.host.mpsfleet import DaemonKey, MpsDaemons
from mpskit import failing_control, install_standin, mps_processes, short_root

A = DaemonKey("GPU-aaaaaaaa-1111-2222-3333-444444444444")
B = DaemonKey("GPU-bbbbbbbb-1111-2222-3333-444444444444")


@pytest.fixture
def root():
    yield from short_root()


@pytest.fixture
def daemons(root: Path) -> MpsDaemons:
    return MpsDaemons(root / "mps", install_standin(root / "bin"), start_timeout=10, quit_timeout=3)


def running(daemons: MpsDaemons) -> set[DaemonKey]:
    return {DaemonKey(s.device, s.uid) for s in daemons.status() if s.pid is not None}


def test_keys_name_short_distinct_folders() -> None:
    assert A.name == "aaaaaaaa1111-self" and DaemonKey(A.device, 1000).name == "aaaaaaaa1111-1000"
    assert DaemonKey("MIG-aaaaaaaa-1111-2222-3333-444444444444", 0).name == "maaaaaaaa1111-0"


def test_started_on_first_use_and_stopped_with_the_last(daemons: MpsDaemons, root: Path) -> None:
    done = daemons.reconcile({A})
    assert done.started == [A] and running(daemons) == {A}
    assert daemons.reconcile({A}).started == []  # nothing to do: the same daemon keeps running
    done = daemons.reconcile({A, B})
    assert done.started == [B] and running(daemons) == {A, B}
    done = daemons.reconcile({B})
    assert done.stopped == [A] and running(daemons) == {B}
    assert not daemons.folder(A).exists() and (daemons.root / "logs" / A.name / "control.log").exists()
    daemons.stop_all()
    assert daemons.known() == {} and mps_processes(root) == []


def test_a_daemon_that_died_is_started_again_and_its_stale_pipes_replaced(daemons: MpsDaemons, root: Path) -> None:
    daemons.reconcile({A})
    ctl = daemons.control(A)
    old = ctl.pid()
    with contextlib.suppress(MpsError):
        ctl.query("standin_crash")
    done = daemons.reconcile({A})
    assert done.started == [A] and ctl.pid() not in (None, old)
    daemons.stop_all()
    assert mps_processes(root) == []


def test_a_crashed_daemon_nobody_wants_is_cleared(daemons: MpsDaemons, root: Path) -> None:
    """What a killed agent leaves: a dead daemon, its server, stale sockets; the next pass clears all."""
    daemons.reconcile({A})
    ctl = daemons.control(A)
    ctl.query("start_server -uid 0")
    with contextlib.suppress(MpsError):
        ctl.query("standin_crash")
    assert mps_processes(root)  # the orphaned server
    assert daemons.reconcile(set()).stopped == [A]
    assert mps_processes(root) == [] and daemons.known() == {}


def test_a_folder_without_a_record_is_cleared(daemons: MpsDaemons) -> None:
    (daemons.root / "junk" / "pipe").mkdir(parents=True)
    daemons.reconcile(set())
    assert not (daemons.root / "junk").exists()


def test_a_fault_is_reported_and_the_daemon_restarted_once_no_client_is_left(daemons: MpsDaemons) -> None:
    daemons.reconcile({A})
    first = daemons.control(A).pid()
    daemons.control(A).query("standin_fault")
    [status] = daemons.status()
    assert status.state == "fault" and "fatal GPU exception" in status.faults[0]
    done = daemons.reconcile({A}, busy=lambda key: True)  # clients still attached: leave it
    assert done.restarted == [] and daemons.control(A).pid() == first
    done = daemons.reconcile({A}, busy=lambda key: False)
    assert done.restarted == [A] and daemons.control(A).pid() != first
    assert [s.state for s in daemons.status()] == ["running"]
    assert "fatal GPU exception" in (daemons.root / "logs" / A.name / "server.log").read_text()
    daemons.stop_all()


def test_a_daemon_that_cannot_start_is_a_problem_of_its_key(root: Path) -> None:
    bad = failing_control(root / "bad", "no device")
    daemons = MpsDaemons(root / "mps", bad, start_timeout=2)
    done = daemons.reconcile({A})
    assert "no device" in done.problems[A] and done.started == []
    with pytest.raises(MpsError, match="no device"):
        daemons.ensure(A)
    daemons.stop_all()


def test_concurrent_reconcilers_start_one_daemon(daemons: MpsDaemons, root: Path) -> None:
    others = [MpsDaemons(daemons.root, daemons.binary, start_timeout=10) for _ in range(4)]
    threads = [threading.Thread(target=d.reconcile, args=({A},)) for d in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(mps_processes(root)) == 1
    daemons.stop_all()


def test_no_binary_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLICE_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    daemons = MpsDaemons(tmp_path / "mps")
    assert not daemons.available()
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control, which is not on PATH"):
        daemons.ensure(A)
