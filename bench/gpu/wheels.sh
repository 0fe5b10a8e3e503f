# Sourced by the GPU scripts from the repository root (ROOT set): puts gpuslice's pinned pure-Python
# dependencies from .whl/ (bash bench/gpu/fetch_wheels.sh fills it for the lent GPU image: Python 3.12,
# x86_64, no network) into /tmp/site and sets PYTHONPATH to them and $ROOT/src. Wheels that do not suit
# this Python (a developer's box with another version) are not an error: the environment's own packages
# are used instead, as without .whl/.
GS_SITE=${GS_SITE:-/tmp/site}
if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1 &&
   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GS_SITE" \
     "$ROOT"/.whl/*.whl 2>/dev/null; then
  export PYTHONPATH=$GS_SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
else
  [ -d "$ROOT/.whl" ] && echo "wheels in .whl/ do not install for $(python3 -V 2>&1); using this environment's packages" >&2
  export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
fi
