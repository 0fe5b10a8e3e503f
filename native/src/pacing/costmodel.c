/* gpuslice per-kernel cost model (see gpuslice/costmodel.h). */
#define _GNU_SOURCE
#include "gpuslice/costmodel.h"
#include "gpuslice/fork.h"
#include <stdlib.h>
#include <time.h>


_Static_assert((GS_COST_SLOTS & (GS_COST_SLOTS - 1)) == 0, "a power of two");

int gs_cost_init(struct gs_costmodel *m)
{
    m->used = 0;
    m->slot = calloc(GS_COST_SLOTS, sizeof *m->slot);
    return m->slot ? 0 : -1;
}

void gs_cost_free(struct gs_costmodel *m)
{
    free(m->slot);
    m->slot = NULL;
    m->used = 0;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

uint64_t gs_cost_key(const void *fn, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                     uint32_t shmem)
{
    uint64_t h = mix(0x6a09e667f3bcc909ull, (uint64_t)(uintptr_t)fn);
    h = mix(h, ((uint64_t)gx << 32) | gy);
    h = mix(h, ((uint64_t)gz << 32) | bx);
    h = mix(h, ((uint64_t)by << 32) | bz);
    h = mix(h, shmem);
    h ^= h >> 31;
    return h ? h : 1;
}

static uint32_t home(uint64_t key) { return (uint32_t)(key >> 17) & (GS_COST_SLOTS - 1); }

struct gs_cost_entry *gs_cost_find(struct gs_costmodel *m, uint64_t key)
{
    if (!m->slot || !key) return NULL;
    for (uint32_t s = home(key), n = 0; n < GS_COST_SLOTS; s = (s + 1) & (GS_COST_SLOTS - 1), n++) {
        uint64_t k = __atomic_load_n(&m->slot[s].key, __ATOMIC_ACQUIRE);
        if (k == key) return &m->slot[s];
        if (k == 0) return NULL;
    }
    return NULL;
}

#ifndef GS_COST_SAMPLE_PHASED
/* xorshift64* per thread, seeded from the thread's own address and the clock: no shared state, so
 * no cache line bounces between launching threads (the per-shape count did that) */
static _Thread_local uint64_t x;

/* a forked child's one thread would replay its parent thread's sequence: it seeds again */
static void after_fork_child(void) { x = 0; }
GS_ON_FORK_CHILD(after_fork_child);

static uint64_t draw(void)
{
    if (x == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x = ((uint64_t)(uintptr_t)&x * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec;
        if (x == 0) x = 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return (x * 0x2545F4914F6CDD1Dull) >> 32;
}
#endif

int gs_cost_should_sample(struct gs_cost_entry *en)
{
    if (__atomic_load_n(&en->samples, __ATOMIC_RELAXED) < GS_COST_LEARN) return 1;
#ifdef GS_COST_SAMPLE_PHASED
    uint32_t n = __atomic_add_fetch(&en->launches, 1, __ATOMIC_RELAXED);
    return n % GS_COST_SAMPLE_EVERY == 0;
#else
    return draw() % GS_COST_SAMPLE_EVERY == 0;
#endif
}

/* Writer only: a new entry for key (its fields first, the key last, so a reader that finds the key
 * finds a mean), or NULL when the table is 3/4 full (probing stays short for the readers). */
static struct gs_cost_entry *insert(struct gs_costmodel *m, uint64_t key, int64_t ns, int64_t raw)
{
    if (!m->slot || m->used >= GS_COST_SLOTS / 4 * 3) return NULL;
    uint32_t s = home(key);
    while (__atomic_load_n(&m->slot[s].key, __ATOMIC_RELAXED)) s = (s + 1) & (GS_COST_SLOTS - 1);
    struct gs_cost_entry *en = &m->slot[s];
    __atomic_store_n(&en->mean_ns, ns, __ATOMIC_RELAXED);
    en->dev_ns = 0;
    en->run_n = 1;
    en->run_min_ns[0][0] = en->run_min_ns[0][1] = raw;
    en->run_min_ns[1][0] = en->run_min_ns[1][1] = ns;
    __atomic_store_n(&en->samples, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&en->key, key, __ATOMIC_RELEASE);
    m->used++;
    return en;
}

/* Add `ns` to the floor f (the two runs of run_min[f]); returns the smallest of the window. */
static int64_t floor_add(struct gs_cost_entry *en, int f, int64_t ns)
{
    int64_t *r = en->run_min_ns[f];
    if (en->run_n == 0 || ns < r[1]) r[1] = ns;
    return r[1] < r[0] ? r[1] : r[0];
}

static void floor_roll(struct gs_cost_entry *en)
{
    if (++en->run_n < GS_COST_FLOOR_RUN) return;
    for (int f = 0; f < 2; f++) en->run_min_ns[f][0] = en->run_min_ns[f][1];
    en->run_n = 0;
}

int64_t gs_cost_sample(struct gs_costmodel *m, uint64_t key, int64_t ns, int64_t gap, int clean)
{
    if (ns < 0) ns = 0;
    gap = gap < 0 ? 0 : gap > ns ? ns : gap;
    int64_t v = ns - gap; /* the kernel's time, if the launch gap was all the pair held besides */
    struct gs_cost_entry *en = gs_cost_find(m, key);
    if (!en) {
        /* a first sample that was not clean may hold a neighbour's time slice: the floor pulls it
         * down as soon as a smaller one comes */
        insert(m, key, v, ns);
        return v;
    }
    int64_t mean = __atomic_load_n(&en->mean_ns, __ATOMIC_RELAXED);
    /* the band hangs from the smallest raw pair (never below the kernel's cost: a raw pair only
     * ever holds more); the lower bound from the smallest corrected one (the gap taken off may be a
     * little more than the pair held, when the start event ran late in the launch call) */
    int64_t hi = floor_add(en, 0, ns), lo = floor_add(en, 1, v);
    floor_roll(en);
    int64_t band = hi + hi / 8 + GS_COST_BAND_NS;
    if (clean || v <= band) {
        int64_t d = v - mean;
        /* The shape's first two samples give one: the smaller. The first launch of a kernel also holds
         * what the driver does once for it (CUDA's lazy loading puts the function's load inside that
         * launch call, ms while the GPU idles inside the pair), and inflation only adds, whichever of
         * the two carried it (two threads may start a new shape at once). Averaged in, it kept a
         * training loop's shapes over-charged for tens of seconds (issue 12, H200: ResNet-50 training at
         * 25 % got 19.0-19.3 % in its first phase with it, 24.4-24.8 % without; every phase within 2
         * points without it: bench/results/2026-11-29-h200-sweep-firstsample.md, measured with the
         * second sample replacing the first). Then a running mean (1/2, 1/3, ...) until EWMA 1/8.
         * GS_COST_KEEP_FIRST averages the first in (A/B). */
#ifdef GS_COST_KEEP_FIRST
        uint32_t n = en->samples < 8 ? en->samples + 1 : 8;
#else
        uint32_t n = en->samples < 8 ? en->samples : 8;
        if (n <= 1) { /* the second sample: the smaller of the two stands, with no deviation yet */
            n = 1;
            d = d < 0 ? d : 0;
            en->dev_ns = 0;
        }
#endif
        mean += d / (int64_t)n;
        if (n > 1) en->dev_ns += ((d < 0 ? -d : d) - en->dev_ns) / (int64_t)n;
        if (en->samples < UINT32_MAX) __atomic_store_n(&en->samples, en->samples + 1, __ATOMIC_RELAXED);
    }
    /* a dirty mean stays within [lo, band]: above, it learned inflated pairs (nothing makes a kernel
     * faster than it is: restart from this sample when it is within the band); below, the kernel's
     * cost rose (every recent sample is above it) */
    if (!clean) {
        if (mean > band) mean = v <= band ? v : band; /* it learned inflated pairs: start again */
        if (mean < lo) mean = lo;
    }
    if (mean < 0) mean = 0;
    __atomic_store_n(&en->mean_ns, mean, __ATOMIC_RELAXED);
    return clean ? v : mean;
}
