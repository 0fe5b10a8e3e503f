"""The ledger's SQLite file: connection, transactions, schema and its versions.

The schema version is SQLite's ``user_version``. Every release reads the versions it knows and migrates
an older file on open, inside one ``BEGIN IMMEDIATE`` transaction (a failed migration leaves the file as
it was); a file of a newer version is refused, never guessed at.

=======  =========================================================================================
version  what changed
=======  =========================================================================================
1        gpuslice 0.1.0 (``user_version`` 0 on disk): grant records spelled ``grant_id`` and slices
         ``device_uuid``/``memory_limit``; waiters without a ``devices`` column in the earliest files
2        grant records in the one JSON spelling of :mod:`gpuslice.spec.codec` (``grant``, ``uuid``,
         ``memory``), beside the record's own keys
3        waiters keep the uid of the user who queued them (``uid``; -1 in rows written before)
=======  =========================================================================================
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gpuslice.local.errors import LedgerError

SCHEMA_VERSION = 3
SCHEMA = """
CREATE TABLE IF NOT EXISTS grants (
    id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS waiters (
    ticket INTEGER PRIMARY KEY AUTOINCREMENT,
    priority INTEGER NOT NULL,
    enqueued REAL NOT NULL,
    pid INTEGER NOT NULL,
    pid_start INTEGER NOT NULL,
    owner TEXT NOT NULL,
    request TEXT NOT NULL,
    devices TEXT NOT NULL DEFAULT '[]',
    uid INTEGER NOT NULL DEFAULT -1
);
"""
BUSY_TIMEOUT_S = 30.0


def _root_only(path: Path) -> None:
    """Root's ledger is root's alone (0600; SQLite makes its -wal and -shm files with the database's mode): users
    reach it through the agent's socket. Readable by all (the umask's 0644), any user could take a POSIX read lock
    on the WAL's write-lock byte in ``-shm`` and so make every grant, release and reclaim wait out the busy
    timeout and fail, the agent stalled behind them (helper 41, stop 38). A file made before is brought to 0600;
    a user who opened it while it was readable keeps that descriptor until the process ends (restart the machine's
    users' processes, or the machine, after upgrading to be sure)."""
    if os.geteuid() != 0:
        return  # a user's own ledger, or a state dir its users chose to share: their umask's choice
    if not os.path.lexists(path):  # a new file: no connection of this process can hold a lock on it
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except FileExistsError:  # another root process (the agent, a `sudo gpuslice run`) made it just now
            pass
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        _mode_600(name)


def _mode_600(name: str) -> None:
    """``name`` (never through a link: a link there is an error) brought to 0600. Never through a descriptor this
    process could close while it holds SQLite's locks: POSIX record locks go with the close of *any* descriptor
    of the file, so opening and closing the side files dropped the locks of every connection this process had,
    and another process reset the WAL under a reader's snapshot (SIGBUS in its mapping of -shm: the demo's CI run,
    stop 39). An O_PATH descriptor holds no locks to drop (Linux), and chmod through /proc/self/fd changes the file
    it names (chmod without following links is ENOTSUP before glibc 2.32: helper 42)."""
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return  # no -wal or -shm yet: SQLite makes them with the database's mode
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise OSError(errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.EINVAL,
                      "not a plain file (a link or something else in the ledger's place)", name)
    if stat.S_IMODE(st.st_mode) == 0o600:
        return  # the common case: nothing opened at all
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a plain file", name)
        os.chmod(f"/proc/self/fd/{fd}", 0o600)
    finally:
        os.close(fd)


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating or migrating) the ledger at ``path``; :class:`LedgerError` naming the file if it cannot."""
    try:
        _root_only(path)
    except OSError as exc:
        raise LedgerError(f"cannot open the ledger {path}: {exc}") from None
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            _refuse_newer(db, path)  # before switching to WAL: a newer release's file is left as it is
            _wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            with immediate(db):
                _upgrade(db, path)
        except BaseException:
            db.close()
            raise
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open the ledger {path}: {exc}") from None
    return db


def _wal(db: sqlite3.Connection) -> None:
    """Switch to WAL; that needs a moment of exclusive access while others may hold the file."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One transaction holding SQLite's write lock from its start: nobody can read-then-write in between."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def schema_version(db: sqlite3.Connection) -> int:
    """The file's version: its ``user_version``, or 1 for a 0.1.0 file (tables but ``user_version`` 0)."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == 0:
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                            "AND name IN ('grants', 'waiters')").fetchone()
        return 1 if tables[0] else 0
    return version


def _refuse_newer(db: sqlite3.Connection, path: Path) -> int:
    version = schema_version(db)
    if version > SCHEMA_VERSION:
        raise LedgerError(f"the ledger {path} has schema version {version}, written by a newer gpuslice; this "
                          f"release reads versions up to {SCHEMA_VERSION}. Run the newer release, or move the file "
                          "away to start an empty ledger (its grants are then forgotten)")
    return version


def _upgrade(db: sqlite3.Connection, path: Path) -> None:
    version = _refuse_newer(db, path)  # again inside the write lock: another release may have opened it since
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    if version == 1:
        _from_v1(db)
    if 1 <= version < 3:
        _from_v2(db)
    if version != SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _from_v2(db: sqlite3.Connection) -> None:
    columns = {row[1] for row in db.execute("PRAGMA table_info(waiters)")}
    if "uid" not in columns:  # rows queued before: their user is learnt from the holder (ledger.queued_by)
        db.execute("ALTER TABLE waiters ADD COLUMN uid INTEGER NOT NULL DEFAULT -1")


def _from_v1(db: sqlite3.Connection) -> None:
    columns = {row[1] for row in db.execute("PRAGMA table_info(waiters)")}
    if "devices" not in columns:  # the earliest files: waiters did not keep their --device list
        db.execute("ALTER TABLE waiters ADD COLUMN devices TEXT NOT NULL DEFAULT '[]'")
    for grant_id, text in db.execute("SELECT id, record FROM grants").fetchall():
        try:
            record = v1_record(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # unreadable in any version: left as it is, for the reader to report
        db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record), grant_id))


def v1_record(old: dict[str, Any]) -> dict[str, Any]:
    """A version-1 grant record in version 2's spelling (every other key kept as it was)."""
    record = {k: v for k, v in old.items() if k != "grant_id"}
    record["grant"] = old["grant_id"]
    record["slices"] = [{"uuid": s["device_uuid"], "memory": s["memory_limit"],
                         **{k: v for k, v in s.items() if k not in ("device_uuid", "memory_limit")}}
                        for s in old["slices"]]
    return record
