"""Local mode's slice record files (issue 15): the ledger makes each grant's ``<stem>.slices/<grant>`` on each of
its devices when it grants (empty, the grant's user's, 0644, in a folder of the agent's), keeps it through resizes,
removes it at release, and its reconcile brings the files in line with the books. The agent makes every device's
folder at start. Nothing there is world-writable (the shared ``<uuid>.dev`` of before was 0666)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from squatter import KINDS, take_name

from gpuslice.enforcer.devstate import records_folder_name
from gpuslice.enforcer.policy import folder_name
from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.local.ledger import Ledger
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord
from gpuslice.spec import Request, Resize, parse_memory

DEVICES = load_snapshot("h100-80gb")
GPU0, GPU1 = DEVICES[0].uuid, DEVICES[1].uuid
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another user needs root (CI runs as root)")


def ask(memory: str = "4GiB", devices: tuple[str, ...] = (GPU0,), uid: int = -1) -> Ask:
    pid = os.getpid()
    return Ask(request=Request(memory=parse_memory(memory), compute=30, count=len(devices)), owner="t",
               holder_pid=pid, holder_start=procs.start_time(pid), devices=devices, uid=uid)


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1")


def grant(ledger: Ledger, **kw) -> GrantRecord:
    g = ledger.acquire(ask(**kw))
    assert isinstance(g, GrantRecord)
    return g


def record_of(ledger: Ledger, uuid: str, grant_id: str) -> Path:
    return ledger.state.device_state / records_folder_name(uuid) / grant_id


def test_a_grant_makes_an_empty_record_file_per_device_and_release_removes_it(ledger):
    """Granted: ``<stem>.slices/<grant>`` on each device, empty (the first process sizes it), 0644, in a 0755
    folder of the agent's, beside the roster entry; released: both gone, the neighbours' files stay."""
    g = grant(ledger, devices=(GPU0, GPU1))
    other = grant(ledger)
    for uuid in (GPU0, GPU1):
        path = record_of(ledger, uuid, g.grant_id)
        st, folder = os.lstat(path), os.lstat(path.parent)
        assert stat.S_ISREG(st.st_mode) and (st.st_size, stat.S_IMODE(st.st_mode)) == (0, 0o644)
        assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (os.geteuid(), 0o755)
        assert (ledger.state.device_state / folder_name(uuid) / g.grant_id).is_file()
    assert not list(ledger.state.device_state.glob("*.dev"))
    assert ledger.release(g.grant_id)
    assert not record_of(ledger, GPU0, g.grant_id).exists() and not record_of(ledger, GPU1, g.grant_id).exists()
    assert record_of(ledger, GPU0, other.grant_id).is_file()


@as_root
def test_under_root_the_file_belongs_to_the_grants_user(ledger):
    """A root agent hands each record file to the grant's user (0644: only that user's processes write it, every
    pacer of the device reads it); the folder stays root's, 0755, so the user can make nothing else there.
    Grants of root, or of no known user, keep root's."""
    g = grant(ledger, uid=54321)
    st = os.lstat(record_of(ledger, GPU0, g.grant_id))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (54321, 0o644)
    folder = os.lstat(record_of(ledger, GPU0, g.grant_id).parent)
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (0, 0o755)
    mine = grant(ledger, uid=0)
    assert os.lstat(record_of(ledger, GPU0, mine.grant_id)).st_uid == 0


def test_a_resize_keeps_the_file_its_processes_map(ledger):
    """A live resize writes the roster and the slice file again, never the record file: same inode, same bytes."""
    g = grant(ledger)
    path = record_of(ledger, GPU0, g.grant_id)
    path.write_bytes(b"written by the slice" * 10)
    before = (os.stat(path).st_ino, path.read_bytes())
    ledger.resize(g.grant_id, Resize(compute=45))
    assert (os.stat(path).st_ino, path.read_bytes()) == before


@pytest.mark.parametrize("taken", KINDS)
def test_a_name_a_tenant_took_first_is_moved_aside_at_grant(ledger, tmp_path, taken):
    """The devices folder is sticky and world-writable: a tenant may make ``<stem>.slices`` first. The grant moves
    it aside (``.<name>.refused-<ns>``), never follows it or writes into it, and makes the agent's own."""
    ledger.state.ensure()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = ledger.state.device_state / records_folder_name(GPU0)
    take_name(name, elsewhere, taken)
    g = grant(ledger)
    st = os.lstat(name)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and (name / g.grant_id).is_file()
    assert list(elsewhere.iterdir()) == []
    assert [p for p in ledger.state.device_state.iterdir() if p.name.startswith(f".{name.name}.refused-")]


def test_reconcile_makes_a_missing_file_and_removes_an_ended_grants(ledger):
    """The books win: a grant whose file went missing (a grant from before record files, a hand) gets it again; a
    file of a grant the ledger does not hold goes once older than the grace."""
    g = grant(ledger)
    record_of(ledger, GPU0, g.grant_id).unlink()
    stray = record_of(ledger, GPU0, "g-ended")
    stray.touch()
    done = ledger.reconcile_records()
    assert (done.made, done.gone) == ((g.grant_id,), ())  # the stray is new: it may be a grant made meanwhile
    assert record_of(ledger, GPU0, g.grant_id).is_file()
    old = time.time() - 600
    os.utime(stray, (old, old))
    assert ledger.reconcile_records().gone == ("g-ended",) and not stray.exists()


@as_root
def test_the_agent_makes_every_devices_folders_at_start_and_no_shared_file(tmp_path):
    """At start a root agent makes each device's records folder and roster (root's, 0755) before any tenant can
    name them, moving aside what a tenant made first; no ``<uuid>.dev`` shared file any more."""
    state = StateDir(tmp_path / "state")
    state.device_state.mkdir(parents=True)
    os.chmod(state.device_state, 0o1777)
    theirs = state.device_state / records_folder_name(GPU1)
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    state.prepare_device_state([GPU0, GPU1])
    for uuid in (GPU0, GPU1):
        for name in (records_folder_name(uuid), folder_name(uuid)):
            st = os.lstat(state.device_state / name)
            assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), name
    assert [p.name for p in state.device_state.iterdir() if ".refused-" in p.name]
    assert not list(state.device_state.glob("*.dev"))
