/* The per-process table of live allocations: (kind, pointer/handle) -> size, device, context, so
 * that a free gives back exactly what its allocation counted, and destroying a context forgets what
 * died with it. Open addressing with tombstones, one mutex (frees and allocations are far rarer than
 * kernel launches; a lookup is a few probes). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "gpuslice/fork.h"
#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/real.h"

#define MAX_ORD 64

struct entry {
    uint64_t key;
    uint64_t bytes;
    void *ctx;
    int32_t kind; /* 0 empty, -1 tombstone */
    int32_t ordinal;
};
static pthread_mutex_t g_tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *g_tab;
static size_t g_cap, g_filled, g_live;

static size_t slot_of(uint64_t key, int kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

static int tab_grow(void)
{
    size_t ncap = g_cap ? (g_live * 2 >= g_cap / 2 ? g_cap * 2 : g_cap) : 1024;
    struct entry *n = calloc(ncap, sizeof *n);
    if (!n) return -1;
    for (size_t i = 0; i < g_cap; i++) {
        if (g_tab[i].kind <= 0) continue;
        size_t s = slot_of(g_tab[i].key, g_tab[i].kind, ncap);
        while (n[s].kind) s = (s + 1) & (ncap - 1);
        n[s] = g_tab[i];
    }
    free(g_tab);
    g_tab = n;
    g_cap = ncap;
    g_filled = g_live;
    return 0;
}

void gs_track_add(int kind, uint64_t key, int ordinal, uint64_t bytes)
{
    void *ctx = NULL;
    if (kind != GS_K_HANDLE) { /* VMM handles outlive contexts; everything else dies with its context */
        static CUresult (*get)(CUcontext *);
        if (!get) get = (CUresult(*)(CUcontext *))gs_real("cuCtxGetCurrent");
        if (get) get((CUcontext *)&ctx);
    }
    pthread_mutex_lock(&g_tab_lock);
    if ((g_filled + 1) * 4 > g_cap * 3 && tab_grow()) {
        pthread_mutex_unlock(&g_tab_lock);
        /* Without an entry the free cannot give the bytes back: they stay counted until exit, which
         * errs on the safe side of the limit. */
        GS_WARN("allocation table: out of host memory; %llu bytes stay counted until exit", (unsigned long long)bytes);
        return;
    }
    size_t s = slot_of(key, kind, g_cap);
    while (g_tab[s].kind > 0 && !(g_tab[s].kind == kind && g_tab[s].key == key)) s = (s + 1) & (g_cap - 1);
    if (g_tab[s].kind > 0) {
        /* The driver handed out a key we still hold: our record is stale (freed behind our back,
         * e.g. by a context reset). Replace it. */
        g_tab[s].bytes = bytes;
        g_tab[s].ordinal = ordinal;
        g_tab[s].ctx = ctx;
        pthread_mutex_unlock(&g_tab_lock);
        return;
    }
    /* Reuse the first tombstone on the probe path if there is one. */
    size_t t = slot_of(key, kind, g_cap);
    while (g_tab[t].kind > 0) t = (t + 1) & (g_cap - 1);
    if (g_tab[t].kind == 0) g_filled++;
    g_tab[t] = (struct entry){key, bytes, ctx, kind, ordinal};
    g_live++;
    pthread_mutex_unlock(&g_tab_lock);
}

int gs_track_take(int kind, uint64_t key, int *ordinal, uint64_t *bytes)
{
    int found = 0;
    pthread_mutex_lock(&g_tab_lock);
    if (g_cap) {
        size_t s = slot_of(key, kind, g_cap);
        while (g_tab[s].kind != 0) {
            if (g_tab[s].kind == kind && g_tab[s].key == key) {
                *ordinal = g_tab[s].ordinal;
                *bytes = g_tab[s].bytes;
                g_tab[s].kind = -1;
                g_live--;
                found = 1;
                break;
            }
            s = (s + 1) & (g_cap - 1);
        }
    }
    pthread_mutex_unlock(&g_tab_lock);
    return found;
}

void gs_track_drop_ctx(void *ctx)
{
    if (!ctx) return;
    uint64_t freed[MAX_ORD] = {0};
    pthread_mutex_lock(&g_tab_lock);
    for (size_t i = 0; i < g_cap; i++) {
        if (g_tab[i].kind <= 0 || g_tab[i].kind == GS_K_CTX || g_tab[i].ctx != ctx) continue;
        if (g_tab[i].ordinal >= 0 && g_tab[i].ordinal < MAX_ORD) freed[g_tab[i].ordinal] += g_tab[i].bytes;
        g_tab[i].kind = -1;
        g_live--;
    }
    pthread_mutex_unlock(&g_tab_lock);
    for (int o = 0; o < MAX_ORD; o++)
        if (freed[o]) gs_mem_release(o, freed[o]);
}

static void after_fork_child(void)
{
    /* The child owns none of the parent's device memory (CUDA contexts do not survive fork): start
     * with an empty table. Re-create the lock in case another thread of the parent held it. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_tab_lock = fresh;
    free(g_tab);
    g_tab = NULL;
    g_cap = g_filled = g_live = 0;
}
GS_ON_FORK_CHILD(after_fork_child);
