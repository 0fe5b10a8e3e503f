"""Which grant a GPU process provably belongs to, for the backstop (:mod:`gpuslice.host.backstop`).

The same proofs as the reclaimer's (:func:`gpuslice.local.ledger.slice_processes`), asked the other way round
(pid → grant) and only about the processes NVML lists:

* **lineage**: the process descends from the grant's live holder (the ``gpuslice run`` launcher is a child
  subreaper: every process of the command's tree stays below it, ``setsid`` or not), or is in the launched
  process group while its leader is still the launched process;
* **marker**: its environment carries ``GPUSLICE_SLICE=<the grant's slice file>`` and its real uid is the
  grant's owner's (anyone may put a marker in their own environment; it proves only processes the owner could
  signal anyway). A grant whose record names no owner (``uid`` -1: a root caller that gave none, or a ledger of
  before owners were recorded) is owned by its live holder's user; with no live holder the marker proves nothing.
  Before, any user's marked process counted against such a grant (issue 15, attacker's review): a tenant could
  push a root grant over its limit and have the backstop kill that grant's processes.

A process none of this ties to a grant is nobody's: the backstop reports it and never counts it against a
slice, so no tenant can make another's slice look over its limit.
"""

from __future__ import annotations

from typing import Sequence

from gpuslice.host import procs
from gpuslice.local.records import GrantRecord

MARKER = b"GPUSLICE_SLICE="


def attribute(grants: Sequence[GrantRecord], pids: Sequence[int]) -> dict[int, str]:
    """``{pid: grant id}`` for the ``pids`` that provably belong to one of ``grants``."""
    if not pids or not grants:
        return {}
    stats = procs.all_stats()
    by_pid = {s.pid: s for s in stats}
    holders = {g.holder_pid: g for g in grants
               if g.holder_pid in by_pid and by_pid[g.holder_pid].start == g.holder_start}
    groups = {g.child_pid: g for g in grants
              if g.child_pid > 0 and g.child_pid in by_pid and by_pid[g.child_pid].start == g.child_start}
    by_slice = {g.slice_file: g for g in grants if g.slice_file}
    out = {}
    for pid in pids:
        s = by_pid.get(pid)
        if s is None:
            continue
        grant = _by_lineage(s, by_pid, holders) or _by_group(s, groups) or _by_marker(pid, by_slice, holders)
        if grant is not None:
            out[pid] = grant.grant_id
    return out


def _by_lineage(s: procs.ProcStat, by_pid: dict[int, procs.ProcStat],
                holders: dict[int, GrantRecord]) -> GrantRecord | None:
    seen = 0
    while s is not None and seen < 4096:  # a parent chain is finite; the bound guards against a /proc race loop
        if s.ppid in holders:
            return holders[s.ppid]
        s = by_pid.get(s.ppid)
        seen += 1
    return None


def _by_group(s: procs.ProcStat, groups: dict[int, GrantRecord]) -> GrantRecord | None:
    g = groups.get(s.pgrp)
    return g if g is not None and s.start >= g.child_start else None


def _by_marker(pid: int, by_slice: dict[str, GrantRecord], holders: dict[int, GrantRecord]) -> GrantRecord | None:
    try:
        env = (procs.PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    for entry in env.split(b"\0"):
        if entry.startswith(MARKER):
            grant = by_slice.get(entry[len(MARKER):].decode(errors="replace"))
            if grant is None:
                return None
            owner = owner_uid(grant, grant.holder_pid in holders)
            return grant if owner is not None and procs.real_uid(pid) == owner else None
    return None


def owner_uid(grant: GrantRecord, holder_alive: bool) -> int | None:
    """The user whose processes a grant's marker may prove: the recorded owner, else (``uid`` -1) the real uid of
    its live holder; None when neither is known (then the marker proves nothing)."""
    if grant.uid >= 0:
        return grant.uid
    return procs.real_uid(grant.holder_pid) if holder_alive else None
