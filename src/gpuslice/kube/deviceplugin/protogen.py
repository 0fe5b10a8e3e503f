"""Generate the Python gRPC code of ``api.proto`` (build time only).

Run by ``setup.py``'s ``build_py`` step (``pip install .``, ``pip wheel .``, ``pip install -e .``) with
grpcio-tools from ``[build-system].requires``, and by ``python -m gpuslice.kube.deviceplugin`` in a source
checkout. Standard library + ``grpc_tools`` only: ``setup.py`` loads this file by path, before gpuslice
or its dependencies are installed.

Writes, next to ``api.proto``'s package path in ``target``: ``api_pb2.py``, ``api_pb2_grpc.py`` and
``_generated.py`` (``PROTO_SHA256``: which ``api.proto`` they were made from, so a stale copy is caught).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

PACKAGE = "gpuslice.kube.deviceplugin"
PROTO = Path(__file__).resolve().with_name("api.proto")
GENERATED = ("api_pb2.py", "api_pb2_grpc.py", "_generated.py")


def digest(proto: Path = PROTO) -> str:
    return hashlib.sha256(proto.read_bytes()).hexdigest()


def generate(target: Path, proto: Path = PROTO) -> list[Path]:
    """Compile ``proto`` into ``target`` (the package folder); returns the files written."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - the build requirements name it
        raise RuntimeError("generating the device-plugin API needs grpcio-tools (it is in "
                           "[build-system].requires; for a manual run: pip install grpcio-tools)") from exc
    target = Path(target)
    with tempfile.TemporaryDirectory() as tmp:
        # Lay the proto out under its package path so the generated grpc module imports
        # `from gpuslice.kube.deviceplugin import api_pb2`.
        src = Path(tmp) / "src"
        where = src / Path(*PACKAGE.split("."))
        where.mkdir(parents=True)
        (where / "api.proto").write_bytes(proto.read_bytes())
        out = Path(tmp) / "out"
        out.mkdir()
        include = Path(grpc_tools.__file__).parent / "_proto"
        rel = str(Path(*PACKAGE.split(".")) / "api.proto")
        code = protoc.main(["grpc_tools.protoc", f"-I{src}", f"-I{include}", f"--python_out={out}",
                            f"--grpc_python_out={out}", rel])
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {code})")
        made = out / Path(*PACKAGE.split("."))
        texts = {name: (made / name).read_bytes() for name in ("api_pb2.py", "api_pb2_grpc.py")}
    texts["_generated.py"] = (f'"""Written by protogen.py at build time: the api.proto these modules come from."""\n'
                              f'PROTO_SHA256 = "{digest(proto)}"\n').encode()
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in GENERATED:
        tmpfile = target / f".{name}.{os.getpid()}"
        tmpfile.write_bytes(texts[name])
        os.replace(tmpfile, target / name)
        written.append(target / name)
    return written
