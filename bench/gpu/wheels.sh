# Sourced by the GPU scripts (ROOT: the repository root, this checkout when unset): puts gpuslice's pinned pure-Python
# dependencies from .whl/ (bash bench/gpu/fetch_wheels.sh fills it for the lent GPU image: Python 3.12,
# x86_64, no network) into /tmp/site and sets PYTHONPATH to them and $ROOT/src. Wheels that do not suit
# this Python (a developer's box with another version) are not an error: the environment's own packages
# are used instead, as without .whl/.
# ROOT defaults to this checkout: sourced without it, the wheels were silently not found and the image's own
# typer and click, not the versions we pin, failed `gpuslice run` (2026-12-07: no attribute 'type_descriptor')
ROOT=${ROOT:-$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)}  # bash only, as every caller
GS_SITE=${GS_SITE:-/tmp/site}
if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1 &&
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GS_SITE" \
     "$ROOT"/.whl/*.whl 2>/dev/null; then
  export PYTHONPATH=$GS_SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
else
  [ -d "$ROOT/.whl" ] && echo "wheels in .whl/ do not install for $(python3 -V 2>&1); using this environment's packages" >&2
  export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
fi
