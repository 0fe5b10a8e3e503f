"""Where the enforcer library is looked for, and the error that says where."""

from __future__ import annotations

import pytest

from gpuslice.enforcer import library as enforcer
from gpuslice.enforcer.library import EnforcerNotFound


def test_enforcer_lookup(tmp_path, monkeypatch):
    lib = tmp_path / "libgpuslice.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(lib))
    assert enforcer.find_enforcer() == lib
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(EnforcerNotFound, match="names no file"):
        enforcer.find_enforcer()
    monkeypatch.delenv("GPUSLICE_ENFORCER_LIB")
    monkeypatch.setattr(enforcer, "candidates", lambda: [tmp_path / "nowhere.so"])
    with pytest.raises(EnforcerNotFound, match="make -C native"):
        enforcer.find_enforcer()
