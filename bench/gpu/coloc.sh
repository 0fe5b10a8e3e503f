#!/usr/bin/env bash
# Co-location benchmark on one GPU (issue 13), at most about 9 minutes on an H100 (the plan is printed first):
#   three servers (launch-bound with idle gaps, GPU-bound batched, decode-style many tiny kernels), each beside
#   a GPU-saturating transformer trainer: server p50/p99 and trainer it/s alone, with no gpuslice, under raw
#   MPS (a private daemon started here, the trainer at client priority below normal), gpuslice preemptive and
#   gpuslice shared; the device time each server leaves idle when alone; ABBA order, 2 repeats, spread stated
#   (bench/gpu/coloc_bench.py says how each figure is measured).
# Usage: bash bench/gpu/coloc.sh [--dry-run]                 (from the repository root or anywhere)
#        GS_COLOC_STEPS=1,2 bash bench/gpu/coloc.sh; GS_COLOC_STEPS=3 bash bench/gpu/coloc.sh
#            steps: 1 launch-bound, 2 GPU-bound, 3 decode (about 2.5 minutes each): two device calls of < 10 min;
#            each writes <date>-<gpu>-coloc-steps12.md / -steps3.md; one table of both:
#            tar xzf A-raw.tgz; mv coloc-run a; tar xzf B-raw.tgz; python3 bench/gpu/coloc_bench.py --report \
#            a/coloc-raw.json coloc-run/coloc-raw.json
#        GS_COLOC_STEPS=1,2,3 GS_COLOC_MODES=alone,trainer,plain,preemptive GS_COLOC_BUDGET=420 bash bench/gpu/coloc.sh
#            all three kinds, the modes that judge preemptive (24 phases, 2 ABBA repeats): ~7.5 minutes, one call
#   GS_COLOC_MODES (all but tidal): a comma list of alone,trainer,plain,mps,preemptive,shared,spatial,tidal
#   (opt-in: default: issue 13's commands as written, gpuslice run --priority high / low with no --engine, the
#   engine gpuslice's choice and each process's grant line kept; solo-mps, solo-spatial: the server alone as under mps / spatial; solo-trainer: the trainer alone as
#   under spatial, with GS_COLOC_SPATIAL_TRAINER_COMPUTE: what that SM cap costs it without a server; spatial-full:
#   spatial with the trainer on every SM, --compute 100, to judge the yield cap within one run; spatial-gate:
#   spatial with both processes asking for the yield gate, GPUSLICE_SPATIAL_YIELD=1; spatial-gate-full: the gate
#   with the trainer on every SM (--compute 100, no yield cap); spatial-gate-variant:
#   spatial-gate on the enforcer built with GS_COLOC_VARIANT_CFLAGS in native/build-variant, e.g. -DGS_DRAIN_OFF
#   (no drain records) or -DGS_CTL_DRAIN_SPIN_NS=50000LL -DGS_CTL_DRAIN_POLL_NS=200000LL (fewer drain looks);
#   preemptive-variant: preemptive on that build)
#   (spatial: gpuslice's MPS engine, the trainer a below-normal client; needs the MPS binaries, as mps does).
#   Every phase records the SM clock and NVML's memory utilization over its window: the table's "SM MHz" and
#   "memory busy %" columns.
#   GS_COLOC_SLOT (unset): the paired protocol: the trainer works in half the slots of this many seconds of one
#   phase (Thue-Morse order, so a drift over the window cancels) and each co-located server is also judged against
#   itself in the slots between (a table of its own; the server alone, split the same way, is the null). The
#   window must hold a multiple of 8 slots (GS_COLOC_WINDOW=8 GS_COLOC_SLOT=1).
#   GS_COLOC_SPATIAL_TRAINER_COMPUTE (unset): under spatial, the trainer's --compute (its MPS active threads %;
#   unset, a low-priority spatial trainer started beside the high-priority server gets gpuslice's yield cap, 60;
#   100: every SM). GS_COLOC_TRAIN_BATCH (16): the trainer's batch (64: one whose kernels fill the SMs).
#   GS_COLOC_TRAINER (transformer): alu or hbm puts a synthetic neighbour of one resource in the trainer's place
#   (arithmetic; memory bandwidth and the L2): what a server beside the trainer waits for (goals then not judged).
#   GS_COLOC_REPS (2), GS_COLOC_WINDOW (3 s per phase), GS_COLOC_TIDAL (0; 1 adds a tidal-trainer phase),
#   GS_COLOC_BUDGET (450 s of phases; every phase that would pass it is skipped and listed), OUT (default a new
#   temp dir). --dry-run: no GPU: sleeping workers, no MPS unless nvidia-cuda-mps-control is on PATH.
# Writes $OUT/<date>-<gpu>-coloc.md (the device named, goals met or MISSED by how much) and
# $OUT/<date>-<gpu>-coloc-raw.tgz (coloc-raw.json, every process's log, the MPS logs, bench.log): two files come
# back from the device tool (its limit is 8). Every MPS daemon this script starts is stopped on exit, also on
# error or Ctrl-C. Prints a short table last.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
OUT=${OUT:-$(mktemp -d /tmp/gpuslice-coloc.XXXXXX)}
W=$OUT/coloc-run            # all but the results file; packed into one archive at the end
mkdir -p "$W"
export PYTHONUNBUFFERED=1
RUN=$(mktemp -d /tmp/gscl.XXXXXX)   # short: MPS puts Unix sockets under it
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/bench.log"; }

# Our pinned pure-Python dependencies that the GPU image may lack (.whl/, when carried there).
. "$ROOT/bench/gpu/wheels.sh"
# A dry run needs gpuslice's dependencies, not torch: the project's .venv where it exists (a GPU image's own
# python3 has torch, and the wheels above bring the rest)
DEF_PY=python3
[ "$DRY" = 1 ] && [ -x "$ROOT/.venv/bin/python" ] && DEF_PY=$ROOT/.venv/bin/python
PY=${PYTHON:-$DEF_PY}

MPS_UP=0
stop_mps() {
  if [ "$MPS_UP" = 1 ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$RUN/mps/pipe" timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
    for _ in $(seq 100); do pgrep nvidia-cuda-mps >/dev/null || break; sleep 0.1; done
    cp -r "$RUN/mps/log" "$W/mps-log" 2>/dev/null
    MPS_UP=0
  fi
}
cleanup() {
  stop_mps
  # the spatial mode's daemons are gpuslice's (its ledger stops each once its runs end); any left by a cut run
  for pipe in "$RUN"/state/mps/*/pipe; do
    [ -d "$pipe" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
  done
  for _ in $(seq 100); do pgrep nvidia-cuda-mps >/dev/null || break; sleep 0.1; done
  echo "nvidia-cuda-mps processes on the machine at the end: $(pgrep -c nvidia-cuda-mps || true)"
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$DRY" = 0 ] && pgrep nvidia-cuda-mps >/dev/null; then  # process names (comm), not command lines: a shell whose command mentions the daemon is none
  echo "an MPS daemon already runs on this machine (pgrep nvidia-cuda-mps): plain runs would be its clients; stop it first" >&2
  exit 1
fi
MPS_NOTE="no nvidia-cuda-mps-control: no MPS rows"
MPS_ARGS=()
if command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$RUN/mps/pipe" "$RUN/mps/log"
  if CUDA_MPS_PIPE_DIRECTORY="$RUN/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$RUN/mps/log" nvidia-cuda-mps-control -d \
      >"$W/mps-start.log" 2>&1; then
    MPS_UP=1
    MPS_ARGS=(--mps-pipe "$RUN/mps/pipe")
    MPS_NOTE="private MPS daemon started ($RUN/mps)"
  else
    MPS_NOTE="the MPS daemon did not start (mps-start.log): no MPS rows"
  fi
fi

ARGS=(--out "$W" --tmp "$RUN" --reps "${GS_COLOC_REPS:-2}" --window "${GS_COLOC_WINDOW:-3}"
      --budget "${GS_COLOC_BUDGET:-450}" "${MPS_ARGS[@]}")
[ -n "${GS_COLOC_STEPS:-}" ] && ARGS+=(--steps "$GS_COLOC_STEPS")
[ -n "${GS_COLOC_MODES:-}" ] && ARGS+=(--modes "$GS_COLOC_MODES")
[ "${GS_COLOC_TIDAL:-0}" = 1 ] && ARGS+=(--tidal)
[ -n "${GS_COLOC_SLOT:-}" ] && ARGS+=(--slot "$GS_COLOC_SLOT")
[ -n "${GS_COLOC_SPATIAL_TRAINER_COMPUTE:-}" ] && ARGS+=(--spatial-trainer-compute "$GS_COLOC_SPATIAL_TRAINER_COMPUTE")
[ -n "${GS_COLOC_TRAINER:-}" ] && ARGS+=(--trainer "$GS_COLOC_TRAINER")
[ "$DRY" = 1 ] && ARGS+=(--dry)
VARIANT=0
[[ ",${GS_COLOC_MODES:-}," == *-variant,* ]] && VARIANT=1 && ARGS+=(--variant-lib "$ROOT/native/build-variant/libgpuslice.so")
log "$($PY bench/gpu/coloc_bench.py "${ARGS[@]}" --plan-only)"
log "$MPS_NOTE"

log "build"
make -s -C native $([ "$DRY" = 1 ] || echo build/libgpuslice.so) >"$W/build.log" 2>&1 || { log "build failed, see $W/build.log"; exit 1; }
export GPUSLICE_ENFORCER_LIB=$ROOT/native/build/libgpuslice.so
if [ "$VARIANT" = 1 ]; then  # the A/B build: measurement switches (a fresh folder: make does not track CFLAGS)
  rm -rf native/build-variant
  make -s -C native B=build-variant build-variant/libgpuslice.so CFLAGS="-O2 -g ${GS_COLOC_VARIANT_CFLAGS:-}" \
    >>"$W/build.log" 2>&1 || { log "the variant build failed, see $W/build.log"; exit 1; }
fi
if [ "$DRY" = 1 ]; then  # the CPU driver and NVML doubles: the workers launch through the real enforcer
  export LD_LIBRARY_PATH=$ROOT/native/build/double${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} GS_COLOC_DOUBLE=1
  # the node's devices: an H100 snapshot whose device 0 has the double's UUID (its NVML double is too small
  # for discovery), so the slice file names the device the enforcer sees
  $PY - "$RUN/devices.json" <<'PY' || exit 1
import json, sys
from dataclasses import replace
from gpuslice.host.devices import load_snapshot, snapshot_json
b = [(k * 17) & 0xFF for k in range(16)]
b[0] = 0xA0
h = "".join(f"{x:02x}" for x in b)
devs = load_snapshot("h100-80gb")
devs[0] = replace(devs[0], uuid=f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
open(sys.argv[1], "w").write(json.dumps(snapshot_json(devs[:1], "coloc.sh --dry-run: the CPU driver double")))
PY
  export GPUSLICE_DEVICE_SNAPSHOT=$RUN/devices.json
fi

LIMIT=$(( ${GS_COLOC_BUDGET:-450} + 60 ))
# SIGTERM at the limit: the bench still writes what it measured
timeout -k 15 "$LIMIT" $PY bench/gpu/coloc_bench.py "${ARGS[@]}" 2>&1 | tee -a "$W/bench.log" | grep -v '^|'
RC=${PIPESTATUS[0]}
stop_mps
log "bench rc=$RC"

GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || GPU="no GPU (dry run)"
TAG=$(sed -E 's/.*(H100|H200|A100|L40S|L4|B200|GH200).*/\1/I; t; s/.*/gpu/' <<<"$GPU" | tr 'A-Z' 'a-z')
[ "$DRY" = 1 ] && TAG=cpu-dry-run
NAME="$(date -u +%F)-$TAG-coloc$([ -n "${GS_COLOC_STEPS:-}" ] && echo "-steps${GS_COLOC_STEPS//,/}")"
RES="$OUT/$NAME.md"
{
  echo "# Co-location benchmark (issue 13): $(date -u '+%F %H:%M UTC')"
  echo
  echo "- device: $GPU; $($PY -c 'import sys, torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {sys.version.split()[0]}")' 2>/dev/null || echo 'no torch')"
  echo "- code: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "- command: $([ -n "${GS_COLOC_STEPS:-}" ] && echo "GS_COLOC_STEPS=$GS_COLOC_STEPS ")bash bench/gpu/coloc.sh$([ "$DRY" = 1 ] && echo ' --dry-run'); reps ${GS_COLOC_REPS:-2}, window ${GS_COLOC_WINDOW:-3} s$([ -n "${GS_COLOC_SLOT:-}" ] && echo ", slot ${GS_COLOC_SLOT} s")$([ -n "${GS_COLOC_SPATIAL_TRAINER_COMPUTE:-}" ] && echo ", spatial trainer --compute ${GS_COLOC_SPATIAL_TRAINER_COMPUTE}")$([ -n "${GS_COLOC_TRAIN_BATCH:-}" ] && echo ", trainer batch ${GS_COLOC_TRAIN_BATCH}")$([ -n "${GS_COLOC_TRAINER:-}" ] && echo ", trainer ${GS_COLOC_TRAINER}"); $(( $(date +%s) - T0 )) s wall; rc=$RC; $MPS_NOTE"
  echo "- raw: $NAME-raw.tgz (coloc-run/coloc-raw.json: every phase; coloc-run/logs/: every process; bench.log; mps-log/)"
  echo "- method: bench/gpu/coloc_bench.py (docstring). Server idle fraction = 1 - request rate x GPU time per request (CUDA graph of a request replayed back to back). Misses below carry their measured cause where the bench can measure one; the pacer path of each gpuslice process, read from the device state mid-window, is in the table."
  echo
  cat "$W/coloc.md" 2>/dev/null || echo "(no results: see bench.log)"
} >"$RES"
log "results: $RES"
echo
echo "== co-location on $GPU ($(( $(date +%s) - T0 )) s)"
# (not the yield-split table's rows: " % |" cells, whose header this short table leaves out)
grep -E '^(###|\| (alone|solo-mps|solo-spatial|trainer|solo-trainer|plain|mps|preemptive|shared|spatial|default|spatial-full|tidal) )' "$W/coloc.md" 2>/dev/null \
  | grep -v ' % |' | cut -c1-150
grep -E 'MISSED|: met' "$W/coloc.md" 2>/dev/null | sed 's/^- /  /' | cut -c1-200
if [ "${GS_COLOC_TAR:-1}" = 1 ] && tar czf "$OUT/$NAME-raw.tgz" -C "$OUT" coloc-run; then rm -rf "$W"; fi
exit "$RC"
