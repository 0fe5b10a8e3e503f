#!/usr/bin/env bash
# The yield path's backlog constants on a real GPU (issue 13): the launch-bound kind of bench/gpu/coloc.sh
# (alone, trainer alone, preemptive) with the enforcer built with each variant of the constants below, in the
# order A B C A (A twice: the VM's drift), so a constant is chosen by measurement. ~7 minutes on an H100.
# Usage: bash bench/gpu/coloc_variants.sh   (OUT: where the runs go; GS_COLOC_WINDOW, default 4 s;
#   GS_VARIANTS, default "A B C A"; GS_COLOC_STEPS, default 1 = the launch-bound kind, 2 GPU-bound, 3 decode;
#   GS_COLOC_BUDGET, default 170 s of phases per run: one kind's 6 phases were planned at 105 s on the H200 (2026-11-29);
#   a smaller budget skips phases, and each run's coloc.md lists them)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d /tmp/gpuslice-colocvar.XXXXXX)}
declare -A FLAGS=(
  [A]=""                                                                          # as shipped: 2 launches or 50 us
  [B]="-DGS_CTL_DRAIN_BACKLOG_LAUNCHES=1000000000u"                               # pending 50 us only
  [C]="-DGS_CTL_DRAIN_BACKLOG_LAUNCHES=1000000000u -DGS_CTL_DRAIN_SHORT_NS=150000LL" # pending 150 us only
  [D]="-DGS_CTL_YIELD_QUEUE_NS=50000LL"                                            # admitted queue 50 us, not 150
  [E]="-DGS_CTL_DRAIN_POLL_NS=30000LL"                                             # drain looks every 30 us, not 100
)
n=0
for v in ${GS_VARIANTS:-A B C A}; do
  n=$((n + 1))
  make -s -C native clean >/dev/null 2>&1
  if ! make -s -C native build/libgpuslice.so CFLAGS="-O2 -g ${FLAGS[$v]}" >"$OUT/build-$n-$v.log" 2>&1; then
    echo "variant $v: build failed"; tail -5 "$OUT/build-$n-$v.log"; exit 1
  fi
  OUT=$OUT/run-$n-$v GS_COLOC_STEPS=${GS_COLOC_STEPS:-1} GS_COLOC_MODES=alone,trainer,preemptive GS_COLOC_REPS=2 \
    GS_COLOC_WINDOW=${GS_COLOC_WINDOW:-4} GS_COLOC_BUDGET=${GS_COLOC_BUDGET:-170} GS_COLOC_TAR=0 \
    bash bench/gpu/coloc.sh >"$OUT/run-$n-$v.log" 2>&1
  echo "== run $n, variant $v (${FLAGS[$v]:-as shipped}): rc=$?"
  grep -E "^### |^\| (alone|trainer|preemptive) " "$OUT/run-$n-$v.log"   # every server kind of the run
done
make -s -C native clean >/dev/null 2>&1; make -s -C native build/libgpuslice.so >/dev/null 2>&1
