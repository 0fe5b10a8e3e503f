"""The files of one grant: its folder, slice file and region under the state dir.

Who writes what (the trust model, ``native/README.md``): the folder and the slice file are written by
whoever keeps the ledger (root, for a root agent) and stay theirs — mode 0755 and 0644, never handed to the
grant's user, so the user's processes can read the slice they obey but never replace it (issue 15: a user
whose grant folder was chowned to them replaced the slice file and raised their own memory limit). The
region is created here, before any process of the slice starts, owned by the grant's user (``uid``) with
mode 0600: the slice's processes account in it, nobody else can read or write it, and being in a folder
only root writes, it cannot be swapped for a link or another file.

Beside them, on each of the grant's devices: its policy in root's roster (``<stem>.policy/<grant>``, 0644:
:mod:`gpuslice.enforcer.policy`) and its slice record file (``<stem>.slices/<grant>``: made empty here, owned by
the grant's user, 0644, in root's 0755 folder: :mod:`gpuslice.enforcer.slicerecords`) — the slice's pacers write
only that file, every other pacer of the device reads it. Both go at release; the ledger's reconciles bring both
in line with its books at start and periodically (:func:`reconcile_grant_records` for the record files).
"""

from __future__ import annotations

import os
import shutil
from typing import Iterable, Sequence

from gpuslice.enforcer.policy import remove_policies, write_policies
from gpuslice.enforcer.slicerecords import RecordChanges, reconcile_records, remove_records, write_records
from gpuslice.enforcer.region import create_region
from gpuslice.enforcer.slicefile import slice_config, write_slice_file
from gpuslice.local.paths import StateDir
from gpuslice.local.records import GrantRecord

FOLDER_MODE = 0o755
REGION_MODE = 0o600


def write_grant_files(grant: GrantRecord, state: StateDir) -> None:
    """Create the grant's folder, slice file and (empty) region; a live resize writes the slice file again with
    the grant's new generation (a new file renamed over the old one in the same folder, mode 0644: the running
    enforcers see the old file or the new, never a part of one) and leaves the region as it is."""
    folder = state.grant_dir(grant.grant_id)
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    os.chmod(folder, FOLDER_MODE)
    write_slice_file(state.slice_file(grant.grant_id), slice_config(
        grant.grant, region=str(state.region_file(grant.grant_id)), device_state_dir=str(state.device_state),
        mps_pipe_dir=grant.mps_pipe_dir, generation=grant.generation, oom_policy=grant.oom.policy,
        oom_wait_ms=grant.oom.wait_ms))
    # No device records yet: the enforcer in the slice's first process adds each device with its context
    # cost (measured on the card, or configured); until then the monitor shows nothing used.
    create_region(state.region_file(grant.grant_id), mode=REGION_MODE, uid=owner_uid(grant))  # kept if it exists
    # The policy every pacer of each device takes for this slice (its own included): root's roster, never the
    # slice's own record file. A resize writes it again; running pacers take it within 100 ms.
    write_policies(state.device_state, grant.grant_id, grant.slices, grant.mps_pipe_dir)
    # The slice's record file on each device, its user's: kept as it is when it exists (running processes map it).
    write_records(state.device_state, grant.grant_id, grant.grant.uuids, uid=owner_uid(grant))


def owner_uid(grant: GrantRecord) -> int:
    """Who the grant's region and record files belong to: its user under a root agent (-1: the agent itself, for
    a user's own state dir and for grants of root or of no known user)."""
    return grant.uid if os.geteuid() == 0 and grant.uid > 0 else -1


def remove_grant_files(grant_id: str, state: StateDir) -> None:
    remove_policies(state.device_state, grant_id)
    remove_records(state.device_state, grant_id)
    shutil.rmtree(state.grant_dir(grant_id), ignore_errors=True)


def reconcile_grant_records(state: StateDir, grants: Sequence[GrantRecord], keep: Iterable[str],
                            older_than: float) -> RecordChanges:
    """The record files brought in line with the ledger's ``grants``: each made where missing; the files of grants
    in neither ``grants`` nor ``keep`` (rows that do not decode, lost grants whose processes still run) removed
    once older than ``older_than`` seconds (:func:`gpuslice.enforcer.slicerecords.reconcile_records`)."""
    wanted = {g.grant_id: (g.grant.uuids, owner_uid(g)) for g in grants}
    return reconcile_records(state.device_state, wanted, keep=keep, older_than=older_than)
