"""Processes as the ledger sees them: a pid plus its start time (so a reused pid is never mistaken for
the original), process groups and descendants, all read from ``/proc``; and signals sent only to the
exact process meant (a pidfd checked against the start time), never to whoever reuses its pid."""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gpuslice.spec import SpecError

PROC = Path("/proc")
GRACE_ENV = "GPUSLICE_KILL_GRACE"


def grace_seconds() -> float:
    """``$GPUSLICE_KILL_GRACE``: seconds between SIGTERM and SIGKILL when a slice's processes are ended."""
    text = os.environ.get(GRACE_ENV, "10")
    try:
        value = float(text)
    except ValueError:
        raise SpecError(GRACE_ENV, text, "seconds to wait after SIGTERM before SIGKILL, like 10") from None
    if not value >= 0 or value == float("inf"):  # also refuses nan
        raise SpecError(GRACE_ENV, text, "a finite number of seconds at least 0")
    return value


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    start: int  # clock ticks since boot (field 22 of /proc/<pid>/stat)
    state: str


def read_text(pid: int, name: str) -> str:
    """``/proc/<pid>/<name>`` as text, whatever its bytes: a process's name (in ``stat``, ``status`` and ``comm``)
    is its owner's to set to any bytes (``prctl(PR_SET_NAME)``), and one name that is not UTF-8 made every
    ``gpuslice run`` on the machine end in a traceback when it scanned the processes (helper 40, stop 38).
    Undecodable bytes are kept as surrogate escapes, so the name still compares as what it is. OSError as the
    read raises it."""
    return (PROC / str(pid) / name).read_bytes().decode("utf-8", "surrogateescape")


def stat(pid: int) -> ProcStat | None:
    """The stat line of ``pid``, or None if it does not exist (or is a zombie: it is already over)."""
    try:
        text = read_text(pid, "stat")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError as exc:
        if exc.errno == errno.ESRCH:  # it ended while we read
            return None
        raise  # EMFILE, ENOMEM ...: not knowing is not "gone" (the reclaimer would free a live grant)
    # The command name is in parentheses and may contain spaces or ')': split after the last ')'.
    fields = text[text.rfind(")") + 2:].split()
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return ProcStat(pid=pid, ppid=int(fields[1]), pgrp=int(fields[2]), start=int(fields[19]), state=state)


def start_time(pid: int) -> int:
    """Start time of a live pid (clock ticks since boot); 0 when it is gone."""
    found = stat(pid)
    return found.start if found else 0


def alive(pid: int, start: int) -> bool:
    """True if ``pid`` runs and is the same process that had start time ``start`` (0 = do not check)."""
    if pid <= 0:
        return False
    found = stat(pid)
    return found is not None and (start == 0 or found.start == start)


def all_stats() -> list[ProcStat]:
    out = []
    for entry in os.listdir(PROC):
        if entry.isdigit():
            found = stat(int(entry))
            if found is not None:
                out.append(found)
    return out


def group_members(pgid: int, not_before: int = 0, stats: list[ProcStat] | None = None) -> list[int]:
    """Live pids of process group ``pgid`` started at or after ``not_before`` (ticks)."""
    if pgid <= 0:
        return []
    return [s.pid for s in (stats if stats is not None else all_stats())
            if s.pgrp == pgid and s.start >= not_before]


def descendants(root: int, stats: list[ProcStat] | None = None) -> list[int]:
    """Live pids below ``root`` in the parent tree (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for s in stats if stats is not None else all_stats():
        children.setdefault(s.ppid, []).append(s.pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def uid_of(pid: int) -> int | None:
    """The user owning ``pid`` (its /proc entry: the effective uid of a dumpable process); None if gone."""
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (``Uid:`` in /proc/<pid>/status): the user who may signal it (the kernel lets a
    sender whose uid is the target's real or saved uid); None if gone."""
    try:
        text = read_text(pid, "status")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def environ_has(pid: int, entry: str) -> bool | None:
    """Whether ``pid``'s environment (as it was exec'd) holds ``entry`` (``NAME=value``); None when it cannot
    be read (another user's process, a setuid program), the process is gone, or it is in the middle of ``exec``
    (:func:`marked` says how that is told)."""
    found = marked([pid], [entry])[pid]
    return None if found is None else entry in found


def marked(pids: Iterable[int], entries: Iterable[str]) -> dict[int, frozenset[str] | None]:
    """Which of ``entries`` (``NAME=value``) each pid's environment (as it was exec'd) holds; None when it cannot
    be read (another user's process, a setuid program), the process is gone, or it is in the middle of ``exec``.
    Only the answers are kept, never the environments (forked children share theirs for free, and a copy of each
    cost root 193 MB for 200 forks of a 1-MB environment: helper 42).

    A process in the middle of ``exec`` reads an empty environment until the kernel has laid out its new stack,
    and its parent may already be back from ``Popen`` (the close-on-exec pipe closes first): a loaded 2-core CI
    box read a marked process as unmarked that way (stop 36). It is told from a process whose environment is
    truly empty (``env -i``: no entries) by the environment's end address in its stat line, 0 until the kernel
    has set it (:func:`_env_laid_out`), and by looking again: the kernel sets that address once before it copies
    the environment's pointers, and the copy may finish between two reads. The looks again are one wait for
    all the pids asked about (up to EMPTY_ENV_LOOKS x 1 ms): a wait per process let a user with a few thousand
    ``env -i`` processes add seconds to every ledger transaction that scanned them (helper 41, stop 38)."""
    wanted = {e.encode(): e for e in entries}
    out: dict[int, frozenset[str] | None] = {}
    pending = []
    for pid in pids:
        data = _environ(pid)
        if data == b"" and _env_laid_out(pid):
            pending.append(pid)  # empty and laid out: truly empty, or the pointers' copy is under way
        else:
            out[pid] = _found(data, wanted)  # None also while still being laid out (env_end 0)
    for _ in range(EMPTY_ENV_LOOKS):
        if not pending:
            break
        time.sleep(0.001)
        still = []
        for pid in pending:
            data = _environ(pid)
            if data == b"":
                still.append(pid)
            else:
                out[pid] = _found(data, wanted)
        pending = still
    out.update((pid, frozenset()) for pid in pending)
    return out


def _found(data: bytes | None, wanted: dict[bytes, str]) -> frozenset[str] | None:
    """The ``wanted`` entries an environ file holds; None for no answer, and for an empty read (not laid out)."""
    if not data:
        return None
    return frozenset(wanted[e] for e in data.split(b"\0") if e in wanted)


EMPTY_ENV_LOOKS = 3  # ~3 ms: longer than the kernel takes to lay out an environment, paid only by empty ones


def _environ(pid: int) -> bytes | None:
    try:
        return (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None


def _env_laid_out(pid: int) -> bool:
    """Whether the kernel has set ``pid``'s environment's end address (stat field 51, ``env_end``: 0 while an
    ``exec`` has not laid out the new stack yet; absent before Linux 3.5, where nothing can be told: False)."""
    try:
        text = read_text(pid, "stat")
    except OSError:
        return False
    fields = text[text.rfind(")") + 2:].split()  # fields[0] is field 3 (state)
    return len(fields) > 48 and fields[48] != "0"


def signal_exact(pid: int, start: int, signum: int) -> bool:
    """Send ``signum`` to ``pid`` only if it is still the process that started at ``start``; True if sent.

    A pidfd pins the process: once it is open and the start time still matches, the signal cannot reach
    a newcomer that got the same pid. Without pidfds (old kernels) the check and the kill are a hair apart."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd support: check, then kill
        if not alive(pid, start):
            return False
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    try:
        if not alive(pid, start):
            return False
        signal.pidfd_send_signal(fd, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)
