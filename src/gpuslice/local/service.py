"""Pick who grants: the agent when one answers on its socket, else the ledger file directly."""

from __future__ import annotations

import os
import pwd

from gpuslice.local.client import AgentClient, GrantService, find_agent_socket
from gpuslice.local.paths import STATE_ENV, SYSTEM_STATE_DIR, StateDir
from gpuslice.spec import Device

FIRST_LOGIN_UID = 1000  # uids below are system accounts (Debian/Fedora/Ubuntu default UID_MIN)


def open_service(state: StateDir) -> tuple[GrantService, list[Device]]:
    """The grant service and the node's devices (from the agent, or discovered here)."""
    socket_path = find_agent_socket(state)
    if socket_path is not None:
        client = AgentClient(socket_path)
        return client, client.devices()
    from gpuslice.host.devices import discover
    from gpuslice.local.ledger import Ledger

    devices = discover()
    return Ledger(state, devices), devices


def snapshot_note() -> str | None:
    """One line when the devices come from a snapshot (``GPUSLICE_DEVICE_SNAPSHOT``): grants and slice files
    are real, but there is no GPU behind them, so nothing is enforced."""
    from gpuslice.host.devices import SNAPSHOT_ENV

    name = os.environ.get(SNAPSHOT_ENV)
    if not name:
        return None
    return (f"note: devices come from the snapshot {name!r} ({SNAPSHOT_ENV}), not from NVML: the grant is recorded "
            "and the slice file written, but no GPU is behind them, so nothing is enforced")


def private_ledger_warning(service: GrantService, state: StateDir) -> str | None:
    """One line for a non-root user granting from a ledger of their own on a machine other people use.

    Without a root agent, each user's default state dir is in their home: two users' ledgers never see each
    other, so together they can over-commit a GPU. Said only when that can happen: not root, no agent, no
    explicit ``GPUSLICE_STATE_DIR`` (a chosen, perhaps shared, dir), and another login account exists."""
    if isinstance(service, AgentClient) or os.geteuid() == 0 or os.environ.get(STATE_ENV):
        return None
    others = other_login_users()
    if not others:
        return None
    named = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
    return (f"warning: no root agent answers at {StateDir(SYSTEM_STATE_DIR).socket}, so this grant is in your own "
            f"ledger ({state.ledger}) only: slices of other users ({named}) are not counted and together you can "
            "over-commit a GPU; ask an admin to run `gpuslice agent` as root (one ledger for everyone)")


def other_login_users() -> list[str]:
    """Login accounts other than ours (uid from 1000 up, not nobody's 65534, a shell that allows login)."""
    me = os.getuid()
    found = []
    for entry in pwd.getpwall():
        if entry.pw_uid == me or not FIRST_LOGIN_UID <= entry.pw_uid < 65534:
            continue
        if entry.pw_shell.endswith(("/nologin", "/false")):
            continue
        found.append(entry.pw_name)
    return sorted(set(found))
