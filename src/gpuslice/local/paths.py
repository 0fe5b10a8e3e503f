"""Where local mode keeps its state, and the layout inside.

``GPUSLICE_STATE_DIR`` wins; else ``/var/lib/gpuslice`` for root and ``$XDG_STATE_HOME/gpuslice``
(``~/.local/state/gpuslice``) for everyone else. Layout::

    <state>/ledger.db            SQLite (WAL) ledger: grants and the wait queue
    <state>/agent.sock           the agent's Unix socket (JSON over HTTP) while an agent runs
    <state>/agent.json           the agent's pid and dashboard address
    <state>/grants/<id>/slice    the slice file of a grant (GPUSLICE_SLICE points here)
    <state>/grants/<id>/region   the slice's region (created by the enforcer, read by the monitor)
    <state>/devices/             per-device state of the enforcers (compute pacing), a sticky folder:
    <state>/devices/<stem>.slices/<grant>   each slice's records on the device (its user's, 0644; root's folder)
    <state>/devices/<stem>.policy/<grant>   each slice's policy, root's roster (0644; root's folder)
    <state>/mps/                 the MPS control daemons of spatial slices (gpuslice.host.mpsfleet)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gpuslice.local.errors import StateDirError

STATE_ENV = "GPUSLICE_STATE_DIR"
SYSTEM_STATE_DIR = Path("/var/lib/gpuslice")


def default_state_dir() -> Path:
    """The state dir this process should use (see the module doc)."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuslice"


@dataclass(frozen=True)
class StateDir:
    """The files of one state dir. Nothing is created until :meth:`ensure` is called."""

    root: Path

    @classmethod
    def default(cls) -> "StateDir":
        return cls(default_state_dir())

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    @property
    def socket(self) -> Path:
        return self.root / "agent.sock"

    @property
    def agent_info(self) -> Path:
        return self.root / "agent.json"

    @property
    def grants(self) -> Path:
        return self.root / "grants"

    @property
    def device_state(self) -> Path:
        return self.root / "devices"

    @property
    def mps(self) -> Path:
        return self.root / "mps"

    def grant_dir(self, grant_id: str) -> Path:
        return self.grants / grant_id

    def slice_file(self, grant_id: str) -> Path:
        return self.grant_dir(grant_id) / "slice"

    def region_file(self, grant_id: str) -> Path:
        return self.grant_dir(grant_id) / "region"

    def ensure(self) -> "StateDir":
        """Create the directories (mode 0755; the device-state dir is shared by every slice's processes).
        Raises :class:`StateDirError` naming where the path came from when it cannot be used."""
        try:
            for folder in (self.root, self.grants):
                folder.mkdir(parents=True, exist_ok=True)
            self.device_state.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                _check_roots(self.root)
                os.chmod(self.device_state, 0o1777, follow_symlinks=False)
        except OSError as exc:
            raise StateDirError(_unusable(self.root, exc)) from None
        return self


    def prepare_device_state(self, uuids: Iterable[str]) -> None:
        """Make each device's (and MIG instance's) folders as root, before any tenant can name them: the slice
        records folder ``<stem>.slices`` (root's, 0755: each slice's file in it is made at grant time) and the
        policy roster ``<stem>.policy`` (root's, 0755). A name a tenant took first in the sticky devices folder
        is moved aside, never followed (:mod:`gpuslice.enforcer.devfolders`). Nothing to do for a user's own
        state dir: nobody else writes it."""
        from gpuslice.enforcer.policy import ensure_folder
        from gpuslice.enforcer.slicerecords import ensure_records_folder

        if os.geteuid() != 0:
            return
        for uuid in uuids:
            for ensure in (ensure_records_folder, ensure_folder):
                try:
                    ensure(self.device_state, uuid)
                except OSError:
                    pass  # a name taken again and again (a mount): grants on that device fail, naming it


def _check_roots(root: Path) -> None:
    """Root keeps grants only where no one else can swap a path under it: the state dir and every folder above
    it owned by root and writable by root alone (a sticky folder like /tmp may be world-writable: nobody can
    replace root's entries there); ``grants`` and ``devices`` must be real folders, not links. Raises
    PermissionError naming the folder otherwise (the trust model, native/README.md)."""
    import errno
    import stat

    for folder in (root / "grants", root / "devices"):
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise PermissionError(errno.EPERM, "a symbolic link where root keeps grants", str(folder))
    for folder in (root, *root.parents):
        st = os.stat(folder)
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise PermissionError(errno.EPERM, f"owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:04o}: "
                                  "root keeps grants only in folders that only root can change", str(folder))


def _unusable(root: Path, exc: OSError) -> str:
    """One line naming where the path came from (the variable the user set, or the default) and the fix."""
    reason = exc.strerror or str(exc)
    explicit = os.environ.get(STATE_ENV)
    if explicit and Path(explicit).expanduser().resolve() == root:
        return (f"{STATE_ENV}={explicit}: cannot use it as the state dir ({reason}: {exc.filename or root}); "
                "expected a directory that can be created and written")
    return (f"state dir {root} (the default): cannot use it ({reason}); set {STATE_ENV} to a directory that "
            "can be created and written")
