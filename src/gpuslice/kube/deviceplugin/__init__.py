"""The kubelet device-plugin API v1beta1 (``api.proto`` here), compiled with grpcio-tools on first use.

``load()`` returns ``(api_pb2, api_pb2_grpc)``. The generated modules are not committed: they are built
from ``api.proto`` into this folder when it is writable (an editable install, a source checkout), else into
``$XDG_CACHE_HOME/gpuslice/deviceplugin/<hash of api.proto>``, and rebuilt when ``api.proto`` changes.
A container image should run ``python -m gpuslice.kube.deviceplugin`` at build time so the plugin never
needs grpcio-tools at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from gpuslice.errors import GpusliceError

HERE = Path(__file__).resolve().parent
PROTO = HERE / "api.proto"
PACKAGE = __name__  # gpuslice.kube.deviceplugin
_loaded: tuple[ModuleType, ModuleType] | None = None


def _digest() -> str:
    return hashlib.sha256(PROTO.read_bytes()).hexdigest()[:16]


def _stamp_ok(folder: Path) -> bool:
    stamp = folder / ".api.sha"
    return (folder / "api_pb2.py").exists() and (folder / "api_pb2_grpc.py").exists() and \
        stamp.exists() and stamp.read_text().strip() == _digest()


def _compile(folder: Path) -> None:
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise GpusliceError("the device-plugin API is not compiled and grpcio-tools is missing; install "
                            "grpcio-tools or run `python -m gpuslice.kube.deviceplugin` where it is") from exc
    import grpc_tools

    with tempfile.TemporaryDirectory() as tmp:
        # Lay the proto out under its package path so the generated grpc module imports
        # `from gpuslice.kube.deviceplugin import api_pb2`.
        src = Path(tmp) / "src"
        target = src / Path(*PACKAGE.split("."))
        target.mkdir(parents=True)
        (target / "api.proto").write_bytes(PROTO.read_bytes())
        out = Path(tmp) / "out"
        out.mkdir()
        include = Path(grpc_tools.__file__).parent / "_proto"
        rel = str(Path(*PACKAGE.split(".")) / "api.proto")
        code = protoc.main(["grpc_tools.protoc", f"-I{src}", f"-I{include}", f"--python_out={out}",
                            f"--grpc_python_out={out}", rel])
        if code != 0:
            raise GpusliceError(f"protoc failed on {PROTO} (exit {code})")
        made = out / Path(*PACKAGE.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("api_pb2.py", "api_pb2_grpc.py"):
            tmpfile = folder / f".{name}.{os.getpid()}"
            tmpfile.write_bytes((made / name).read_bytes())
            os.replace(tmpfile, folder / name)
        (folder / ".api.sha").write_text(_digest() + "\n")


def _folder() -> Path:
    if _stamp_ok(HERE):
        return HERE
    if os.access(HERE, os.W_OK):
        try:
            _compile(HERE)
            return HERE
        except OSError:
            pass
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuslice" / "deviceplugin" / _digest()
    if not _stamp_ok(cache):
        _compile(cache)
    return cache


def load() -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)``, compiling ``api.proto`` first when needed."""
    global _loaded
    if _loaded is not None:
        return _loaded
    folder = _folder()
    modules = []
    for name in ("api_pb2", "api_pb2_grpc"):
        full = f"{PACKAGE}.{name}"
        if full in sys.modules:
            modules.append(sys.modules[full])
            continue
        spec = importlib.util.spec_from_file_location(full, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules[PACKAGE], name, module)
        modules.append(module)
    _loaded = (modules[0], modules[1])
    return _loaded
