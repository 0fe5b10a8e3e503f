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
/* A shape is sampled on each of its first LEARN launches, then once every SAMPLE_EVERY. 16 keeps
 * the sampled pairs' CPU cost under ~0.2 us per launch; every shape of a loop is still re-measured
 * within 16 of its own launches (a per-shape count: a process-wide "every 16th launch" would see the
 * same 10 kernels of a 160-kernel iteration forever). */
#define GS_COST_LEARN 4u
#define GS_COST_SAMPLE_EVERY 16u

struct gs_cost_entry {
    uint64_t key;       /* 0 = empty; written last (release) */
    int64_t mean_ns;    /* EWMA of accepted samples */
    int64_t dev_ns;     /* EWMA of the absolute deviation */
    uint32_t samples;   /* accepted samples (saturates) */
    uint32_t launches;  /* launches seen (wraps), drives sampling */
    uint32_t outliers;  /* consecutive rejected samples */
    uint32_t pad;
    int64_t outlier_min_ns; /* smallest of them */
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
/* Lock-free: count a launch of a known shape; 1 = measure this one (learning, or its turn). */
int gs_cost_should_sample(struct gs_cost_entry *en);
/* Writer: add a measured pair (ns >= 0). clean = nothing else could have run inside the pair, so it
 * is taken as it is. Otherwise a sample above 1.5 x the mean and above mean + 4 x deviation + 10 us
 * is taken as inflated and ignored, unless 16 in a row are: then the shape's cost really changed (a
 * new input size behind the same grid) and the model restarts from the smallest of them. Returns
 * the entry's mean after the sample (what a launch of this shape costs), or ns when the table is
 * full. */
int64_t gs_cost_sample(struct gs_costmodel *m, uint64_t key, int64_t ns, int clean);
#endif
