#!/usr/bin/env bash
# The spatial engine (MPS-backed slices) on one GPU, bounded to about 9 minutes of wall time:
#   N = 2, 4, 8 ResNet-50 fp16 batch-8 inference services (and a transformer encoder at N = 4) alone, under
#   plain time-slicing, gpuslice time-sliced equal hard shares, raw MPS with equal thread percentages and
#   gpuslice spatial equal shares (ABBA, repeated; spread stated); a trainer beside three services; memory
#   limits checked (the enforcer's books and nvidia-smi); the fault experiment (one spatial client hits an
#   illegal address / is SIGKILLed); and no MPS daemon or pipe directory left at the end.
# Usage: bash bench/gpu/spatial.sh            (results in $OUT, default /tmp/gpuslice-out/spatial)
#        GS_SPATIAL_STEPS=5,6,7,8 bash bench/gpu/spatial.sh   (only those steps of the printed plan)
#        GS_SPATIAL_DRY=1 bash bench/gpu/spatial.sh   (no GPU: sleeping workers, a stand-in MPS daemon)
# Writes $OUT/<date>-h100-spatial.md (the device named, the table last), raw.json, mps-logs/, bench.log.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpuslice-out}/spatial
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
DRY=${GS_SPATIAL_DRY:-0}
BUDGET=${GS_SPATIAL_BUDGET:-420}     # seconds of runs; with the build, start and clean-up at most about 9.5 minutes
STEPS=${GS_SPATIAL_STEPS:-}          # e.g. 1,2,3,4 then 5,6,7,8 in a second call: each call stays under 10 minutes
RUN=$(mktemp -d /tmp/gssp.XXXXXX)    # short: MPS puts Unix sockets under it
T0=$(date +%s)

# Our pinned pure-Python dependencies that the GPU image may lack (.whl/, when carried there).
. "$ROOT/bench/gpu/wheels.sh"

MPS_CONTROL=nvidia-cuda-mps-control
if [ "$DRY" = 1 ]; then
  mkdir -p "$RUN/bin"
  python3 - "$RUN/bin" <<'PY'
import sys; sys.path.insert(0, "tests/support")
from pathlib import Path
from mpskit import install_standin
print(install_standin(Path(sys.argv[1])))
PY
  MPS_CONTROL=$RUN/bin/nvidia-cuda-mps-control
  export GPUSLICE_MPS_CONTROL=$MPS_CONTROL GPUSLICE_DEVICE_SNAPSHOT=h100-80gb
fi

# Every MPS daemon of this run lives under $RUN (ours and gpuslice's): quit them all on any exit, then make
# sure no MPS process of ours is left, and say how many were.
cleanup() {
  for pipe in $(find "$RUN" -type d -name pipe 2>/dev/null); do
    CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 20 "$MPS_CONTROL" <<<quit >/dev/null 2>&1
  done
  sleep 1
  left=$(python3 -c "import sys; sys.path.insert(0, '$ROOT/bench/gpu'); from spatial_bench import mps_pids; from pathlib import Path; print(' '.join(map(str, mps_pids(Path('$RUN')))))")
  if [ -n "$left" ]; then echo "MPS processes of this run still there after quit, killed: $left" | tee -a "$OUT/bench.log"; kill -9 $left 2>/dev/null; fi
  # a server that was told to quit can take a few seconds to go (the 2026-11-25 run counted one that a
  # check 10 s later no longer found): wait for none, at most 15 s, before counting
  for _ in $(seq 30); do pgrep nvidia-cuda-mps >/dev/null || break; sleep 0.5; done
  echo "MPS processes left by this run: $(echo $left | wc -w) before the forced kill; nvidia-cuda-mps processes on the machine now: $(pgrep -c nvidia-cuda-mps || true)" | tee -a "$OUT/bench.log"
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$DRY" = 1 ]; then
  DEVICE=$(python3 -c "from gpuslice.host.devices import load_snapshot; print(load_snapshot('h100-80gb')[0].uuid)")
  NAME="(dry run: no GPU)"; DRIVER="-"
else
  if pgrep nvidia-cuda-mps >/dev/null; then  # process names (comm, 15 characters: both the control daemon and its server match), not command lines: a shell whose command mentions the daemon is no daemon
    echo "an MPS daemon already runs on this machine (pgrep nvidia-cuda-mps): plain runs would be MPS clients; stop it first" >&2
    exit 1
  fi
  DEVICE=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
  NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  make -s -C native >"$OUT/build.log" 2>&1 || { echo "native build failed: $OUT/build.log"; exit 1; }
fi
export GPUSLICE_ENFORCER_LIB=$ROOT/native/build/libgpuslice.so
[ "$DRY" = 1 ] && [ ! -f "$GPUSLICE_ENFORCER_LIB" ] && make -s -C native >"$OUT/build.log" 2>&1

ARGS=(--out "$OUT" --tmp "$RUN" --device "$DEVICE" --device-name "$NAME" --driver "$DRIVER"
      --mps-control "$MPS_CONTROL" --budget "$BUDGET")
[ "$DRY" = 1 ] && ARGS+=(--dry --window "${GS_SPATIAL_WINDOW:-1}")
[ -n "$STEPS" ] && ARGS+=(--steps "$STEPS")
echo "gpuslice spatial bench on $NAME ($DEVICE), budget ${BUDGET}s of runs, started $(date -u +%H:%M:%S)"
python3 bench/gpu/spatial_bench.py "${ARGS[@]}" --plan-only
timeout -k 15 $((BUDGET + 100)) python3 bench/gpu/spatial_bench.py "${ARGS[@]}" 2>&1 | tee "$OUT/bench.log" | grep -v '^|' 
RC=${PIPESTATUS[0]}
echo "bench exit $RC after $(( $(date +%s) - T0 )) s"
# the table last
REPORT=$(ls -t "$OUT"/*-h100-spatial.md 2>/dev/null | head -1)
[ -n "$REPORT" ] && sed -n '/^## Throughput and latency/,$p' "$REPORT"
exit "$RC"
