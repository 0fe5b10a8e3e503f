"""Build step of gpuslice that pyproject.toml cannot express: generate the device plugin's gRPC modules
from ``src/gpuslice/kube/deviceplugin/api.proto`` (grpc_tools.protoc, pinned in [build-system].requires)
while building, so installs never compile at run time. All metadata lives in pyproject.toml."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = Path("gpuslice", "kube", "deviceplugin")


def _protogen():
    path = ROOT / "src" / PACKAGE_DIR / "protogen.py"
    spec = importlib.util.spec_from_file_location("_gpuslice_protogen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_py_with_grpc(build_py):  # noqa: N801  (setuptools' command naming)
    """build_py, then the generated modules: into build_lib for a wheel, into the source folder for an
    editable install (setuptools' rule for files generated next to Python files)."""

    def run(self):
        super().run()
        target = ROOT / "src" / PACKAGE_DIR if self.editable_mode else Path(self.build_lib) / PACKAGE_DIR
        _protogen().generate(target)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [str(Path(self.build_lib) / PACKAGE_DIR / name) for name in _protogen().GENERATED]
        return outputs


setup(cmdclass={"build_py": build_py_with_grpc})
