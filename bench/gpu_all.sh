#!/usr/bin/env bash
# The GPU machine's run, in one or more calls: build the enforcer, record the devices, run the GPU
# tests, the memory acceptance, the nvidia-smi NVML check, the local-mode run and the compute
# benchmark; print a short table last.
# Usage (device tool, carry .whl — filled by bash bench/gpu/fetch_wheels.sh): bash bench/gpu_all.sh [STEP...]
#   steps: build devices pytest-gpu capture-probe memory-acceptance smi-nvml local-mode compute-bench (default: all;
#   all of them take about 16 minutes on an H100, so split them over two or three calls of the device tool).
# Logs go to $OUT (or /tmp/gpuslice-out).
set -u
OUT=${OUT:-/tmp/gpuslice-out}
export OUT
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONUNBUFFERED=1
ALL="build devices pytest-gpu capture-probe memory-acceptance smi-nvml local-mode compute-bench"
STEPS=${*:-$ALL}

# Our pinned pure-Python dependencies that the GPU image may lack (.whl/, when carried there).
. "$ROOT/bench/gpu/wheels.sh"

declare -A STATUS
step() {  # step NAME LOGFILE LIMIT_S CMD... : run with a time limit, keep the exit code for the table
  local name=$1 log=$2 limit=$3; shift 3
  local t0=$(date +%s)
  echo "=== $name ($(date -u +%H:%M:%S))" | tee -a "$OUT/$log"
  timeout -k 10 "$limit" "$@" >>"$OUT/$log" 2>&1
  local rc=$?
  STATUS[$name]="rc=$rc $(( $(date +%s) - t0 ))s"
  echo "=== $name -> ${STATUS[$name]}" | tee -a "$OUT/$log"
}
wants() { [[ " $STEPS " == *" $1 "* ]]; }


{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
} >"$OUT/env.txt" 2>&1

wants build && step build main.log 120 make -C native
if wants devices; then
  step devices main.log 60 python3 -m gpuslice.cli devices
  python3 -m gpuslice.cli devices --json >"$OUT/devices.json" 2>>"$OUT/main.log"
  python3 -m gpuslice.cli devices >"$OUT/devices.txt" 2>&1
fi
# Every test file with a GPU-marked test (a hand-kept list had fallen behind: 5 of 10 files), not all of tests/:
# the GPU image lacks some test-only packages that other files import at collection. ~5 minutes on an H100.
GPU_TESTS=$(grep -rlE "mark\.gpu" tests --include='test_*.py' | sort)
wants pytest-gpu && GPUSLICE_REQUIRE_GPU=1 step pytest-gpu pytest.log 480 python3 -m pytest -m gpu -v -p no:cacheprovider \
  $GPU_TESTS
# Which driver question inside a torch.cuda.graph capture breaks it (bare, one process per question; ~1 minute).
wants capture-probe && PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync step capture-probe capture-probe.log 240 \
  python3 bench/gpu/capture_pool_probe.py
wants memory-acceptance && step memory-acceptance memory.log 330 bash bench/gpu_acceptance.sh
wants smi-nvml && step smi-nvml smi-nvml.log 60 bash bench/gpu/smi_nvml.sh
wants local-mode && step local-mode local.log 150 bash bench/local_mode_gpu.sh
wants compute-bench && step compute-bench compute.log 420 bash bench/compute/run_compute_bench.sh

echo
echo "== gpuslice GPU run on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
for k in $ALL; do
  wants "$k" && printf '%-20s %s\n' "$k" "${STATUS[$k]:-not run}"
done
[ -f "$OUT/memory_acceptance.txt" ] && sed -n '/== gpuslice memory acceptance/,$p' "$OUT/memory_acceptance.txt"
[ -f "$OUT/local.log" ] && grep -A6 '^local mode on' "$OUT/local.log"
[ -f "$OUT/compute/summary.txt" ] && cat "$OUT/compute/summary.txt"
[ -f "$OUT/smi-nvml.log" ] && grep -A12 -- "-- NVML symbols" "$OUT/smi-nvml.log"
# The device tool brings back only a few files: pack every log into one archive, keep the summaries.
if [ "${GS_PACK:-1}" = 1 ]; then
  tar czf /tmp/gpu-run-logs.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gpu-run-logs.tgz "$OUT/"
fi
exit 0
