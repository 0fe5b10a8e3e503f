#!/usr/bin/env bash
# gpuslice compute benchmark on one real GPU (about 3 minutes; GS_COMPUTE_SHORT=1: the share-accuracy
# and split groups only, shorter phases, about 1 minute, run by bench/gpu/packing.sh). Achieved shares are measured by NVML
# (the driver's per-process SM utilization) and by each workload's own throughput relative to an
# exclusive run, never taken from the enforcer (its own estimate is shown alongside).
#   accuracy   set 10/25/50/75/90 % -> achieved mean/p5/p95 over 1-s windows (matmul, ResNet-50 train)
#   split      two slices 50/50 and 30/70: split and aggregate vs exclusive; plain time-slicing; MPS
#   priority   p50/p99 latency of a high-priority inference loop alone vs beside a low-priority trainer
#   overhead   throughput at share 100 % with the enforcer preloaded vs without
# GS_COMPUTE_GROUPS="3 6": only those groups (numbers of group() below), e.g. ResNet-50 alone and its accuracy phases.
# Output in $OUT/compute (default /tmp/gpuslice-out/compute): summary.txt (the table, also printed
# last), bench.log, raw.tgz (every workload's JSON, the NVML samples, stderr logs).
# The processes of the next group import torch while the current group runs and wait at a gate file
# before touching the GPU, so imports cost no measured time.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpuslice-out}/compute
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$ROOT/src}
export PYTHONUNBUFFERED=1
LIB=$ROOT/native/build/libgpuslice.so
[ -f "$LIB" ] || make -s -C native >"$OUT/build.log" 2>&1 || { echo "build failed, see $OUT/build.log"; exit 1; }
W=${GS_BENCH_WORKLOAD:-"python3 $ROOT/bench/compute/workload.py"}  # overridable for a dry run of this script
RUN=/tmp/gs-compute-bench.$$
RAW=$RUN/raw
STATE=$RUN/state
MPSD=$RUN/mps
mkdir -p "$RUN" "$RAW" "$STATE" "$MPSD/pipe" "$MPSD/log"
T0=$(date +%s)
MPS_UP=0
SAMPLER=
cleanup() {
  if [ "$MPS_UP" = 1 ]; then CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe nvidia-cuda-mps-control <<<quit >/dev/null 2>&1; MPS_UP=0; fi
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  rm -rf "$RUN"
}
trap cleanup EXIT
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/bench.log"; }

slice() {  # slice NAME compute priority -> path of a slice file (with a region of its own, as the agent's slices:
  local f=$RUN/$1.slice  # the pacer keeps the slice's credit there, issue 15)
  printf 'version=1\ngrant=%s\ncompute=%s\nmode=hard\npriority=%s\nweight=1\ndevice_state_dir=%s\nregion=%s\nlog_level=warn\n' \
    "$1" "$2" "$3" "$STATE" "$RUN/$1.region" >"$f"
  echo "$f"
}
declare -A GP
# gs N NAME COMPUTE PRIO ARGS...: a process of group N under the enforcer
gs() {
  local n=$1 name=$2 c=$3 p=$4; shift 4
  GPUSLICE_SLICE=$(slice "$name" "$c" "$p") LD_PRELOAD=$LIB $W --state-dir "$STATE" --grant "$name" \
    --gate "$RUN/gate.$n" --out "$RAW/$name.json" "$@" 2>>"$RAW/$name.err" &
  GP[$n]+=" $!"
}
# plain N NAME ARGS...: a process of group N without the enforcer (extra env through ENVS)
plain() {
  local n=$1 name=$2; shift 2
  env ${ENVS:-} $W --gate "$RUN/gate.$n" --out "$RAW/$name.json" "$@" 2>>"$RAW/$name.err" &
  GP[$n]+=" $!"
}
# sched FULL SHORT [FOCUS]: a workload schedule, the short one under GS_COMPUTE_SHORT=1, the focus one under
# GS_COMPUTE_FOCUS=1 (bench/gpu/packing.sh PACK_FOCUS=1: the accuracy phases 3 times each, ABBA order)
sched() {
  if [ "${GS_COMPUTE_FOCUS:-0}" = 1 ] && [ -n "${3:-}" ]; then echo "$3"
  elif [ "${GS_COMPUTE_SHORT:-0}" = 1 ] || [ "${GS_COMPUTE_FOCUS:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi
}
group() {
  case $1 in
    1) plain 1 excl_matmul --kind matmul --schedule "$(sched x:4 x:3)" ;;
    2) gs 2 p100_matmul 100 0 --kind matmul --schedule x:4 ;;
    3) plain 3 excl_resnet --kind resnet --schedule "$(sched x:5 x:3)" ;;
    4) gs 4 p100_resnet 100 0 --kind resnet --schedule x:5 ;;
    5) gs 5 acc_matmul 50 0 --kind matmul --schedule "$(sched 10:5,25:5,50:5,75:5,90:5 10:3,50:3,90:3 \
         10:3,90:3,90:3,10:3,10:3,90:3)" ;;
    6) gs 6 acc_resnet 50 0 --kind resnet --schedule "$(sched 10:5,25:5,50:5,75:5,90:5 25:3,75:3 \
         25:3,75:3,75:3,25:3,25:3,75:3)" ;;
    7) gs 7 split_a 50 0 --kind matmul --schedule "$(sched 50:6,30:6 50:4,30:4)" --barrier "$RUN/b7" --peers 2
       gs 7 split_b 50 0 --kind matmul --schedule "$(sched 50:6,70:6 50:4,70:4)" --barrier "$RUN/b7" --peers 2 ;;
    8) plain 8 ts_a --kind matmul --schedule "$(sched x:6 x:4)" --barrier "$RUN/b8" --peers 2
       plain 8 ts_b --kind matmul --schedule "$(sched x:6 x:4)" --barrier "$RUN/b8" --peers 2 ;;
    9) gs 9 prio_infer 100 0 --kind infer --schedule x:11 --barrier "$RUN/b9" --peers 2
       gs 9 prio_train 100 1 --kind resnet --schedule x:6 --delay 5 --barrier "$RUN/b9" --peers 2 ;;
    10) plain 10 noprio_infer --kind infer --schedule x:11 --barrier "$RUN/b10" --peers 2
        plain 10 noprio_train --kind resnet --schedule x:6 --delay 5 --barrier "$RUN/b10" --peers 2 ;;
    11|12) local pa=50 pb=50
        [ "$1" = 12 ] && pa=30 pb=70
        ENVS="CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe CUDA_MPS_LOG_DIRECTORY=$MPSD/log CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pa" \
          plain "$1" "mps${pa}_a" --kind matmul --schedule x:6 --barrier "$RUN/b$1" --peers 2
        ENVS="CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe CUDA_MPS_LOG_DIRECTORY=$MPSD/log CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pb" \
          plain "$1" "mps${pa}_b" --kind matmul --schedule x:6 --barrier "$RUN/b$1" --peers 2 ;;
  esac
}
NAMES=(x "exclusive matmul" "matmul, enforcer at 100 %" "exclusive resnet" "resnet, enforcer at 100 %"
       "accuracy matmul (10/25/50/75/90, 5 s each)" "accuracy resnet" "split gpuslice 50/50 then 30/70"
       "split time-slicing" "priority with gpuslice" "priority without enforcer" "split MPS 50/50" "split MPS 30/70")

{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; } >"$OUT/env.txt" 2>&1
cp "$OUT/env.txt" "$RAW/env.txt"
python3 "$ROOT/bench/compute/nvml_sampler.py" --out "$RAW/nvml.jsonl" 2>>"$RAW/nvml.err" &
SAMPLER=$!
if [ "${GS_COMPUTE_FOCUS:-0}" = 1 ]; then RUN_GROUPS=(1 3 5 6)
elif [ "${GS_COMPUTE_SHORT:-0}" = 1 ]; then RUN_GROUPS=(1 3 5 6 7 8); else RUN_GROUPS=(1 2 3 4 5 6 7 8 9 10 11 12); fi
if [ -n "${GS_COMPUTE_GROUPS:-}" ]; then read -r -a RUN_GROUPS <<<"$GS_COMPUTE_GROUPS"; fi
group "${RUN_GROUPS[0]}"
for idx in "${!RUN_GROUPS[@]}"; do
  n=${RUN_GROUPS[$idx]}
  nxt=${RUN_GROUPS[$((idx + 1))]:-}
  if [ "$n" = 11 ]; then
    if CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe CUDA_MPS_LOG_DIRECTORY=$MPSD/log nvidia-cuda-mps-control -d; then MPS_UP=1
    else
      log "MPS daemon did not start; no MPS rows"
      for p in ${GP[11]}; do kill "$p" 2>/dev/null; done
      break
    fi
  fi
  [ -n "$nxt" ] && group "$nxt"   # next group imports meanwhile
  log "${NAMES[$n]}"
  touch "$RUN/gate.$n"
  # a group that hangs must not eat the whole budget: 60 s is 3x the longest one
  for p in ${GP[$n]}; do
    for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill "$p" 2>/dev/null && log "group $n: killed a process that ran past 60 s"
    wait "$p" 2>/dev/null
  done
  if [ "$n" = 12 ] && [ "$MPS_UP" = 1 ]; then
    CUDA_MPS_PIPE_DIRECTORY=$MPSD/pipe nvidia-cuda-mps-control <<<quit; MPS_UP=0
    cp -r "$MPSD/log" "$RAW/mps-log" 2>/dev/null
  fi
done
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; SAMPLER=
log "analysis"
python3 "$ROOT/bench/compute/analyze.py" "$RAW" >"$OUT/summary.txt" 2>>"$OUT/bench.log"
tar czf "$OUT/raw.tgz" -C "$RUN" raw
cat "$OUT/summary.txt"
