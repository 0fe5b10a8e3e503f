#!/usr/bin/env bash
# The backstop on a real GPU (issue 15): how long after a slice goes over its memory limit around the
# enforcer (LD_PRELOAD cleared; three colluding processes) the agent reports it and ends it, against NVML's
# own visibility delay, and that an honest slice filled to its limit is never touched. About 5 minutes on one
# H100 (5 rounds x 4 scenarios, ABBA order, every trial bounded at 60 s). Needs python3 with torch and
# gpuslice's dependencies, PYTHONPATH=src (no venv). Logs and results to $OUT; prints a short table last.
# Usage: bash bench/backstop_detection.sh [--repeats N] [--grace S] [--interval S] [--dry-run]
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d /tmp/gpuslice-backstop-XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
export PYTHONUNBUFFERED=1
if ! make -C native all >"$OUT/native-build.log" 2>&1; then
  echo "native build failed:"; tail -20 "$OUT/native-build.log"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/device.txt" 2>&1
python3 bench/gpu/backstop_detection.py "$@" 2>&1 | tee "$OUT/backstop_detection.txt"
exit "${PIPESTATUS[0]}"
