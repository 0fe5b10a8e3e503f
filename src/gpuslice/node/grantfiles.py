"""The files of one grant: its folder, slice file and region path under the state dir."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpuslice.node.paths import StateDir
from gpuslice.node.records import GrantRecord
from gpuslice.node.slicefile import SliceConfig, write_slice_file


def slice_config(grant: GrantRecord, state: StateDir) -> SliceConfig:
    """The grant's slice file contents (the contract in ARCHITECTURE.md / native/README.md)."""
    first = grant.slices[0]
    return SliceConfig(
        devices=tuple(s.device_uuid for s in grant.slices),
        memory_limit=first.memory_limit,
        memory_limits={s.device_uuid: s.memory_limit for s in grant.slices if s.memory_limit != first.memory_limit},
        grant=grant.grant_id,
        compute=first.compute,
        mode=first.mode.value,
        weight=first.weight,
        priority=int(first.priority),
        region=str(state.region_file(grant.grant_id)),
        device_state_dir=str(state.device_state),
        oom_policy="return",
        fail_open=False,
    )


def write_grant_files(grant: GrantRecord, state: StateDir) -> None:
    """Create the grant's folder and slice file (owned by ``grant.uid`` when we are root)."""
    folder = state.grant_dir(grant.grant_id)
    folder.mkdir(parents=True, exist_ok=True)
    _write_slice(state.slice_file(grant.grant_id), grant, state)
    # The region is created by the enforcer in the first process of the slice (with its configured
    # per-context overhead on each device record); until then the monitor shows nothing used.
    if os.geteuid() == 0 and grant.uid > 0:
        os.chown(folder, grant.uid, -1)  # the enforcer in the user's processes creates the region here


def _write_slice(path: Path, grant: GrantRecord, state: StateDir) -> None:
    write_slice_file(path, slice_config(grant, state))


def remove_grant_files(grant_id: str, state: StateDir) -> None:
    shutil.rmtree(state.grant_dir(grant_id), ignore_errors=True)
