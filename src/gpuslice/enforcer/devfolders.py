"""The per-device folders the grant keeper makes in the device-state folder, one file per grant in each:

    <device_state_dir>/<stem>.policy/<grant>   the roster: each slice's policy (:mod:`gpuslice.enforcer.policy`)
    <device_state_dir>/<stem>.slices/<grant>   the slice records (:mod:`gpuslice.enforcer.slicerecords`)

(``<stem>``: :func:`gpuslice.enforcer.devstate.device_stem`.) The device-state folder of a root agent is sticky and
world-writable, so a tenant may take such a name before root does (a link, a file, a folder of its own, a mount):
root never follows or writes into what it did not make; it moves it aside (``.<name>.refused-<ns>``) and makes
its own folder, 0755. A folder is root's (the writer's) when it is a real folder owned by the writer's euid that
nobody else may write. The same rules for both kinds; only the suffix differs.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from pathlib import Path
from typing import Callable

FOLDER_MODE = 0o755
# A grant id as an entry's name in both kinds of folder (native: policy.c's gs_pol_valid_name).
GRANT_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,126}")


def is_grant_id(name: object) -> bool:
    """Whether ``name`` can name a grant's entry: 1-127 of A-Z a-z 0-9 _ - . (not starting with '.')."""
    return isinstance(name, str) and GRANT_RE.fullmatch(name) is not None


def is_ours(st: os.stat_result) -> bool:
    """Owned by this process's euid and writable by no one else."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def our_folders(device_state: Path | str, suffix: str) -> list[Path]:
    """The folders ``*<suffix>`` in ``device_state`` that are real folders of ours (never a link or a tenant's)."""
    root = Path(device_state)
    try:
        names = [n for n in os.listdir(root) if n.endswith(suffix) and not n.startswith(".")]
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        try:
            st = os.lstat(root / name)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and is_ours(st):
            out.append(root / name)
    return out


def ensure_device_folder(device_state: Path | str, name: str, what: str) -> Path:
    """``device_state/name``, made if missing: a real folder of ours (0755) that only we write. Whatever else has
    the name is never followed or written into; it is moved aside to ``.<name>.refused-<ns>`` and the folder made
    anew. ``what`` names the folder in errors (``the device's roster folder``)."""
    folder = Path(device_state) / name
    for _ in range(3):
        try:
            os.mkdir(folder, FOLDER_MODE)
            os.chmod(folder, FOLDER_MODE, follow_symlinks=False)  # umask must not narrow it: every pacer reads it
            return folder
        except FileExistsError:
            pass
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue  # gone meanwhile: make it again
        # A mount there (a tenant's FUSE file system can claim any owner) is never ours either.
        if stat.S_ISDIR(st.st_mode) and is_ours(st) and st.st_dev == os.lstat(folder.parent).st_dev:
            return folder
        _move_aside(folder, what)
    raise OSError(errno.EEXIST, f"{what} keeps being taken", str(folder))


def _move_aside(folder: Path, what: str) -> None:
    try:
        os.rename(folder, folder.with_name(f".{folder.name}.refused-{time.time_ns()}"))
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        raise OSError(errno.EBUSY, f"something is mounted at {what} (a tenant's file system?); pacers do not "
                      "trust it: unmount it", str(folder)) from None


def remove_entry(device_state: Path | str, suffix: str, name: str) -> None:
    """Remove ``name`` from every folder ``*<suffix>`` of ours in ``device_state`` (a missing one is fine)."""
    for folder in our_folders(device_state, suffix):
        try:
            os.unlink(folder / name)
        except FileNotFoundError:
            continue


def prune_entries(device_state: Path | str, suffix: str, doomed: Callable[[str], bool], older_than: float,
                  now: float) -> set[str]:
    """Remove from every folder ``*<suffix>`` of ours the entries ``doomed`` names that are older than
    ``older_than`` seconds (their mtime: one made a moment ago may be of a grant the caller's books predate).
    The names removed."""
    gone = set()
    for folder in our_folders(device_state, suffix):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for name in entries:
            if name.startswith(".") or not doomed(name):
                continue
            try:
                if now - os.lstat(folder / name).st_mtime >= older_than:
                    os.unlink(folder / name)
                    gone.add(name)
            except FileNotFoundError:
                continue
    return gone
