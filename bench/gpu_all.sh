#!/usr/bin/env bash
# One call on the GPU machine: build the enforcer, record the devices, run the GPU tests, the memory
# acceptance, the compute benchmark and the local-mode run; print a short table last.
# Usage (device tool): carry .whl; `bash bench/gpu_all.sh`. Logs go to $OUT (or /tmp/gpuslice-out).
set -u
OUT=${OUT:-/tmp/gpuslice-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONUNBUFFERED=1

# Our pinned pure-Python dependencies that the GPU image lacks or has in other versions.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$ROOT/src
else
  export PYTHONPATH=$ROOT/src
fi

declare -A STATUS
step() {  # step NAME LOGFILE CMD... : run, keep the exit code for the summary table
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name ($(date -u +%H:%M:%S))" | tee -a "$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  STATUS[$name]="rc=$rc $(( $(date +%s) - t0 ))s"
  echo "=== $name -> ${STATUS[$name]}" | tee -a "$OUT/$log"
}

{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
} >"$OUT/env.txt" 2>&1

step build       main.log make -C native
step devices     main.log python3 -m gpuslice.cli devices
python3 -m gpuslice.cli devices --json >"$OUT/devices.json" 2>>"$OUT/main.log"
step pytest-gpu  main.log python3 -m pytest -m gpu -q -p no:cacheprovider tests
[ -x bench/gpu_acceptance.sh ] && step memory-acceptance memory.log bash bench/gpu_acceptance.sh
[ -f bench/compute/run_compute_bench.sh ] && step compute-bench compute.log bash bench/compute/run_compute_bench.sh
[ -f bench/local_mode_gpu.sh ] && step local-mode local.log bash bench/local_mode_gpu.sh

echo
echo "== gpuslice GPU run on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
for k in build devices pytest-gpu memory-acceptance compute-bench local-mode; do
  printf '%-20s %s\n' "$k" "${STATUS[$k]:-not run}"
done
