"""deploy/Dockerfile agrees with the chart and the tree (no container engine runs in CI, so the image
itself is not built here): the library lands where values.yaml's agent.enforcerInImage says, the entry
point is the CLI whose verbs the chart passes as args, every COPY source exists, and the native target
it builds is one the Makefile has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def test_library_path_matches_the_chart() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuslice" / "values.yaml").read_text())
    dest = re.search(r"^COPY --from=build \S*libgpuslice\.so (\S+)$", DOCKERFILE, re.M)
    assert dest and dest.group(1) == values["agent"]["enforcerInImage"]


def test_entrypoint_is_the_cli() -> None:
    assert 'ENTRYPOINT ["gpuslice"]' in DOCKERFILE


def test_copy_sources_exist_and_make_target_is_real() -> None:
    for line in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.M):
        for src in line.split():
            assert (ROOT / src).exists(), src
    target = re.search(r"make -C native (\S+)", DOCKERFILE).group(1)
    dry = subprocess.run(["make", "-n", "-C", str(ROOT / "native"), target], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
