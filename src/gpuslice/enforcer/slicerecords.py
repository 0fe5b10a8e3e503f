"""The per-slice record files (issue 15): who makes them, and when they go.

Each slice's pacers publish their dynamic state (credit, activity, processes) in a file of that slice alone,
``<device_state_dir>/<stem>.slices/<grant>`` (layout and reader: :mod:`gpuslice.enforcer.devstate`), which only
that slice may write and its neighbours on the device read. Whoever keeps the grants makes them, beside the
roster (:mod:`gpuslice.enforcer.policy`), before any process of the slice starts:

* the folder ``<stem>.slices``: the writer's (root's), 0755; a name a tenant took first in the sticky
  device-state folder is moved aside, never followed (:func:`gpuslice.enforcer.devfolders.ensure_device_folder`);
* the file ``<grant>``, empty, ``O_CREAT|O_EXCL|O_NOFOLLOW`` in that folder, then handed to its owner: locally
  the grant's user, 0644 (``uid``: the user's processes write it, every pacer of the device reads it); in
  Kubernetes root's, 0666 (:data:`SHARED_MODE`: the container's processes may run as any uid, and only that
  container mounts it read-write). An existing file of that owner is kept, never truncated: running processes
  map it (:func:`gpuslice.spec.files.ensure_owned_file`). The first process of the slice sizes and initialises it.

    write_records(state.device_state, grant_id, uuids, uid=grant.uid)   # at grant and at each resize
    remove_records(state.device_state, grant_id)                        # at release
    reconcile_records(state.device_state, {grant_id: (uuids, uid)})     # at start and periodically
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from gpuslice.enforcer.devfolders import ensure_device_folder, is_grant_id, prune_entries, remove_entry
from gpuslice.enforcer.devstate import RECORDS_SUFFIX, records_folder_name
from gpuslice.enforcer.policy import check_grant_id
from gpuslice.spec.errors import GpusliceError
from gpuslice.spec.files import ensure_owned_file

FILE_MODE = 0o644  # a local grant's: its user writes it, every pacer of the device reads it
SHARED_MODE = 0o666  # Kubernetes: root's, reached only through the one container's read-write mount

Wanted = Mapping[str, tuple[Iterable[str], int]]  # grant id -> (its device UUIDs, the uid its files go to)


def ensure_records_folder(device_state: Path | str, uuid: str) -> Path:
    """``uuid``'s slice records folder, made if missing (ours, 0755; whatever a tenant put at the name is moved
    aside)."""
    return ensure_device_folder(device_state, records_folder_name(uuid), "the device's slice records folder")


def write_records(device_state: Path | str, grant_id: str, uuids: Iterable[str], *, uid: int = -1,
                  mode: int = FILE_MODE) -> tuple[str, ...]:
    """Make ``grant_id``'s record file on each device of ``uuids`` (owner ``uid``, -1: this process; ``mode``),
    keeping any that exist; the devices whose file this call made, by folder name."""
    check_grant_id(grant_id)  # before anything is made: nothing half-applied
    made = []
    for uuid in dict.fromkeys(uuids):
        folder = ensure_records_folder(device_state, uuid)
        if ensure_owned_file(folder, grant_id, uid, mode):
            made.append(folder.name)
    return tuple(made)


def remove_records(device_state: Path | str, grant_id: str) -> None:
    """Remove ``grant_id``'s record file from every device's folder of ours (a missing one is fine)."""
    if is_grant_id(grant_id):
        remove_entry(device_state, RECORDS_SUFFIX, grant_id)


def prune_records(device_state: Path | str, doomed: Callable[[str], bool], *, older_than: float = 0.0,
                  now: float | None = None) -> tuple[str, ...]:
    """Remove the record files of the grants ``doomed`` names whose file is older than ``older_than`` seconds (one
    written a moment ago may be of a grant the caller's books predate); the grants removed, sorted."""
    now = time.time() if now is None else now
    return tuple(sorted(prune_entries(device_state, RECORDS_SUFFIX, doomed, older_than, now)))


@dataclass(frozen=True)
class RecordChanges:
    """What :func:`reconcile_records` changed: grants whose file was made again, grants whose files went, and
    grants it could not make a file for (grant id -> why)."""

    made: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)

    def log(self, logger: logging.Logger) -> None:
        if self.made:
            logger.warning("slice records: %d grant(s) had no record file, made again: %s", len(self.made),
                           ", ".join(self.made[:8]))
        if self.gone:
            logger.info("slice records: the files of %d grant(s) no longer granted removed", len(self.gone))
        for grant_id, why in self.problems.items():
            logger.warning("slice record file of grant %s cannot be made: %s", grant_id, why)


def reconcile_records(device_state: Path | str, wanted: Wanted, *, mode: int = FILE_MODE, prefix: str = "",
                      older_than: float = 0.0, keep: Iterable[str] = (), now: float | None = None) -> RecordChanges:
    """Make the record files in ``device_state`` follow the grant keeper's books: each grant of ``wanted`` gets
    its files where missing (owner and ``mode`` as :func:`write_records`), then the files of grants starting with
    ``prefix`` that are in neither ``wanted`` nor ``keep`` and older than ``older_than`` seconds are removed."""
    made, problems = [], {}
    for grant_id, (uuids, uid) in wanted.items():
        try:
            if write_records(device_state, grant_id, uuids, uid=uid, mode=mode):
                made.append(grant_id)
        except (OSError, GpusliceError) as exc:
            problems[grant_id] = str(exc)
    books = {*wanted, *keep}
    gone = prune_records(device_state, lambda g: g.startswith(prefix) and g not in books, older_than=older_than,
                         now=now)
    return RecordChanges(tuple(sorted(made)), gone, problems)


__all__ = ["FILE_MODE", "SHARED_MODE", "RecordChanges", "ensure_records_folder", "prune_records",
           "reconcile_records", "remove_records", "write_records"]
