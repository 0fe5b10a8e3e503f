"""Write a whole file so that readers see the old text or the new one, never a part (temporary file in
the same directory, then rename). Shared by the slice files the enforcer reads, the agent's
``agent.json`` that clients and tests poll for, and the device plugin's ``ld.so.preload``."""

from __future__ import annotations

import os
import tempfile


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


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, follow: bool = False) -> int:
    """Open ``path`` as a plain file and return the descriptor: a symbolic link as the last component is not
    followed (``O_NOFOLLOW``; ``follow=True`` for a path the caller chose itself), and a FIFO or device is
    refused (opened with ``O_NONBLOCK`` so the open itself cannot hang; the flag is cleared again for a
    regular file). Raises :class:`OSError` (ELOOP for a link, :class:`NotRegularFile` for anything else that is
    not a regular file).

    Root reads and writes files in folders tenants can write to (regions, pacing files, slice files); a
    tenant could put a link there to make root read or change another file, or a FIFO to hang it."""
    import errno
    import fcntl
    import stat

    path = os.fspath(path)
    fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_shared_file(folder: str | os.PathLike[str], name: str, mode: int = 0o666) -> bool:
    """Make sure ``folder/name`` is a regular file, creating it with ``mode`` if it is missing; True if this
    call created it. A name that exists is never followed (a link there is an error: ELOOP), never chmod'ed
    and never truncated, and must be a regular file with a single link (:class:`NotRegularFile` otherwise):
    root creates the files every slice shares in folders tenants may have written to first (issue 15)."""
    import errno
    import stat

    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(3):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                try:
                    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=dfd)
                except FileExistsError:
                    continue  # someone made it just now: look at theirs
                try:
                    os.fchmod(fd, mode)  # ours, just made: the one file we may widen
                finally:
                    os.close(fd)
                return True
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise NotRegularFile(errno.EINVAL, "not a regular file with a single link", os.path.join(folder, name))
            return False
        raise FileExistsError(errno.EEXIST, "kept changing while being created", os.path.join(folder, name))
    finally:
        os.close(dfd)
