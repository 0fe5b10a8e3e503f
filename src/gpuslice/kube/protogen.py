"""Generate the Python gRPC code of the kubelet APIs gpuslice serves (build time only).

Run by ``setup.py``'s ``build_py`` step (``pip install .``, ``pip wheel .``, ``pip install -e .``) with
grpcio-tools from ``[build-system].requires``, and by ``python -m gpuslice.kube.deviceplugin`` /
``python -m gpuslice.kube.dra.kubeletapi`` in a source checkout. Standard library + ``grpc_tools`` only:
``setup.py`` loads this file by path, before gpuslice or its dependencies are installed.

:data:`PACKAGES` names, per Python package, the ``.proto`` files in its folder:

* ``gpuslice.kube.deviceplugin``: ``api.proto``, our wire-compatible copy of the device-plugin API v1beta1;
* ``gpuslice.kube.dra.kubeletapi``: ``dra_v1.proto`` and ``pluginregistration_v1.proto``, verbatim copies
  of the kubelet's DRA plugin API and plugin registration API (k8s.io/kubelet v0.37.2).

For each ``<name>.proto`` it writes ``<name>_pb2.py`` and ``<name>_pb2_grpc.py`` next to it, plus one
``_generated.py`` per package (``PROTO_SHA256``: which protos they were made from, so a stale copy is caught).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

KUBE = Path(__file__).resolve().parent
PACKAGES: dict[str, tuple[str, ...]] = {
    "gpuslice.kube.deviceplugin": ("api.proto",),
    "gpuslice.kube.dra.kubeletapi": ("dra_v1.proto", "pluginregistration_v1.proto"),
}


def folder(package: str, root: Path | None = None) -> Path:
    """Where ``package`` lives under ``root`` (a build folder), or in this source tree."""
    parts = package.split(".")
    return Path(root, *parts) if root is not None else KUBE.joinpath(*parts[2:])


def generated_names(package: str) -> tuple[str, ...]:
    stems = [Path(p).stem for p in PACKAGES[package]]
    return (*[f"{s}_pb2.py" for s in stems], *[f"{s}_pb2_grpc.py" for s in stems], "_generated.py")


def digest(protos: list[Path] | tuple[Path, ...]) -> str:
    """sha256 of the protos' bytes in order (for one file: the file's own sha256)."""
    h = hashlib.sha256()
    for p in protos:
        h.update(Path(p).read_bytes())
    return h.hexdigest()


def generate(target: Path, package: str = "gpuslice.kube.deviceplugin", source: Path | None = None) -> list[Path]:
    """Compile ``package``'s protos (from ``source``, default this tree's folder of the package) into
    ``target`` (the package folder of a build or of this tree); returns the files written."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - the build requirements name it
        raise RuntimeError("generating the kubelet API modules needs grpcio-tools (it is in "
                           "[build-system].requires; for a manual run: pip install grpcio-tools)") from exc
    source = Path(source) if source is not None else folder(package)
    protos = [source / name for name in PACKAGES[package]]
    pkg_path = Path(*package.split("."))
    texts: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # Lay the protos out under their package path so the generated grpc modules import
        # `from gpuslice.kube.<...> import <name>_pb2`.
        src = Path(tmp) / "src"
        (src / pkg_path).mkdir(parents=True)
        for proto in protos:
            (src / pkg_path / proto.name).write_bytes(proto.read_bytes())
        out = Path(tmp) / "out"
        out.mkdir()
        include = Path(grpc_tools.__file__).parent / "_proto"
        for proto in protos:
            code = protoc.main(["grpc_tools.protoc", f"-I{src}", f"-I{include}", f"--python_out={out}",
                                f"--grpc_python_out={out}", str(pkg_path / proto.name)])
            if code != 0:
                raise RuntimeError(f"protoc failed on {proto} (exit {code})")
            for suffix in ("_pb2.py", "_pb2_grpc.py"):
                name = proto.stem + suffix
                texts[name] = (out / pkg_path / name).read_bytes()
    names = ", ".join(p.name for p in protos)
    texts["_generated.py"] = (f'"""Written by protogen.py at build time: the protos these modules come from '
                              f'({names})."""\nPROTO_SHA256 = "{digest(protos)}"\n').encode()
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in generated_names(package):
        tmpfile = target / f".{name}.{os.getpid()}"
        tmpfile.write_bytes(texts[name])
        os.replace(tmpfile, target / name)
        written.append(target / name)
    return written
