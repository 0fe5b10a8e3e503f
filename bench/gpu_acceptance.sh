#!/usr/bin/env bash
# Memory acceptance of the enforcer on a real GPU, in one go (< 4 minutes on an H100):
# build, then PyTorch (default, expandable_segments, cudaMallocAsync), JAX, CuPy, every driver
# allocation path through ctypes (dlsym, cuGetProcAddress, pitch, managed, VMM, async, pool, arrays,
# mipmapped arrays), 2 and 4 processes
# in one slice, each filling until OOM under the limit; queries and nvidia-smi inside the slice;
# per process, the enforcer's books next to NVML's numbers (and the context cost it measured);
# CUDA graph memory nodes counted and given back; a SIGKILLed process leaking nothing; context
# overhead; ns per intercepted call; training throughput with vs without the enforcer. Prints the
# tables last; logs and JSON go to $OUT.
# Usage: bash bench/gpu_acceptance.sh [ctx smi frameworks paths graph multi kill cost train]   (default: all)
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/gpuslice-out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
if ! make -C native all >"$OUT/native-build.log" 2>&1; then
  echo "native build failed:"; tail -20 "$OUT/native-build.log"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/device.txt" 2>&1
python3 bench/gpu/mem_acceptance.py "$@" 2>&1 | tee "$OUT/memory_acceptance.txt"
exit "${PIPESTATUS[0]}"
