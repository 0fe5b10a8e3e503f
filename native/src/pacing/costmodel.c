/* gpuslice per-kernel cost model (see gpuslice/costmodel.h). */
#include "gpuslice/costmodel.h"
#include <stdlib.h>

#define OUTLIER_FLOOR_NS 10000
#define OUTLIER_RUN 16u

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

int gs_cost_should_sample(struct gs_cost_entry *en)
{
    if (__atomic_load_n(&en->samples, __ATOMIC_RELAXED) < GS_COST_LEARN) return 1;
    uint32_t n = __atomic_add_fetch(&en->launches, 1, __ATOMIC_RELAXED);
    return n % GS_COST_SAMPLE_EVERY == 0;
}

/* Writer only: a new entry for key (its fields first, the key last, so a reader that finds the key
 * finds a mean), or NULL when the table is 3/4 full (probing stays short for the readers). */
static struct gs_cost_entry *insert(struct gs_costmodel *m, uint64_t key, int64_t ns)
{
    if (!m->slot || m->used >= GS_COST_SLOTS / 4 * 3) return NULL;
    uint32_t s = home(key);
    while (__atomic_load_n(&m->slot[s].key, __ATOMIC_RELAXED)) s = (s + 1) & (GS_COST_SLOTS - 1);
    struct gs_cost_entry *en = &m->slot[s];
    __atomic_store_n(&en->mean_ns, ns, __ATOMIC_RELAXED);
    en->dev_ns = 0;
    en->outliers = 0;
    __atomic_store_n(&en->samples, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&en->key, key, __ATOMIC_RELEASE);
    m->used++;
    return en;
}

int64_t gs_cost_sample(struct gs_costmodel *m, uint64_t key, int64_t ns, int clean)
{
    if (ns < 0) ns = 0;
    struct gs_cost_entry *en = gs_cost_find(m, key);
    if (!en) {
        /* a first sample that was not clean may hold a neighbour's time slice: the next clean or
         * smaller samples pull it down (below-mean samples are never rejected) */
        insert(m, key, ns);
        return ns;
    }
    int64_t mean = __atomic_load_n(&en->mean_ns, __ATOMIC_RELAXED);
    if (!clean && en->samples >= 2 && ns > mean + mean / 2 && ns > mean + 4 * en->dev_ns + OUTLIER_FLOOR_NS) {
        if (en->outliers == 0 || ns < en->outlier_min_ns) en->outlier_min_ns = ns;
        if (++en->outliers < OUTLIER_RUN) return mean;
        /* the shape's cost changed: start again from the smallest of the run */
        ns = en->outlier_min_ns;
        en->outliers = 0;
        en->dev_ns = 0;
        __atomic_store_n(&en->mean_ns, ns, __ATOMIC_RELAXED);
        return ns;
    }
    en->outliers = 0;
    if (en->samples < 2 * GS_COST_LEARN && ns < mean / 2) {
        /* while learning, a sample far below the mean says the first ones were inflated (nothing
         * makes a kernel faster than it is): start again from it */
        mean = ns;
        en->dev_ns = 0;
    }
    int64_t d = ns - mean;
    /* EWMA 1/8 (the first few samples weigh more: 1/2, 1/3, ... until 1/8) */
    uint32_t n = en->samples < 8 ? en->samples + 1 : 8;
    mean += d / (int64_t)n;
    en->dev_ns += ((d < 0 ? -d : d) - en->dev_ns) / (int64_t)n;
    __atomic_store_n(&en->mean_ns, mean > 0 ? mean : 0, __ATOMIC_RELAXED);
    if (en->samples < UINT32_MAX) __atomic_store_n(&en->samples, en->samples + 1, __ATOMIC_RELAXED);
    return mean > 0 ? mean : 0;
}
