#!/usr/bin/env bash
# gpuslice compute benchmark on one real GPU (about 3.5 minutes). Every achieved share here is
# measured from the workload's own throughput relative to an exclusive run of the same workload,
# never from the enforcer's estimate (which is shown alongside for comparison).
#   accuracy   set 10/25/50/75/90 % -> achieved mean/p5/p95 over 1-s windows (matmul, ResNet-50 train)
#   split      two slices 50/50 and 30/70: split and aggregate vs exclusive; plain time-slicing; MPS
#   priority   p50/p99 latency of a high-priority inference loop alone vs beside a low-priority trainer
#   overhead   throughput at share 100 % with the enforcer preloaded vs without
# Logs and JSON go to $OUT (default /tmp/gpuslice-out/compute); the table is printed last.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpuslice-out}/compute
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$ROOT/src}
export PYTHONUNBUFFERED=1
LIB=$ROOT/native/build/libgpuslice.so
[ -f "$LIB" ] || make -s -C native >"$OUT/build.log" 2>&1 || { echo "build failed, see $OUT/build.log"; exit 1; }
W="python3 $ROOT/bench/compute/workload.py"
RUN=/tmp/gs-compute-bench.$$
STATE=$RUN/state
mkdir -p "$RUN" "$STATE"
T0=$(date +%s)
MPS_UP=0
cleanup() {
  if [ "$MPS_UP" = 1 ]; then echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; MPS_UP=0; fi
  rm -rf "$RUN"
}
trap cleanup EXIT
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/bench.log"; }

slice() {  # slice NAME compute priority [mode] -> path of a slice file
  local f=$RUN/$1.slice
  printf 'version=1\ngrant=%s\ncompute=%s\nmode=%s\npriority=%s\nweight=1\ndevice_state_dir=%s\nlog_level=warn\n' \
    "$1" "$2" "${4:-hard}" "$3" "$STATE" >"$f"
  echo "$f"
}
# gs NAME COMPUTE PRIO -- workload args: run under the enforcer
gs() {
  local name=$1 c=$2 p=$3; shift 4
  GPUSLICE_SLICE=$(slice "$name" "$c" "$p") LD_PRELOAD=$LIB $W --state-dir "$STATE" --grant "$name" "$@" \
    2>>"$OUT/$name.err"
}
plain() { local name=$1; shift 2; $W "$@" 2>>"$OUT/$name.err"; }

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } >"$OUT/env.txt" 2>&1

log "exclusive baselines and overhead (no enforcer / enforcer at 100 %)"
plain excl_matmul -- --kind matmul --schedule x:4 --out "$OUT/excl_matmul.json"
gs p100_matmul 100 0 -- --kind matmul --schedule x:4 --out "$OUT/p100_matmul.json"
plain excl_resnet -- --kind resnet --schedule x:5 --out "$OUT/excl_resnet.json"
gs p100_resnet 100 0 -- --kind resnet --schedule x:5 --out "$OUT/p100_resnet.json"

log "accuracy: one process per workload, share changed live every 5 s"
gs acc_matmul 50 0 -- --kind matmul --schedule 10:5,25:5,50:5,75:5,90:5 --out "$OUT/acc_matmul.json"
gs acc_resnet 50 0 -- --kind resnet --schedule 10:5,25:5,50:5,75:5,90:5 --out "$OUT/acc_resnet.json"

log "split: two gpuslice slices, 50/50 then 30/70"
rm -rf "$RUN/b1"
gs split_a 50 0 -- --kind matmul --schedule 50:6,30:6 --barrier "$RUN/b1" --peers 2 --out "$OUT/split_a.json" &
gs split_b 50 0 -- --kind matmul --schedule 50:6,70:6 --barrier "$RUN/b1" --peers 2 --out "$OUT/split_b.json" &
wait
log "split: plain time-slicing (no enforcer)"
plain ts_a -- --kind matmul --schedule x:6 --barrier "$RUN/b2" --peers 2 --out "$OUT/ts_a.json" &
plain ts_b -- --kind matmul --schedule x:6 --barrier "$RUN/b2" --peers 2 --out "$OUT/ts_b.json" &
wait

log "priority: high-priority inference alone 5 s, then beside a low-priority ResNet-50 trainer 6 s"
gs online 100 0 -- --kind infer --schedule x:11 --barrier "$RUN/b3" --peers 2 --out "$OUT/prio_infer.json" &
gs offline 100 1 -- --kind resnet --schedule x:6 --delay 5 --barrier "$RUN/b3" --peers 2 --out "$OUT/prio_train.json" &
wait
log "priority reference: the same pair without the enforcer"
plain np_infer -- --kind infer --schedule x:11 --barrier "$RUN/b4" --peers 2 --out "$OUT/noprio_infer.json" &
plain np_train -- --kind resnet --schedule x:6 --delay 5 --barrier "$RUN/b4" --peers 2 --out "$OUT/noprio_train.json" &
wait

log "split: MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 50/50 then 30/70"
export CUDA_MPS_PIPE_DIRECTORY=$RUN/mps-pipe CUDA_MPS_LOG_DIRECTORY=$RUN/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then
  MPS_UP=1
  for pair in "50 50" "30 70"; do
    set -- $pair
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$1 $W --kind matmul --schedule x:6 --barrier "$RUN/b5$1" --peers 2 --out "$OUT/mps${1}_a.json" 2>>"$OUT/mps.err" &
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$2 $W --kind matmul --schedule x:6 --barrier "$RUN/b5$1" --peers 2 --out "$OUT/mps${1}_b.json" 2>>"$OUT/mps.err" &
    wait
  done
  echo quit | nvidia-cuda-mps-control; MPS_UP=0
  cp -r "$CUDA_MPS_LOG_DIRECTORY" "$OUT/mps-log" 2>/dev/null
else
  log "MPS daemon did not start; MPS rows will be missing"
fi
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

log "analysis"
python3 "$ROOT/bench/compute/analyze.py" "$OUT" | tee "$OUT/summary.txt"
