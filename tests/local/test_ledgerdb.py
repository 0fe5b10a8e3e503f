"""The ledger file's schema versions: a 0.1.0 ledger (committed, written by that release) is migrated on
open and keeps every grant and waiter; a newer version is refused with a clear error; nothing is half done."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest

from gpuslice.host.devices import load_snapshot
from gpuslice.local import ledgerdb
from gpuslice.local.errors import LedgerError
from gpuslice.local.ledger import Ledger
from gpuslice.local.paths import StateDir
from gpuslice.spec import GiB, ComputeMode, Priority

DEVICES = load_snapshot("h100-80gb")
# Written by gpuslice 0.1.0 (the release before schema versions): three grants (a 4 GiB high-priority soft
# slice with a launched child, a 25 % slice on each of two devices, a whole device held exclusively) and one
# waiter for that device. The holders' pids are long gone; nothing here reclaims before reading.
V1 = Path(__file__).parent / "data" / "ledger-v1.db"


def _state(tmp_path: Path) -> StateDir:
    state = StateDir(tmp_path / "state").ensure()
    shutil.copy(V1, state.ledger)
    return state


def _raw(state: StateDir) -> tuple[int, list[dict]]:
    db = sqlite3.connect(state.ledger)
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        rows = [json.loads(r[0]) for r in db.execute("SELECT record FROM grants ORDER BY rowid")]
    finally:
        db.close()
    return version, rows


def test_a_0_1_0_ledger_is_migrated_on_open_and_keeps_every_grant_and_waiter(tmp_path):
    state = _state(tmp_path)
    assert ledgerdb.schema_version(sqlite3.connect(state.ledger)) == 1
    ledger = Ledger(state, DEVICES, node_name="n1")
    grants = {g.owner: g for g in ledger.grants()}
    assert sorted(grants) == ["alice", "bob", "carol"]
    alice = grants["alice"]
    (s,) = alice.slices
    assert (s.device_uuid, s.memory_limit, s.compute) == (DEVICES[0].uuid, 4 * GiB, 30)
    assert (s.priority, s.mode, s.weight) == (Priority.HIGH, ComputeMode.SOFT, 2)
    assert (alice.child_pid, alice.child_start, alice.uid, alice.command) == (424242, 99, 1000, "python train.py")
    assert str(alice.request.memory) == "4GiB" and alice.request.compute == 30
    assert len(grants["bob"].slices) == 2 and str(grants["bob"].request.memory) == "25%"
    assert grants["carol"].exclusive and grants["carol"].slices[0].device_uuid == DEVICES[3].uuid
    (waiter,) = ledger.waiters()
    assert (waiter.owner, waiter.devices, waiter.request.exclusive) == ("dave", (DEVICES[3].uuid,), True)
    assert waiter.uid == -1  # queued before waiters kept their user: learnt from the holder (ledger.queued_by)
    ledger.close()
    version, rows = _raw(state)
    assert version == ledgerdb.SCHEMA_VERSION == 3
    assert all("grant" in r and "grant_id" not in r for r in rows)  # the one spelling, written back
    assert all(set(s) >= {"uuid", "memory"} and "device_uuid" not in s for r in rows for s in r["slices"])
    again = Ledger(state, DEVICES, node_name="n1")  # a migrated ledger opens unchanged
    assert {g.grant_id: g for g in again.grants()} == {g.grant_id: g for g in grants.values()}


def test_a_version_2_ledger_gains_the_waiters_uid_and_keeps_its_queue(tmp_path):
    """Schema 3 adds the uid of the user who queued each waiter; a version-2 file's waiters are kept, with -1
    (unknown: their user is learnt from the holder while it lives)."""
    state = StateDir(tmp_path / "state")
    state.root.mkdir(parents=True)
    db = sqlite3.connect(state.ledger)
    db.executescript("""
        CREATE TABLE grants (id TEXT PRIMARY KEY, record TEXT NOT NULL);
        CREATE TABLE waiters (ticket INTEGER PRIMARY KEY AUTOINCREMENT, priority INTEGER NOT NULL,
            enqueued REAL NOT NULL, pid INTEGER NOT NULL, pid_start INTEGER NOT NULL, owner TEXT NOT NULL,
            request TEXT NOT NULL, devices TEXT NOT NULL DEFAULT '[]');
        INSERT INTO waiters (priority, enqueued, pid, pid_start, owner, request, devices)
            VALUES (1, 1.0, 4242, 7, 'erin', '{"count": 1, "memory": "2GiB"}', '[]');
        PRAGMA user_version = 2;""")
    db.close()
    ledger = Ledger(state, DEVICES, node_name="n1")
    (waiter,) = ledger.waiters()
    assert (waiter.owner, waiter.pid, waiter.uid) == ("erin", 4242, -1)
    ledger.close()
    assert _raw(state)[0] == 3


def test_a_ledger_of_a_newer_version_is_refused_and_left_alone(tmp_path):
    state = _state(tmp_path)
    db = sqlite3.connect(state.ledger)
    db.execute("PRAGMA user_version = 7")
    db.close()
    before = state.ledger.read_bytes()
    with pytest.raises(LedgerError, match="schema version 7, written by a newer gpuslice; this release reads "
                                          "versions up to 3"):
        Ledger(state, DEVICES, node_name="n1")
    assert state.ledger.read_bytes() == before


def test_a_new_ledger_starts_at_the_current_version(tmp_path):
    ledger = Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1")
    ledger.close()
    assert _raw(ledger.state) == (ledgerdb.SCHEMA_VERSION, [])


@pytest.mark.skipif(os.geteuid() != 0, reason="root's ledger: the mode is set only when root opens it")
def test_roots_ledger_and_its_wal_files_are_root_only(tmp_path):
    """Readable by every user (the umask's 0644), the -shm file let anyone take a read lock on the WAL's write-lock
    byte and fail every grant and release (helper 41): root's ledger, its -wal and -shm are 0600, and a ledger
    made before is brought to 0600 on open."""
    path = tmp_path / "ledger.db"
    db = ledgerdb.connect(path)
    with ledgerdb.immediate(db):
        db.execute("INSERT INTO grants (id, record) VALUES ('g-probe', '{}')")
    modes = {side: stat.S_IMODE(os.stat(f"{path}{side}").st_mode) for side in ("", "-wal", "-shm")}
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    db.close()
    for side in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{side}"):
            os.chmod(f"{path}{side}", 0o644)
    ledgerdb.connect(path).close()
    assert all(stat.S_IMODE(os.stat(f"{path}{side}").st_mode) == 0o600 for side in ("", "-wal", "-shm")
               if os.path.exists(f"{path}{side}"))


@pytest.mark.skipif(os.geteuid() != 0, reason="root's ledger: the mode is set only when root opens it")
def test_two_root_processes_opening_a_new_ledger_at_once_both_open_it(tmp_path, monkeypatch):
    """The agent and a `sudo gpuslice run` may both find no ledger and make it: the one that comes second opens
    the file the first made (it said "cannot open the ledger: File exists": helper 45)."""
    path = tmp_path / "ledger.db"
    first = ledgerdb.connect(path)
    monkeypatch.setattr(ledgerdb.os.path, "lexists", lambda name: False)  # it looked before the first made it
    second = ledgerdb.connect(path)
    with ledgerdb.immediate(first):
        first.execute("INSERT INTO grants (id, record) VALUES ('g-probe', '{}')")
    assert second.execute("SELECT id FROM grants").fetchall() == [("g-probe",)]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first.close()
    second.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="root's ledger: the mode is set only when root opens it")
def test_a_link_beside_roots_ledger_is_a_ledger_error_not_a_crash(tmp_path):
    """The side files are opened without following links and fchmod'ed (chmod without following links is ENOTSUP
    before glibc 2.32, which raised NotImplementedError past the ledger's error handling: helper 42): a link in
    their place is refused as the ledger's error, naming the file, and nothing it points at is changed."""
    target = tmp_path / "elsewhere"
    target.write_text("x")
    target.chmod(0o644)
    path = tmp_path / "ledger.db"
    (tmp_path / "ledger.db-wal").symlink_to(target)
    with pytest.raises(LedgerError, match="ledger.db"):
        ledgerdb.connect(path)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


CHECKPOINT = r"""
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
db.execute("INSERT INTO grants (id, record) VALUES (?, '{}')", (sys.argv[2],))
print(db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="root's ledger: the side files are looked at only when root opens it")
def test_opening_the_ledger_again_keeps_the_locks_of_this_processs_other_connections(tmp_path):
    """POSIX record locks belong to the process and go with the close of *any* descriptor of the file: opening
    the ledger's side files to set their mode, and closing them, dropped the locks of every connection this
    process already had (SQLite's own warning). Another process then took the WAL for unread, reset it under
    a reader's snapshot, and the reader died of SIGBUS in its mapping of -shm (the demo's CI run, stop 39), or
    read a torn database. A reader's snapshot must still hold back another process's truncating checkpoint after
    this process opens a second connection."""
    import subprocess
    import sys

    path = tmp_path / "ledger.db"
    reader = ledgerdb.connect(path)
    with ledgerdb.immediate(reader):
        reader.execute("INSERT INTO grants (id, record) VALUES ('g-0', '{}')")
    reader.execute("BEGIN")
    assert reader.execute("SELECT COUNT(*) FROM grants").fetchone() == (1,)  # a snapshot held open

    def checkpoint_busy(tag: str) -> int:
        done = subprocess.run([sys.executable, "-c", CHECKPOINT, str(path), tag], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert checkpoint_busy("g-1") == 1  # the reader holds the WAL
    for _ in range(3):
        for side in ("", "-wal", "-shm"):  # a mode to mend: the side files are looked at, not only stat'ed
            os.chmod(f"{path}{side}", 0o644)
        ledgerdb.connect(path).close()
        assert all(stat.S_IMODE(os.stat(f"{path}{side}").st_mode) == 0o600 for side in ("", "-wal", "-shm"))
    assert checkpoint_busy("g-2") == 1  # ... and still does
    assert reader.execute("SELECT COUNT(*) FROM grants").fetchone() == (1,)
    reader.execute("COMMIT")
    reader.close()
