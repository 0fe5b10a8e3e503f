"""The device plugin's gRPC modules are generated when gpuslice is built, not at run time: a wheel built
from a clean copy of the sources (no generated files in it) carries api_pb2.py, api_pb2_grpc.py and
_generated.py; an editable install generates them into the source folder; and without them ``load()``
says how to get them instead of compiling.

The builds use pip's default build isolation, so pip fetches [build-system].requires (setuptools, wheel,
grpcio-tools) from the package index or its cache, as any install does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("api_pb2.py", "api_pb2_grpc.py", "_generated.py")
PKG = Path("gpuslice", "kube", "deviceplugin")

pytestmark = pytest.mark.slow


def clean_copy(dest: Path) -> Path:
    """pyproject.toml, setup.py, README.md and src/ without generated modules or caches."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", *GENERATED, ".api*"))
    assert not any((dest / "src" / PKG / n).exists() for n in GENERATED)
    return dest


def run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=280, **kw)
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def load_in(path: Path) -> subprocess.CompletedProcess[str]:
    """`load()` in a fresh interpreter with ``path`` first on sys.path (so its gpuslice wins)."""
    code = ("from gpuslice.kube.deviceplugin import load\n"
            "try:\n    pb, rpc = load()\nexcept Exception as e:\n    print('ERROR', type(e).__name__, e)\n"
            "else:\n    print('OK', pb.__file__, hasattr(rpc, 'DevicePluginServicer'))\n")
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_a_fresh_wheel_carries_the_generated_modules(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    src.mkdir()
    clean_copy(src)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheels"), str(src)])
    (wheel,) = (tmp_path / "wheels").glob("gpuslice-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for n in GENERATED:
            assert (PKG / n).as_posix() in names, f"{n} missing from {wheel.name}"
        assert (PKG / "api.proto").as_posix() in names
        z.extractall(tmp_path / "site")
    # The wheel's modules load (no grpcio-tools needed: nothing is compiled at run time) ...
    out = load_in(tmp_path / "site")
    assert out.stdout.startswith("OK " + str(tmp_path / "site")) and out.stdout.strip().endswith("True"), out
    # ... a stale copy is refused, with the fix named ...
    gen = tmp_path / "site" / PKG / "_generated.py"
    gen.write_text('PROTO_SHA256 = "0"\n')
    out = load_in(tmp_path / "site")
    assert "ERROR GpusliceError" in out.stdout and "older than" in out.stdout, out
    # ... and missing modules are named, with how to get them, instead of compiled on the fly.
    for n in GENERATED:
        (tmp_path / "site" / PKG / n).unlink()
    out = load_in(tmp_path / "site")
    assert "ERROR GpusliceError" in out.stdout and "pip install" in out.stdout, out
    assert "python -m gpuslice.kube.deviceplugin" in out.stdout
    assert not (tmp_path / "site" / PKG / "api_pb2.py").exists()


def test_an_editable_install_generates_them_in_the_source_folder(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    src.mkdir()
    clean_copy(src)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e", str(src)])
    for n in GENERATED:
        assert (src / "src" / PKG / n).is_file(), f"{n} was not generated into the checkout"
    out = load_in(src / "src")
    assert out.stdout.startswith("OK "), out
