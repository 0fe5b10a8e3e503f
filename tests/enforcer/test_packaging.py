"""A wheel carries the enforcer: setup.py builds native/ (`make -C native build/libgpuslice.so`) into
gpuslice/lib/, where ``find_enforcer`` looks after the env override and the checkout's build folder; a
build without a C compiler fails naming what is missing. The builds use this venv's setuptools
(``--no-build-isolation``: no package index needed); test_proto_build checks the isolated build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = "gpuslice/lib/libgpuslice.so"

pytestmark = pytest.mark.slow


def checkout(dest: Path) -> Path:
    """The files an sdist holds (MANIFEST.in): metadata, src/ and native/ without build outputs."""
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "api_pb2*.py", "_generated.py")
    shutil.copytree(ROOT / "src", dest / "src", ignore=skip)
    for part in ("Makefile", "include", "src"):
        source = ROOT / "native" / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, dest / "native" / part)
    return dest


def wheel(src: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_a_wheel_carries_the_enforcer_and_find_enforcer_uses_it(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    (src / "native").mkdir(parents=True)
    checkout(src)
    built = wheel(src, tmp_path / "wheels")
    assert built.returncode == 0, built.stderr[-3000:]
    (whl,) = (tmp_path / "wheels").glob("gpuslice-*.whl")
    assert "-py3-none-linux_" in whl.name, whl.name  # a platform wheel: it holds a native library
    with zipfile.ZipFile(whl) as z:
        assert LIB in z.namelist()
        z.extractall(tmp_path / "site")
    assert (tmp_path / "site" / LIB).read_bytes()[:4] == b"\x7fELF"
    env = {k: v for k, v in os.environ.items() if k != "GPUSLICE_ENFORCER_LIB"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    found = subprocess.run([sys.executable, "-c", "from gpuslice.enforcer.library import find_enforcer; "
                            "print(find_enforcer())"], capture_output=True, text=True, env=env, timeout=60)
    assert found.stdout.strip() == str(tmp_path / "site" / LIB), found.stderr


def test_no_c_compiler_fails_the_build_naming_it(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    (src / "native").mkdir(parents=True)
    checkout(src)
    built = wheel(src, tmp_path / "wheels", CC="/nonexistent/cc")
    assert built.returncode != 0
    assert "needs a C compiler and make" in built.stderr and "/nonexistent/cc" in built.stderr, built.stderr[-3000:]
    assert not list((tmp_path / "wheels").glob("*.whl"))
