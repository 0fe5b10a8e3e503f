"""The device's policy roster (issue 15): each slice's compute share, mode, weight, priority and co-location,
as root wrote them, which every pacer of the device obeys.

Contract (the reader and why: ``native/include/gpuslice/policy.h``): ``<device_state_dir>/<name>.policy/`` holds
one file per grant on the device, named by the grant id, in the slice-file syntax (:mod:`gpuslice.enforcer.
slicefile`; only ``grant``, ``compute``, ``mode``, ``weight``, ``priority`` and ``colocation`` are read). The
folder (0755) and its files (0644) are written by whoever keeps the grants — the local agent, the device plugin,
the DRA driver — and by nobody else: each slice's record file beside it (``<name>.slices/<grant>``,
:mod:`gpuslice.enforcer.devstate`) is written by that slice's tenant, so a policy read from it is whatever that
tenant claims (before the roster, a low-priority tenant said it was high priority, and its neighbours yielded to
it). A pacer trusts a folder and file owned by root or by its own user and writable by no one else (or on a
read-only mount). With no folder it falls back to the slices' own records (a node without a root manager); a
folder it does not trust is a roster that lists nobody. A slice the roster does not list counts
as low priority with no share in its neighbours' allocation, so whoever keeps the grants reconciles the rosters
with its books at start and periodically.

    write_policies(state.device_state, grant_id, grant.slices)   # at grant and at each live resize
    remove_policies(state.device_state, grant_id)                # at release
    reconcile_policies(state.device_state, {grant_id: slices})   # at start and periodically: the books win

Files are replaced by rename (a pacer reads the old file or the new, never a part): running pacers take a
change within ``GS_POL_RECHECK_NS`` (100 ms).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from gpuslice import spec
from gpuslice.enforcer.devfolders import (FOLDER_MODE, ensure_device_folder, is_grant_id, is_ours, prune_entries,
                                          remove_entry)
from gpuslice.enforcer.devstate import RECORDS_SUFFIX, device_stem
from gpuslice.enforcer.slicefile import SliceConfig, format_slice, read_slice_file, write_slice_file
from gpuslice.spec.errors import GpusliceError

SUFFIX = ".policy"
FILE_MODE = 0o644
# Every pacer lists at most this many grants of a device (GS_POL_MAX, native/include/gpuslice/policy.h); a grant
# past it reads as unlisted to its neighbours (no share in their allocation, low priority). So no node side may
# put more slices on one device (kube: --split-count; local placement keeps HAMi's 10).
MAX_GRANTS_PER_DEVICE = 64


class PolicyError(GpusliceError, ValueError):
    """A grant id that cannot name a policy file."""


def folder_name(uuid: str) -> str:
    """The roster folder of ``uuid``, beside its slice records folder: ``GPU-….policy`` (a MIG instance's named
    as the pacer names it, :func:`gpuslice.enforcer.devstate.device_stem`)."""
    return device_stem(uuid) + SUFFIX


def check_grant_id(grant_id: str) -> str:
    if not is_grant_id(grant_id):
        raise PolicyError(f"grant_id: {grant_id!r} is not allowed; expected 1-127 of A-Z a-z 0-9 _ - . "
                          "(not starting with '.')")
    return grant_id


def policy_config(grant_id: str, item: spec.Slice, mps_pipe_dir: str = "") -> SliceConfig:
    """What the roster says of ``grant_id``'s slice ``item`` on its device; for a spatial slice also its MPS daemon
    (the daemon's pipe directory as the node sees it, when the writer knows it): the enforcer caps a yielding
    spatial process only beside a high-priority slice of its own daemon (native/include/gpuslice/mps.h)."""
    spatial = mps_pipe_dir and item.engine is spec.Engine.SPATIAL
    daemon = {"engine": "spatial", "mps_pipe_dir": mps_pipe_dir} if spatial else {}
    return SliceConfig(grant=check_grant_id(grant_id), compute=item.compute, mode=item.mode.value,
                       weight=item.weight, priority=int(item.priority), colocation=item.colocation.value, **daemon)


def ensure_folder(device_state: Path | str, uuid: str) -> Path:
    """``uuid``'s roster folder, made if missing: a real folder of ours that only we write. Whatever else has the
    name (in the sticky device-state folder a tenant may have made it first: a link, a file, a folder of theirs)
    is never followed or written into; it is moved aside to ``.<name>.refused-<ns>`` and the folder made anew
    (:func:`gpuslice.enforcer.devfolders.ensure_device_folder`)."""
    return ensure_device_folder(device_state, folder_name(uuid), "the device's roster folder")


def write_policies(device_state: Path | str, grant_id: str, slices: Iterable[spec.Slice],
                   mps_pipe_dir: str = "") -> tuple[str, ...]:
    """Write ``grant_id``'s policy on each device of ``slices`` (a new file renamed over the old), naming a
    spatial slice's MPS daemon ``mps_pipe_dir`` ("" = not known here); the folder names written, in order."""
    check_grant_id(grant_id)  # before anything is made: nothing half-applied
    done = []
    for item in slices:
        folder = ensure_folder(device_state, item.device_uuid)
        write_slice_file(folder / grant_id, policy_config(grant_id, item, mps_pipe_dir))
        done.append(folder.name)
    return tuple(done)


def set_share(device_state: Path | str, config: SliceConfig, percent: int) -> tuple[str, ...]:
    """A live share for the slice that runs with ``config`` (its slice file) on every device that has a slice
    records folder (``<stem>.slices``) in ``device_state``: its roster entry says ``compute=percent`` and the rest
    of ``config``'s policy. For one user's own state folder (the benchmarks change shares between phases); the
    node side writes whole grants with :func:`write_policies`. The roster folders written."""
    grant = check_grant_id(config.grant)
    names = sorted(p.name[:-len(RECORDS_SUFFIX)] for p in Path(device_state).glob(f"*{RECORDS_SUFFIX}")
                   if p.is_dir() and not p.is_symlink())
    entry = SliceConfig(grant=grant, compute=percent, mode=config.mode, weight=config.weight, priority=config.priority,
                        colocation=config.colocation)
    done = []
    for name in names:
        folder = ensure_folder(device_state, name)
        write_slice_file(folder / grant, entry)
        done.append(folder.name)
    return tuple(done)


def remove_policies(device_state: Path | str, grant_id: str) -> None:
    """Take ``grant_id`` off every roster in ``device_state`` (folders of ours only; a missing one is fine)."""
    if not is_grant_id(grant_id):
        return  # never written
    remove_entry(device_state, SUFFIX, grant_id)


def prune_policies(device_state: Path | str, keep: Iterable[str], *, prefix: str = "", older_than: float = 0.0,
                   now: float | None = None) -> tuple[str, ...]:
    """Take off every roster in ``device_state`` the grants starting with ``prefix`` that are not in ``keep`` and
    whose file is older than ``older_than`` seconds (a grant written a moment ago may not be in a ``keep`` read
    before it). For a writer that learns of a grant's end only from a list of those that remain (the device
    plugin: pods end without telling it). The grants taken off, sorted."""
    keep = set(keep)
    now = time.time() if now is None else now
    gone = prune_entries(device_state, SUFFIX, lambda grant: grant.startswith(prefix) and grant not in keep,
                         older_than, now)
    return tuple(sorted(gone))


@dataclass(frozen=True)
class RosterChanges:
    """What :func:`reconcile_policies` changed: grants written again (missing or out of date), grants taken off,
    and grants it could not write (grant id -> why)."""

    written: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)

    def log(self, logger: logging.Logger) -> None:
        """One line per kind of change: a rewrite is a warning (the roster had lost or changed a grant)."""
        if self.written:
            logger.warning("policy rosters: %d grant(s) missing or out of date, written again: %s", len(self.written),
                           ", ".join(self.written[:8]))
        if self.gone:
            logger.info("policy rosters: %d grant(s) no longer granted taken off", len(self.gone))
        for grant_id, why in self.problems.items():
            logger.warning("policy roster of grant %s cannot be written: %s", grant_id, why)


def _entry_is(path: Path, text: str) -> bool | None:
    """True when ``path`` is our one-link regular file holding ``text``; None when it is missing; else False."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or not is_ours(st) or st.st_nlink != 1 or st.st_size != len(text.encode()):
        return False
    try:
        return path.read_text() == text
    except (OSError, UnicodeDecodeError):
        return False


def reconcile_policies(device_state: Path | str, wanted: Mapping[str, Iterable[spec.Slice]], *, prefix: str = "",
                       older_than: float = 0.0, keep: Iterable[str] = (), now: float | None = None,
                       daemons: Mapping[str, str] | None = None) -> RosterChanges:
    """Make the rosters in ``device_state`` say what the grant keeper's books say: each grant of ``wanted`` (grant
    id -> its slices) written where its file is missing (a grant from before the roster existed, a file a crash or
    a hand removed) or differs from the books and is older than ``older_than`` seconds (a newer one may be a live
    resize the books read here do not hold yet); then the grants starting with ``prefix`` that are in neither
    ``wanted`` nor ``keep`` taken off (:func:`prune_policies`). Run at start and periodically by whoever keeps the
    grants: a grant missing from a roster counts for nothing in its neighbours' allocation. ``daemons``: grant id
    -> its spatial slices' MPS daemon (pipe directory), as :func:`write_policies` names it."""
    now = time.time() if now is None else now
    written, problems = [], {}
    for grant_id, slices in wanted.items():
        try:
            check_grant_id(grant_id)
            for item in slices:
                folder = ensure_folder(device_state, item.device_uuid)
                path = folder / grant_id
                config = policy_config(grant_id, item, (daemons or {}).get(grant_id, ""))
                same = _entry_is(path, format_slice(config))
                if same or (same is False and now - os.lstat(path).st_mtime < older_than):
                    continue
                write_slice_file(path, config)
                written.append(grant_id)
        except (OSError, GpusliceError) as exc:
            problems[grant_id] = str(exc)
    gone = prune_policies(device_state, {*wanted, *keep}, prefix=prefix, older_than=older_than, now=now)
    return RosterChanges(tuple(sorted(set(written))), gone, problems)


def read_policies(device_state: Path | str, uuid: str) -> dict[str, SliceConfig]:
    """Grant id -> policy of ``uuid``'s roster as the pacers read it (``gpuslice ps``, tests): files that are
    links, writable by others or malformed are left out, as the native reader leaves them out."""
    folder = Path(device_state) / folder_name(uuid)
    out: dict[str, SliceConfig] = {}
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        if not is_grant_id(name):
            continue
        try:
            st = os.lstat(folder / name)
            if (not stat.S_ISREG(st.st_mode) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_nlink != 1
                    or st.st_uid not in (0, os.geteuid())):
                continue
            config = read_slice_file(folder / name)
        except (OSError, ValueError):
            continue
        if config.grant == name:
            out[name] = config
    return out


__all__ = ["FILE_MODE", "FOLDER_MODE", "PolicyError", "RosterChanges", "SUFFIX", "check_grant_id", "ensure_folder",
           "folder_name", "policy_config", "prune_policies", "read_policies", "reconcile_policies", "remove_policies",
           "set_share", "write_policies"]
