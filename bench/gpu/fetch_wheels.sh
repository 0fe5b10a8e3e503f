#!/usr/bin/env bash
# Fill .whl/ with gpuslice's pinned runtime dependencies for the lent GPU image (Python 3.12, x86_64), which
# has no network and other versions of some of them: bench/gpu_all.sh installs .whl/*.whl into /tmp/site
# when the folder is carried (device tool: carry [".whl"]). Run here, where the registries answer, after
# `make .venv/.installed`. The versions are the venv's, so they follow pyproject.toml's pins.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
# What the CLI, the agent and the tests import that the image may lack (typer 0.29 imports pydantic).
names='typer|click|rich|markdown-it-py|mdurl|pygments|shellingham|annotated-doc|nvidia-ml-py|prometheus.client'
names="$names|starlette|uvicorn|h11|httpx|httpcore|anyio|idna|certifi|typing.extensions|pydantic|pydantic.core"
names="$names|annotated-types|typing-inspection"
# the DRA GPU test (tests/kube/test_dra_gpu.py) parses quantities with the kubernetes client, whose sync
# import needs these (its aiohttp extras are for the async client, not imported)
names="$names|kubernetes|durationpy|oauthlib|python-dateutil|pyyaml|requests|requests-oauthlib|urllib3"
names="$names|websocket-client|charset.normalizer|six"
pins=$($PY -m pip freeze | grep -i -E "^($names)==" )
mkdir -p .whl
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl $pins
ls .whl
