/* gpuslice pacer: what a timing-event pair adds to the kernel between them (issue 12).
 *
 * The pacer charges a measured launch the time between an event recorded before it and one after it.
 * On an H200 such a pair, queued behind work so that no record waits for the CPU, held a constant 2.2 us
 * (median; 1.3 us at its smallest) more than the same kernel's marginal time back to back, for kernels
 * of 1.5 to 21 us (bench/gpu/event_overhead.py, bench/results/2026-11-28-h200-event-overhead.txt). For
 * ResNet-50's ~280 kernels a request, 4.7 us each, that made every request cost 1.35-1.40x its eager
 * GPU time in the pacer's books, at every N, and equal hard shares at N=4 and 8 ran 0.75-0.82x plain
 * time-slicing. So each process measures that bias once per device, in its own context, and the
 * engine takes it off every pair (pairs.c).
 *
 * The measurement (pairbias.c): a private stream; a spin kernel (PTX, JIT-compiled by the driver)
 * holds it while 32 empty kernels go between two events, then 32 pairs each around one empty kernel;
 * the bias is the pairs' trimmed mean less the kernels' marginal time. If the hold was over before
 * everything was queued (a record then waited for the CPU), or anything failed, there is no bias (0)
 * and the pacer charges raw pairs as before. Its GPU time (the hold: 4 M cycles, 2-12 ms by the clock) is
 * not charged to the slice; each of its waits polls, cut at 100 ms. */
#ifndef GPUSLICE_PAIRBIAS_H
#define GPUSLICE_PAIRBIAS_H
#include <stdint.h>

#define GS_PB_KERNELS 32
/* the most a pair may be taken off: a bias measured above it is a disturbed measurement (a neighbour's
 * time slice inside the pairs), not the events' cost */
#define GS_PB_MAX_NS 5000LL

/* From the measured times (ns): `marginal_total` for GS_PB_KERNELS kernels back to back, and
 * GS_PB_KERNELS pair times: the pairs' mean without their top quarter (a neighbour's time slice in a
 * few of them) less the marginal time of one kernel; 0 when negative, -1 when above GS_PB_MAX_NS. */
int64_t gs_pair_bias_from(int64_t marginal_total, const int64_t pairs[GS_PB_KERNELS]);
/* Measure in the calling thread's current context (real driver functions, never the hooks): the bias
 * in ns (>= 0), or -1 with a one-line reason in why. */
int64_t gs_pair_bias_measure(char *why, unsigned long whylen);
#endif
