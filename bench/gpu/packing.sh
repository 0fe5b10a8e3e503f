#!/usr/bin/env bash
# Packing benchmark on one GPU (issue 12), about 9 minutes on an H100 (the planned time is printed first):
#   1. build native/ (libgpuslice.so)
#   2. bench/gpu/packing.py: N = 2, 4, 8 launch-bound inference services (ResNet-50 and a transformer
#      encoder, batch 8, fp16), one copy alone, plain time-slicing, raw MPS with equal thread % (a private
#      daemon started here), gpuslice memory-only slices, equal hard shares, equal soft shares; ABBA order,
#      2 repeats, spread stated; each service's share of the device's time
#   3. the share-accuracy sweep of bench/compute in its short form (GS_COMPUTE_SHORT=1, about 1 minute)
#   4. $OUT/<date>-<gpu>-packing.md (device named) and the short table, printed last; everything else (logs,
#      packing-raw.json, the sweep's raw data) in $OUT/<date>-<gpu>-packing-raw.tgz: two files come back
#      from the device tool, whose limit is 8 (PACK_TAR=0 keeps the folder $OUT/packing-run instead)
# Short re-measurement (PACK_FOCUS=1, about 5 minutes on an H100): only the cells the 2026-11-25 run missed
# (ResNet-50 N=8 plain / memory-only / equal hard; encoder N=4 plain / memory-only), 4 ABBA repeats, no MPS,
# and the share-accuracy sweep cut to ResNet-50 training 25/75 % and matmul 10/90 %, each 3 times in ABBA
# order (GS_COMPUTE_FOCUS=1 of bench/compute): PACK_FOCUS=1 bash bench/gpu/packing.sh
# Usage: bash bench/gpu/packing.sh [--dry-run]      (from the repository root or anywhere)
#   PACK_SECONDS (3.5: seconds per phase), PACK_REPS (2), PACK_KINDS (resnet50,encoder), PACK_NS (2,4,8),
#   PACK_MODES (all; a comma list keeps those modes and plain, e.g. memonly,hard),
#   PACK_SWEEP (1; 0 = skip step 3), PACK_MPS (1; 0 = no MPS rows), PACK_VARIANTS ("B=lib,C=lib": other builds of
#   the enforcer as modes hard-B, hard-C, A/B against the shipped one in the same order; packing.py), PACK_BUDGET (570: seconds for everything; each step is cut to what is
#   left, and what was measured is still written), OUT (default: a new temp dir). --dry-run: no GPU needed: fake services
#   (sleeps), NVML off, the sweep with bench/compute/dry_workload.py; MPS only if nvidia-cuda-mps-control is
#   on PATH. Every MPS daemon this script starts is stopped on exit, also on error or Ctrl-C.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
OUT=${OUT:-$(mktemp -d /tmp/gpuslice-packing.XXXXXX)}
W=$OUT/packing-run   # all but the results file; packed into one archive at the end
mkdir -p "$W"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
if [ "$DRY" = 1 ]; then
  export PACK_KINDS=${PACK_KINDS:-fake} PACK_NVML=0
  export GS_BENCH_WORKLOAD="$PY $ROOT/bench/compute/dry_workload.py"
fi
FOCUS=${PACK_FOCUS:-0}
if [ "$FOCUS" = 1 ]; then export PACK_FOCUS=1 PACK_REPS=${PACK_REPS:-4}; fi
RUN=$(mktemp -d /tmp/gs-packing-run.XXXXXX)
MPS_UP=0
stop_mps() {
  if [ "$MPS_UP" = 1 ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$RUN/mps/pipe" nvidia-cuda-mps-control >/dev/null 2>&1
    MPS_UP=0
  fi
}
cleanup() { stop_mps; rm -rf "$RUN"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
T0=$(date +%s)
BUDGET=${PACK_BUDGET:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/packing.log"; }

# the MPS daemon first (a second, silently), so that the plan printed first counts its phases
MPS_NOTE="no nvidia-cuda-mps-control: no MPS rows"
if [ "$FOCUS" = 1 ]; then
  MPS_NOTE="focus run: no MPS rows"
elif [ "${PACK_MPS:-1}" = 0 ]; then
  MPS_NOTE="PACK_MPS=0: no MPS rows"
elif command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$RUN/mps/pipe" "$RUN/mps/log"
  if CUDA_MPS_PIPE_DIRECTORY="$RUN/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$RUN/mps/log" nvidia-cuda-mps-control -d \
      >"$W/mps-start.log" 2>&1; then
    MPS_UP=1
    export PACK_MPS_PIPE="$RUN/mps/pipe" PACK_MPS_LOG="$RUN/mps/log"
    MPS_NOTE="private MPS daemon started ($RUN/mps)"
  else
    MPS_NOTE="MPS daemon did not start (see mps-start.log): no MPS rows"
  fi
fi
SWEEP_S=$([ "${PACK_SWEEP:-1}" = 1 ] && { [ "$FOCUS" = 1 ] && echo 70 || echo 75; } || echo 0)
PLAN=$($PY bench/gpu/packing.py --plan) || exit 2
PLANNED=$(( $(sed -n 's/.*planned \([0-9]*\) s.*/\1/p' <<<"$PLAN") + SWEEP_S + 30 ))
log "$PLAN"
log "planned: about ${PLANNED} s in all (build ~20 s, packing, sweep ~${SWEEP_S} s; cut at PACK_BUDGET=${BUDGET} s); results in $OUT"
log "$MPS_NOTE"

log "build"
make -s -j8 -C native build/libgpuslice.so >"$W/build.log" 2>&1 || { log "build failed, see $W/build.log"; exit 1; }

PACK_LIMIT=$(( $(left) - SWEEP_S - 20 ))
log "packing (cut at ${PACK_LIMIT} s)"
# SIGTERM at the limit: packing.py stops its services and still writes what it measured
timeout -k 20 "$PACK_LIMIT" $PY bench/gpu/packing.py --out "$W/packing" 2>>"$W/packing.log" | tee -a "$W/packing.log"
PACK_RC=${PIPESTATUS[0]}
[ "$MPS_UP" = 1 ] && cp -r "$RUN/mps/log" "$W/packing/mps-log" 2>/dev/null
stop_mps
log "packing rc=$PACK_RC"

SWEEP_RC=skipped
SWEEP_LIMIT=$(( $(left) - 15 ))
if [ "${PACK_SWEEP:-1}" = 1 ] && [ "$SWEEP_LIMIT" -ge 45 ]; then
  log "share-accuracy sweep (bench/compute, $([ "$FOCUS" = 1 ] && echo focus || echo short); cut at ${SWEEP_LIMIT} s)"
  GS_COMPUTE_SHORT=1 GS_COMPUTE_FOCUS=$FOCUS OUT=$W timeout -k 10 "$SWEEP_LIMIT" bash bench/compute/run_compute_bench.sh >"$W/sweep.log" 2>&1
  SWEEP_RC=$?
  log "sweep rc=$SWEEP_RC"
elif [ "${PACK_SWEEP:-1}" = 1 ]; then
  SWEEP_RC="not run: ${SWEEP_LIMIT} s left of PACK_BUDGET=${BUDGET}"
  log "sweep $SWEEP_RC"
fi

# the results file, named by the date and the GPU
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || GPU="no GPU (dry run)"
TAG=$(sed -E 's/.*(H100|H200|A100|L40S|L4|B200|GH200).*/\1/I; t; s/.*/gpu/' <<<"$GPU" | tr 'A-Z' 'a-z')
[ "$DRY" = 1 ] && TAG=cpu-dry-run
NAME="$(date -u +%F)-$TAG-packing"
RES="$OUT/$NAME.md"
{
  echo "# Packing benchmark (issue 12): $(date -u '+%F %H:%M UTC')"
  echo
  echo "- device: $GPU; $($PY -c 'import sys, torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {sys.version.split()[0]}")' 2>/dev/null || echo 'no torch')"
  echo "- code: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "- command: $([ "$FOCUS" = 1 ] && echo 'PACK_FOCUS=1 ')bash bench/gpu/packing.sh$([ "$DRY" = 1 ] && echo ' --dry-run'); PACK_SECONDS=${PACK_SECONDS:-3.5} PACK_REPS=${PACK_REPS:-2}; $(( $(date +%s) - T0 )) s wall (planned ${PLANNED} s); packing rc=$PACK_RC, sweep rc=$SWEEP_RC"
  echo "- raw: $NAME-raw.tgz: packing-run/packing/packing-raw.json (every phase, service and NVML sample), packing-run/packing/logs/, packing-run/compute/raw.tgz, the logs"
  echo
  echo "## Packing: launch-bound inference services"
  echo
  cat "$W/packing/packing.md" 2>/dev/null || echo "(no packing results: see packing.log)"
  echo
  echo "## Share accuracy on long-kernel loops (bench/compute, short form)"
  echo
  echo '```'
  cat "$W/compute/summary.txt" 2>/dev/null || echo "(not run)"
  echo '```'
} >"$RES"
log "results: $RES"
echo
echo "== packing on $GPU ($(( $(date +%s) - T0 )) s)"
sed -n '/^| kind/,/^$/p' "$W/packing/packing.md" 2>/dev/null
grep -E "MISSED|met" "$W/packing/packing.md" 2>/dev/null | sed 's/^- /  /'
grep -E "^(matmul|resnet) |gpuslice hard|time-slicing" "$W/compute/summary.txt" 2>/dev/null
if [ "${PACK_TAR:-1}" = 1 ] && tar czf "$OUT/$NAME-raw.tgz" -C "$OUT" packing-run; then rm -rf "$W"; fi
[ "$PACK_RC" = 0 ] || exit 1
exit 0
