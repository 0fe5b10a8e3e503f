"""Typed errors of local mode (ledger, launcher, agent). Each names what was wrong and what is allowed."""

from __future__ import annotations

from gpuslice.spec.errors import GpusliceError


class StateDirError(GpusliceError):
    """The state dir cannot be created or used (a file in the way, no permission, a read-only disk)."""


class LedgerError(GpusliceError):
    """The ledger file cannot be opened, is locked too long, or holds something unreadable."""


class UnknownGrant(GpusliceError):
    """A grant id that the ledger does not hold."""

    def __init__(self, grant_id: str):
        self.grant_id = grant_id
        super().__init__(f"grant {grant_id!r} is not in the ledger (it was released or never existed)")


class LaunchError(GpusliceError):
    """The command of ``gpuslice run`` could not be started."""


class AgentError(GpusliceError):
    """The agent answered with an error, or its socket did not answer."""


class Forbidden(GpusliceError):
    """The caller may not do this: another user's grant, process or queue ticket (HTTP 403)."""
