"""Choosing who grants: the private-ledger warning for users who could over-commit each other."""

from __future__ import annotations

import os

from gpuslice.local import paths


def test_private_ledger_warning_only_where_users_can_over_commit_each_other(monkeypatch, tmp_path):
    import pwd

    from gpuslice.local import service
    from gpuslice.local.client import AgentClient

    def account(name, uid, shell="/bin/bash"):
        return pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", shell))

    accounts = [account("root", 0), account("me", 1000), account("alice", 1001), account("svc", 1002, "/usr/sbin/nologin"),
                account("nobody", 65534)]
    monkeypatch.setattr(pwd, "getpwall", lambda: accounts)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("GPUSLICE_STATE_DIR", raising=False)
    state = paths.StateDir(tmp_path / "s")
    ledger = object()
    line = service.private_ledger_warning(ledger, state)
    assert line is not None and "alice" in line and "svc" not in line and str(state.ledger) in line
    assert "gpuslice agent" in line and "\n" not in line
    assert service.private_ledger_warning(AgentClient.__new__(AgentClient), state) is None  # an agent: one ledger
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "chosen"))
    assert service.private_ledger_warning(ledger, state) is None  # a dir the user chose (maybe shared)
    monkeypatch.delenv("GPUSLICE_STATE_DIR")
    accounts[:] = [account("root", 0), account("me", 1000)]
    assert service.private_ledger_warning(ledger, state) is None  # a one-person machine
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert service.private_ledger_warning(ledger, state) is None  # root: the system ledger

