#!/usr/bin/env bash
# Local mode on a GPU box: the GPU tests of `gpuslice run`, then the two-slice demo of `make run`.
# Needs: python3 with torch, PYTHONPATH=src (no venv). Logs to $OUT (default /tmp/gpuslice-out);
# prints a short table last. Usage: bash bench/local_mode_gpu.sh
set -u
export OUT=${OUT:-/tmp/gpuslice-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
export PYTHONUNBUFFERED=1
[ -f native/build/libgpuslice.so ] || make -C native build/libgpuslice.so >"$OUT/local-build.log" 2>&1

python3 -m pytest -q -p no:cacheprovider -m gpu tests/local/test_gpu_local.py >"$OUT/local-pytest.log" 2>&1
PYTEST_RC=$?
python3 - >"$OUT/local-demo.log" 2>&1 <<'PY'
import json, os
from gpuslice.local.demo import run_gpu_demo
results = run_gpu_demo(seconds=20)
open(os.path.join(os.environ["OUT"], "local-demo.json"), "w").write(json.dumps(results, indent=1))
PY
DEMO_RC=$?

echo "local mode on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
printf '%-14s %s\n' "pytest -m gpu" "rc=$PYTEST_RC ($(tail -1 "$OUT/local-pytest.log"))"
printf '%-14s %s\n' "demo" "rc=$DEMO_RC"
python3 - <<'PY'
import json, os
path = os.path.join(os.environ["OUT"], "local-demo.json")
if os.path.exists(path):
    for r in json.load(open(path)):
        print(f"  {r['name']}: compute {r['compute']}% limit {r['memory']}: "
              f"{r.get('matmul_per_s', '-')} matmul/s, cuda total {r.get('cuda_total', 0) / 2**30:.1f} GiB, "
              f"over-limit alloc {r.get('over_limit_alloc', '-')}, exit {r['exit']}")
PY
