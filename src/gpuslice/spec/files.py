"""File operations root does in folders others may reach.

``write_atomic``: a whole file, so that readers see the old text or the new one, never a part (temporary file in
the same directory, then rename): the slice files the enforcer reads, ``agent.json``, ``ld.so.preload``.
``open_regular``: a plain file only, never a link, FIFO or device (a tenant's planted name cannot steer or hang
root). ``ensure_owned_file``: an empty file made ``O_EXCL`` and handed to its owner, or the owner's existing one
kept (the per-slice record files, :mod:`gpuslice.enforcer.slicerecords`). ``remove_tree``: a folder a tenant
could fill, moved aside at once and deleted in the background (MPS daemons' folders; Kubernetes grant folders too)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("gpuslice.files")

# The folder, beside the entries of a root-owned parent, where remove_tree moves tenant trees being removed: no
# daemon, grant or claim is named so, so every listing of those entries passes it by.
LEFT = ".left"


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644, encoding: str = "utf-8") -> None:
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class NotRegularFile(OSError):
    """A path that must name a plain file names something else (a FIFO, a device, a directory, a link)."""


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, follow: bool = False,
                 dir_fd: int | None = None) -> int:
    """Open ``path`` (relative to ``dir_fd`` when given) as a plain file and return the descriptor: a symbolic
    link as the last component is not followed (``O_NOFOLLOW``; ``follow=True`` for a path the caller chose
    itself), and a FIFO or device is
    refused (opened with ``O_NONBLOCK`` so the open itself cannot hang; the flag is cleared again for a
    regular file). Raises :class:`OSError` (ELOOP for a link, :class:`NotRegularFile` for anything else that is
    not a regular file).

    Root reads and writes files in folders tenants can write to (regions, slice record files, slice files); a
    tenant could put a link there to make root read or change another file, or a FIFO to hang it."""
    import fcntl

    path = os.fspath(path)
    fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_owned_file(folder: str | os.PathLike[str], name: str, uid: int = -1, mode: int = 0o644) -> bool:
    """Make sure ``folder/name`` is a regular file owned by ``uid`` (-1: by this process) with ``mode``; True if
    this call made it. A new file is made empty, ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to the folder (opened
    ``O_NOFOLLOW``), then ``fchown``ed and ``fchmod``ed through its descriptor. An existing regular file of that
    owner is kept, never truncated (running processes map it); only its mode is put back if it changed.
    Anything else at the name (a link, a FIFO, another owner's file) is removed, never followed, and the file
    made anew; a folder there raises IsADirectoryError. For folders only this process writes (the per-device
    slice record folders, issue 15): what is in them is ours to replace."""
    owner = os.geteuid() if uid < 0 else uid
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(3):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
            except FileExistsError:
                if _keep_owned(dfd, name, owner, mode):
                    return False
                continue  # not ours: removed; made again
            _own(fd, dfd, name, owner, mode)
            return True
        raise FileExistsError(errno.EEXIST, "kept changing while being made", os.path.join(folder, name))
    finally:
        os.close(dfd)


def _own(fd: int, dfd: int, name: str, owner: int, mode: int) -> None:
    """Hand the file just made to ``owner`` with ``mode``; on failure it is removed again (nothing half made)."""
    try:
        if owner != os.geteuid():
            os.fchown(fd, owner, -1)
        os.fchmod(fd, mode)
    except BaseException:
        os.unlink(name, dir_fd=dfd)
        raise
    finally:
        os.close(fd)


def _keep_owned(dfd: int, name: str, owner: int, mode: int) -> bool:
    """True when ``name`` is a regular file of ``owner`` (its mode put back to ``mode``); else it is removed."""
    try:
        fd = open_regular(name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    except BlockingIOError:  # its owner holds a lease on it (an open would wait for the lease's break)
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return stat.S_ISREG(st.st_mode) and st.st_uid == owner or _remove(dfd, name)
    except OSError as exc:  # a link (ELOOP), a FIFO or device (NotRegularFile), a folder (NotRegularFile)
        if not isinstance(exc, NotRegularFile) and exc.errno != errno.ELOOP:
            raise
        return _remove(dfd, name)
    try:
        st = os.fstat(fd)
        if st.st_uid == owner:
            if stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
            return True
    finally:
        os.close(fd)
    return _remove(dfd, name)


def _remove(dfd: int, name: str) -> bool:
    """Unlink ``name`` (never followed; a folder raises IsADirectoryError); False, for :func:`_keep_owned`."""
    os.unlink(name, dir_fd=dfd)
    return False


def remove_tree(path: Path, aside: Path) -> bool:
    """Remove ``path``, a folder a tenant can fill (an MPS daemon's pipe, log and shm folders are the slice user's)
    or one whose removal must not fail a pass (a Kubernetes grant's folders: only the node writes them), never
    raising and never waiting on what is inside: a pass under a lock (the ledger's, a claim's) must not fail or
    stall because of what a tenant put there. It is
    renamed into ``aside`` (root's, on the same file system) at once, one step whatever it holds, and deleted
    there by a background thread. Deleted in place, a tree nested deeper than Python's recursion limit (a tenant
    makes ~1,100 levels in seconds) raised RecursionError through ``ignore_errors`` and failed every ledger
    transaction (helper 41), and millions of files held the lock for minutes (helper 42). What the thread cannot
    delete (such a deep tree) stays in ``aside`` for an admin (``rm -rf`` walks any depth); a process that ends
    first leaves the rest there too. True when ``path`` is gone from its place (or never was); False when it
    could not be moved (logged)."""
    if not os.path.lexists(path):
        return True
    target = aside / f"{path.parent.name}-{path.name}-{time.time_ns()}"
    try:
        aside.mkdir(mode=0o700, exist_ok=True)
        os.rename(path, target)
    except OSError as exc:
        log.warning("%s could not be moved aside for removal: %s", path, exc)
        return False
    threading.Thread(target=_delete, args=(target,), name="gpuslice-remove", daemon=True).start()
    return True


def _delete(target: Path) -> None:
    try:
        shutil.rmtree(target, ignore_errors=True)
    except RecursionError:
        log.warning("%s is nested too deep to delete here: left for an admin (rm -rf)", target)
