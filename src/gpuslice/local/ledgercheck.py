"""What the ledger does with rows it cannot read, and with grants it has lost (issue 15).

* **A bad row** (not JSON, a field missing or of the wrong type) is reported by its grant id and skipped: every
  other grant keeps working (one such row used to make every ``ps`` and ``run`` die with a traceback). Its
  slices stay counted by placement when they can still be read, so a damaged record never frees memory that
  a running program may hold; the row itself is left for an operator to remove (the report says how).
* **A lost grant** is a grant folder (``grants/<id>/slice``) with no row: the ledger file was truncated,
  replaced or moved away while grants lived (a ledger truncated to 0 bytes used to forget them silently and
  over-commit the next request). A lost grant that no live process still carries (no process whose
  environment holds its ``GPUSLICE_SLICE``) is over: its folder is removed. One that is still carried cannot
  be placed again safely (its holder is unknown), so the ledger refuses every new grant, naming the grants and
  their processes, until those processes end; then the next request cleans up and proceeds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from gpuslice.host import procs
from gpuslice.local.paths import StateDir
from gpuslice.local.records import GrantRecord
from gpuslice.spec import Grant, SpecError, grant_from_json
from gpuslice.spec.errors import shown


@dataclass(frozen=True)
class BadRow:
    """A ledger row that does not decode: its id, why, and its grant when the slices still read."""

    grant_id: str
    reason: str
    grant: Grant | None = None

    def describe(self, ledger: str) -> str:
        kept = (f"its slices ({', '.join(s.device_uuid for s in self.grant.slices)}) stay reserved"
                if self.grant is not None else "its slices cannot be read")
        return (f"ledger {ledger}: grant {self.grant_id}: unreadable record ({self.reason}); skipped, {kept}; "
                f"once its processes are gone remove it: sqlite3 {ledger} \"DELETE FROM grants WHERE id = "
                f"'{self.grant_id}'\"")


def decode_rows(rows: Sequence[tuple[str, str]]) -> tuple[list[GrantRecord], list[BadRow]]:
    """(grant id, record text) rows → the records that decode, and the rows that do not."""
    good, bad = [], []
    for grant_id, text in rows:
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            bad.append(BadRow(str(grant_id), f"not JSON: {str(exc)[:80]}"))
            continue
        try:
            good.append(GrantRecord.from_json(data))
        except (SpecError, KeyError, TypeError, ValueError, AttributeError) as exc:
            bad.append(BadRow(str(grant_id), _why(exc), _slices_of(data)))
    return good, bad


def _why(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"field {exc.args[0]!r} is missing"
    return shown(str(exc))[1:-1] if isinstance(exc, SpecError) else f"{type(exc).__name__}: {str(exc)[:80]}"


def _slices_of(data: object) -> Grant | None:
    try:
        return grant_from_json(data)
    except (SpecError, KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class LostGrant:
    grant_id: str
    pids: tuple[int, ...]  # live processes carrying its GPUSLICE_SLICE


def lost_grants(state: StateDir, recorded: set[str]) -> list[LostGrant]:
    """Grant folders with a slice file and no ledger row, with the live processes that still carry each."""
    try:
        folders = [p for p in state.grants.iterdir() if p.name not in recorded and (p / "slice").is_file()]
    except OSError:
        return []
    if not folders:
        return []
    stats = procs.all_stats()
    markers = {folder: f"GPUSLICE_SLICE={folder / 'slice'}" for folder in sorted(folders)}
    envs = procs.marked((s.pid for s in stats), markers.values())  # each read once, one wait for all
    return [LostGrant(folder.name, tuple(s.pid for s in stats if marker in (envs[s.pid] or ())))
            for folder, marker in markers.items()]


def refusal(ledger: str, live: Sequence[LostGrant]) -> str:
    """The one-line reason no grant is given while lost grants are still carried by live processes."""
    named = "; ".join(f"{g.grant_id} (processes {', '.join(map(str, g.pids[:5]))})" for g in live)
    return (f"ledger {ledger} has no record of grant(s) whose programs still run: {named}. The ledger file was "
            "truncated, replaced or moved while they were granted, so their memory cannot be accounted for; no "
            "grant is given until those processes end (then their folders are cleaned up and granting resumes)")
