"""Build steps of gpuslice that pyproject.toml cannot express. All metadata lives in pyproject.toml.

* The kubelet APIs' gRPC modules are generated from the ``.proto`` files named in
  ``src/gpuslice/kube/protogen.py`` (the device plugin's ``api.proto``, the DRA plugin and plugin-registration
  protos) with grpc_tools.protoc (pinned in [build-system].requires) while building, so installs never
  compile at run time.
* A wheel carries the enforcer: ``make -C native build/libgpuslice.so`` (plain cc, no CUDA toolkit; the one
  set of compiler flags lives in native/Makefile) is copied to ``gpuslice/lib/libgpuslice.so``, where
  ``gpuslice.enforcer.library`` looks for it. A missing cc or make fails the build, naming what to install. Such
  a wheel is tagged for the platform (``py3-none-linux_x86_64``): the library does not use Python's ABI.
  An editable install builds nothing here: it finds the checkout's ``native/build/`` (``make -C native``).
  A source tree without ``native/`` (a copy of ``src/`` only) gives a pure-Python wheel without the
  enforcer; the build says so.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.errors import CompileError

try:  # setuptools >= 70.1 (the pinned build requirement); older ones use the wheel package's, if any
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel can be built here (e.g. an editable install with an old setuptools)
        bdist_wheel = None

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "native"
ENFORCER = Path("gpuslice", "lib", "libgpuslice.so")


def _protogen():
    path = ROOT / "src" / "gpuslice" / "kube" / "protogen.py"
    spec = importlib.util.spec_from_file_location("_gpuslice_protogen", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _has_native() -> bool:
    return (NATIVE / "Makefile").is_file() and (NATIVE / "src").is_dir()


def build_enforcer(target: Path) -> None:
    """``make -C native build/libgpuslice.so``, copied to ``target``; a clear error without cc or make."""
    compiler = os.environ.get("CC", "cc")
    missing = [tool for tool in (compiler.split()[0], "make") if shutil.which(tool) is None]
    if missing:
        raise CompileError(f"building gpuslice's enforcer (native/ -> {ENFORCER}) needs a C compiler and make; "
                           f"not found: {', '.join(missing)}. Install them (e.g. apt-get install gcc make) or "
                           "set CC to your C compiler")
    done = subprocess.run(["make", "-C", str(NATIVE), "build/libgpuslice.so"], capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"make -C native build/libgpuslice.so failed ({done.returncode}):\n"
                           f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(NATIVE / "build" / "libgpuslice.so", target)


class build_py_with_generated(build_py):  # noqa: N801  (setuptools' command naming)
    """build_py, then the generated modules (into build_lib for a wheel, into the source folder for an
    editable install: setuptools' rule for files generated next to Python files) and, for a wheel, the
    enforcer."""

    def run(self):
        super().run()
        protogen = _protogen()
        for package in protogen.PACKAGES:
            root = ROOT / "src" if self.editable_mode else Path(self.build_lib)
            protogen.generate(protogen.folder(package, root), package)
        if self.editable_mode:
            return
        if _has_native():
            build_enforcer(Path(self.build_lib) / ENFORCER)
        else:
            print(f"gpuslice: no native/ next to setup.py: this wheel has no {ENFORCER} (gpuslice run then "
                  "needs GPUSLICE_ENFORCER_LIB)", file=sys.stderr)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            protogen = _protogen()
            outputs += [str(protogen.folder(package, Path(self.build_lib)) / name)
                        for package in protogen.PACKAGES for name in protogen.generated_names(package)]
            if _has_native():
                outputs.append(str(Path(self.build_lib) / ENFORCER))
        return outputs


class NativeDistribution(Distribution):
    """A distribution with a native library in it: its wheel is not pure Python."""

    def has_ext_modules(self):
        return _has_native()


COMMANDS = {"build_py": build_py_with_generated}
if bdist_wheel is not None:
    class bdist_wheel_any_python(bdist_wheel):  # noqa: N801
        """The library is loaded by CUDA programs, not by Python: any Python 3, this platform."""

        def get_tag(self):
            python, abi, platform = super().get_tag()
            return ("py3", "none", platform) if _has_native() else (python, abi, platform)

    COMMANDS["bdist_wheel"] = bdist_wheel_any_python


setup(cmdclass=COMMANDS, distclass=NativeDistribution)
