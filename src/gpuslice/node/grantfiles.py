"""The files of one grant: its folder, slice file and region path under the state dir."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpuslice.node.paths import StateDir
from gpuslice.node.records import GrantRecord


def slice_settings(grant: GrantRecord, state: StateDir) -> dict[str, str]:
    """The key=value settings of the grant's slice file (the contract in ARCHITECTURE.md)."""
    first = grant.slices[0]
    settings = {
        "version": "1",
        "grant": grant.grant_id,
        "devices": ",".join(s.device_uuid for s in grant.slices),
        "memory_limit": str(first.memory_limit),
        "compute": str(first.compute),
        "mode": first.mode.value,
        "weight": str(first.weight),
        "priority": str(int(first.priority)),
        "region": str(state.region_file(grant.grant_id)),
        "device_state_dir": str(state.device_state),
        "oom_policy": "return",
        "fail_open": "0",
    }
    for s in grant.slices:
        settings[f"memory_limit.{s.device_uuid}"] = str(s.memory_limit)
    return settings


def write_grant_files(grant: GrantRecord, state: StateDir) -> None:
    """Create the grant's folder and slice file (owned by ``grant.uid`` when we are root)."""
    folder = state.grant_dir(grant.grant_id)
    folder.mkdir(parents=True, exist_ok=True)
    _write_slice(state.slice_file(grant.grant_id), grant, state)
    if os.geteuid() == 0 and grant.uid > 0:
        os.chown(folder, grant.uid, -1)  # the enforcer in the user's processes creates the region here


def _write_slice(path: Path, grant: GrantRecord, state: StateDir) -> None:
    settings = slice_settings(grant, state)
    try:
        from gpuslice.node import slicefile
    except ImportError:  # TEMPORARY until node/slicefile.py lands; then only the branch below
        text = "".join(f"{k}={v}\n" for k, v in settings.items())
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return
    slicefile.write_slice_file(path, settings)


def remove_grant_files(grant_id: str, state: StateDir) -> None:
    shutil.rmtree(state.grant_dir(grant_id), ignore_errors=True)
