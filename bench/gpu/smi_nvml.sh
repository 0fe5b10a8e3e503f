#!/usr/bin/env bash
# Which NVML entry points nvidia-smi binds when it runs inside a slice, and what it then shows: the
# evidence for which of its views the enforcer's NVML hooks can reach (the per-process table comes
# through an entry point nvidia-smi does not import by name). Needs native/build/libgpuslice.so.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
printf 'version=1\ndevices=%s\nmemory_limit=4294967296\nregion=%s/r\n' \
  "$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)" "$d" >"$d/slice"
GPUSLICE_SLICE=$d/slice LD_PRELOAD=$ROOT/native/build/libgpuslice.so LD_DEBUG=bindings LD_DEBUG_OUTPUT=$d/ld \
  nvidia-smi >"$d/smi.txt" 2>&1
echo "-- nvidia-smi inside a 4 GiB slice:"
cat "$d/smi.txt"
echo "-- NVML symbols nvidia-smi bound (LD_DEBUG=bindings): count, caller, provider, symbol"
cat "$d"/ld.* | grep "normal symbol \`nvml" \
  | sed -E "s/.*binding file ([^ ]*) \[[0-9]+\] to ([^ ]*) \[[0-9]+\]: normal symbol \`([^']*)'.*/\1 -> \2 \3/" \
  | sort | uniq -c | sort -rn | head -80
echo "-- dlopen/dlsym activity of nvidia-smi (first lines):"
cat "$d"/ld.* | grep -v "normal symbol" | grep -i "nvidia-ml\|gpuslice" | head -20
