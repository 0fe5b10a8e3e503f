"""The state dir: the variable wins, then root's system dir, then the user's XDG state dir."""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.local import paths


def test_state_dir_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "s"))
    assert paths.default_state_dir() == tmp_path / "s"
    monkeypatch.delenv("GPUSLICE_STATE_DIR")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert paths.default_state_dir() == Path("/var/lib/gpuslice")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert paths.default_state_dir() == tmp_path / "xdg" / "gpuslice"
