"""The files of one grant: its folder, slice file and region path under the state dir."""

from __future__ import annotations

import os
import shutil

from gpuslice.local.paths import StateDir
from gpuslice.local.records import GrantRecord
from gpuslice.enforcer.slicefile import slice_config, write_slice_file


def write_grant_files(grant: GrantRecord, state: StateDir) -> None:
    """Create the grant's folder and slice file (owned by ``grant.uid`` when we are root); a live resize
    writes it again with the grant's new generation (a new file renamed over the old one in the same folder,
    mode 0644: the running enforcers see the old file or the new, never a part of one)."""
    folder = state.grant_dir(grant.grant_id)
    folder.mkdir(parents=True, exist_ok=True)
    write_slice_file(state.slice_file(grant.grant_id), slice_config(
        grant.grant, region=str(state.region_file(grant.grant_id)), device_state_dir=str(state.device_state),
        mps_pipe_dir=grant.mps_pipe_dir, generation=grant.generation, oom_policy=grant.oom.policy,
        oom_wait_ms=grant.oom.wait_ms))
    # The region is created by the enforcer in the first process of the slice (with its configured
    # per-context overhead on each device record); until then the monitor shows nothing used.
    if os.geteuid() == 0 and grant.uid > 0:
        os.chown(folder, grant.uid, -1)  # the enforcer in the user's processes creates the region here


def remove_grant_files(grant_id: str, state: StateDir) -> None:
    shutil.rmtree(state.grant_dir(grant_id), ignore_errors=True)
