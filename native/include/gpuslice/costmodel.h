/* gpuslice per-kernel cost model: what one launch of a given kernel costs the device, learned from
 * the event pairs the pacer samples. One table per (process, device) engine.
 *
 * Why: an event pair (start recorded before a launch, end after) times its kernel exactly only while
 * no other context runs in between. When contexts overlap on a time-sliced GPU, a pair whose context
 * was switched out while it was open also holds the neighbour's run (a hardware time slice, ms), so
 * summing pairs charges a slice for its neighbours' time. A kernel of one shape (function, grid,
 * block, shared memory) costs nearly the same every time, and inflation only ever adds, by a lot: a
 * per-shape mean that ignores samples far above it stays right under overlap, and it lets most
 * launches go unmeasured (a pair costs ~2-3 us of CPU; a launch-bound loop launches every 5-30 us).
 *
 * Concurrency: one writer at a time (the engine samples under the device state lock), lock-free
 * readers (launching threads). Entries are never removed; a full table stops learning new shapes
 * (their launches are charged the process's mean). */
#ifndef GPUSLICE_COSTMODEL_H
#define GPUSLICE_COSTMODEL_H
#include <stdint.h>

/* 4096 shapes: a ResNet-50 or transformer process uses a few hundred; 128 KiB per engine. */
#define GS_COST_SLOTS 4096
/* A shape is sampled on each of its first LEARN launches, then on 1 launch in SAMPLE_EVERY on average,
 * chosen at random (a per-thread generator). 16 keeps the sampled pairs' CPU cost under ~0.2 us per
 * launch. Random, not every 16th launch of the shape: a shape launched a number of times per training
 * step that divides 16 (4 elementwise launches of one capped grid over tensors of different sizes, say)
 * was sampled at the same place in every step, and its learned cost was whichever of those launches
 * that was (issue 12: ResNet-50 training at 25 % got 18-21 % of the device, and 27.6 % with every
 * launch measured). A process-wide "every 16th launch" would be worse still (the same 10 kernels of a
 * 160-kernel iteration forever). GS_COST_SAMPLE_PHASED builds the per-shape count instead (A/B). */
#define GS_COST_LEARN 4u
#ifndef GS_COST_SAMPLE_EVERY /* a probe may build with every launch measured (bench/gpu/pair_probe.py) */
#define GS_COST_SAMPLE_EVERY 16u
#endif

/* The floor: the smallest sample of the shape's last FLOOR_RUN..2 x FLOOR_RUN (two runs, the older
 * dropped when the newer fills). A dirty pair is accepted only within FLOOR_BAND of it (1/8 + 2 us:
 * a kernel's own spread and the event resolution); the mean is kept inside [floor, band]. */
#define GS_COST_FLOOR_RUN 8u
#ifndef GS_COST_BAND_NS /* bench/gpu/packing.sh's variants build it with others */
#define GS_COST_BAND_NS 2000
#endif

struct gs_cost_entry {
    uint64_t key;       /* 0 = empty; written last (release) */
    int64_t mean_ns;    /* EWMA of accepted samples */
    int64_t dev_ns;     /* EWMA of the absolute deviation */
    uint32_t samples;   /* accepted samples (saturates) */
    uint32_t launches;  /* launches seen (wraps): drives sampling only in a GS_COST_SAMPLE_PHASED build */
    uint32_t run_n;     /* samples in the newer run */
    uint32_t pad;
    int64_t run_min_ns[2][2]; /* smallest raw [0] and corrected [1] sample of the older [.][0] and
                                 newer [.][1] run */
};

struct gs_costmodel {
    struct gs_cost_entry *slot; /* GS_COST_SLOTS entries, NULL = none (every lookup misses) */
    uint32_t used;
};

/* Allocate the table (0, or -1 on host out-of-memory: the model then knows nothing). */
int gs_cost_init(struct gs_costmodel *m);
void gs_cost_free(struct gs_costmodel *m);
/* The key of a kernel launch shape; never 0. */
uint64_t gs_cost_key(const void *fn, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                     uint32_t shmem);
/* Lock-free: the entry for key or NULL (unknown). */
struct gs_cost_entry *gs_cost_find(struct gs_costmodel *m, uint64_t key);
/* Lock-free: 1 = measure this launch of a known shape (learning, or drawn: 1 in SAMPLE_EVERY). */
int gs_cost_should_sample(struct gs_cost_entry *en);
/* Writer: add a measured pair (ns >= 0). clean = nothing else could have run inside the pair, so it
 * is taken as it is. Otherwise (a neighbour may have run inside it) a sample above the band over the
 * shape's floor (the smallest of its last 8..16 samples) is taken as inflated and ignored: inflation
 * only ever adds, and with 8 launch-bound contexts interleaving nearly every pair holds some of a
 * neighbour (issue 12: the old outlier rule, 1.5 x the mean, let those in and learned ~1.3x the
 * kernel). A cost that really changed (a new input behind the same grid) is learned once the older
 * samples leave the floor's window (at most 16 samples): the mean never falls below the floor.
 * Returns the entry's mean after the sample (what a launch of this shape costs), or ns when the table
 * is full. */
int64_t gs_cost_sample(struct gs_costmodel *m, uint64_t key, int64_t ns, int64_t gap, int clean);
#endif
