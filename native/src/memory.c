/* Memory accounting against the slice's region, and the per-process table of live allocations.
 *
 * Reserve-then-allocate: the bytes are added to the region under its lock *before* the driver is
 * asked, and given back if the driver fails. Two threads or processes can therefore never both pass
 * the check for the last free bytes, which is what makes "0 bytes over the limit" hold. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuslice/hook.h"
#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/state.h"

#define MAX_ORD 64

/* Bytes the driver takes per CUDA context on top of the program's allocations, used when the slice
 * does not set context_overhead. Measured on an H100 80GB, driver 580.159, CUDA 13 (lazy module
 * loading): a bare driver context 518 MiB; PyTorch 2.11 after its first matmul 676 MiB beyond what
 * its allocator holds; real minus accounted in the fill tests up to 512 + 168 MiB (cudaMallocAsync).
 * 680 MiB covers every case measured (bench/results/2026-11-22-h100-memory.txt). Programs that
 * load much more kernel code should set context_overhead= in the slice. */
#define GS_DEFAULT_CONTEXT_OVERHEAD (680ull << 20)

static int g_devidx[MAX_ORD];
static uint64_t g_mylimit[GS_REGION_MAX_DEVICES]; /* min(region limit, this process's config) */
static int g_devidx_ready;
static pthread_mutex_t g_devidx_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------ allocation table */
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

/* ------------------------------------------------------------------ devices */
void gs_format_uuid(const CUuuid *u, char out[64])
{
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    memcpy(p, "GPU-", 4);
    p += 4;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        *p++ = hex[(unsigned char)u->bytes[i] >> 4];
        *p++ = hex[(unsigned char)u->bytes[i] & 15];
    }
    *p = 0;
}

int gs_current_ordinal(void)
{
    static CUresult (*get)(CUdevice *);
    if (!get) get = (CUresult(*)(CUdevice *))gs_real("cuCtxGetDevice");
    CUdevice d = -1;
    if (!get || get(&d) != CUDA_SUCCESS) return -1;
    return d;
}

static uint64_t context_overhead(void)
{
    return gs_cfg.context_overhead == GS_UNLIMITED ? GS_DEFAULT_CONTEXT_OVERHEAD : gs_cfg.context_overhead;
}

int gs_mem_dev_index(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORD) return -1;
    int idx = __atomic_load_n(&g_devidx[ordinal], __ATOMIC_ACQUIRE);
    if (idx != -2 && g_devidx_ready) return idx;
    pthread_mutex_lock(&g_devidx_lock);
    if (!g_devidx_ready) {
        for (int i = 0; i < MAX_ORD; i++) g_devidx[i] = -2;
        g_devidx_ready = 1;
    }
    idx = g_devidx[ordinal];
    if (idx != -2) {
        pthread_mutex_unlock(&g_devidx_lock);
        return idx;
    }
    char uuid[64];
    CUuuid u;
    CUresult (*getuuid)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))gs_real("cuDeviceGetUuid_v2");
    if (!getuuid) getuuid = (CUresult(*)(CUuuid *, CUdevice))gs_real("cuDeviceGetUuid");
    if (getuuid && getuuid(&u, ordinal) == CUDA_SUCCESS) gs_format_uuid(&u, uuid);
    else snprintf(uuid, sizeof uuid, "#%d", ordinal);
    uint64_t limit;
    uint32_t compute = (uint32_t)gs_cfg.compute;
    if (gs_cfg.device_count > 0) {
        int found;
        limit = gs_config_limit_for_uuid(&gs_cfg, uuid, &found);
        if (!found) {
            GS_ERROR("device %d (%s) is not in this slice (devices=%s...); its allocations are refused",
                     ordinal, uuid, gs_cfg.devices[0]);
            g_devidx[ordinal] = -1;
            pthread_mutex_unlock(&g_devidx_lock);
            return -1;
        }
    } else {
        limit = ordinal < GS_MAX_DEVICES ? gs_cfg.device_limit[ordinal] : gs_cfg.memory_limit;
        if (ordinal < GS_MAX_DEVICES && gs_cfg.compute_per_ordinal[ordinal] >= 0)
            compute = (uint32_t)gs_cfg.compute_per_ordinal[ordinal];
    }
    idx = -1;
    if (gs_region_lock(gs_shared) == 0) {
        idx = gs_region_device_index(gs_shared, uuid, limit, context_overhead(), compute);
        if (idx >= 0) {
            uint64_t rl = gs_shared->devices[idx].limit;
            g_mylimit[idx] = rl < limit ? rl : limit;
        }
        gs_region_unlock(gs_shared);
    }
    if (idx < 0) GS_ERROR("region %s: no room for device %s (max %d devices)", gs_cfg.region, uuid, GS_REGION_MAX_DEVICES);
    __atomic_store_n(&g_devidx[ordinal], idx, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_devidx_lock);
    return idx;
}

/* ------------------------------------------------------------------ accounting */
static CUresult refuse_own_failure(const char *what)
{
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        GS_ERROR("%s: accounting unavailable (region lock failed)%s", what,
                 gs_cfg.fail_open ? "; fail_open=1: letting calls through unlimited" : "; refusing");
    return gs_cfg.fail_open ? GS_PASS_UNCOUNTED : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult reserve_idx(int ordinal, int idx, uint64_t bytes, int ctx_delta, const char *what)
{
    int slot = gs_attach_slot();
    if (slot < 0) return refuse_own_failure(what);
    struct gs_region *r = gs_shared;
    if (gs_region_lock(r)) return refuse_own_failure(what);
    uint64_t limit = g_mylimit[idx];
    struct gs_region_device *d = &r->devices[idx];
    struct gs_region_proc *p = &r->procs[slot];
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t used = d->used;
        if (bytes <= limit && used <= limit - bytes) {
            gs_region_write_begin(r);
            p->used[idx] += bytes;
            if (p->used[idx] > p->peak[idx]) p->peak[idx] = p->used[idx];
            if (ctx_delta) p->contexts[idx] += (uint32_t)ctx_delta;
            d->used = used + bytes;
            if (d->used > d->peak) d->peak = d->used;
            gs_region_write_end(r);
            gs_region_unlock(r);
            return CUDA_SUCCESS;
        }
        /* Before refusing, give back what dead processes of the slice still hold. */
        if (attempt == 0 && gs_region_reclaim_dead(r) == 0) break;
    }
    uint64_t used = d->used;
    gs_region_write_begin(r);
    d->oom_refusals++;
    p->oom_refusals++;
    gs_region_write_end(r);
    gs_region_unlock(r);
    /* Frameworks retry and probe on OOM: log the first refusals, then only every power of two, so an
     * application hammering the limit cannot flood its own stderr. */
    static unsigned long refusals;
    unsigned long n = __atomic_add_fetch(&refusals, 1, __ATOMIC_RELAXED);
    if (n <= 4 || (n & (n - 1)) == 0)
        GS_WARN("%s of %llu bytes on device %d (%s) refused: the slice uses %llu of its %llu-byte limit "
                "(refusal %lu in this process)", what, (unsigned long long)bytes, ordinal, d->uuid,
                (unsigned long long)used, (unsigned long long)limit, n);
    if (gs_cfg.oom_policy == GS_OOM_KILL) {
        GS_ERROR("oom_policy=kill: killing process %d after a refused allocation", (int)getpid());
        kill(getpid(), SIGKILL);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult outside_slice(int ordinal, const char *what)
{
    GS_WARN("%s on device %d refused: that device is not part of this slice", what, ordinal);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult gs_mem_reserve(int ordinal, uint64_t bytes, const char *what)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0) return outside_slice(ordinal, what);
    return reserve_idx(ordinal, idx, bytes, 0, what);
}

static void release_idx(int idx, uint64_t bytes, int ctx_delta)
{
    int slot = gs_attach_slot();
    if (slot < 0 || gs_region_lock(gs_shared)) return;
    struct gs_region *r = gs_shared;
    struct gs_region_proc *p = &r->procs[slot];
    struct gs_region_device *d = &r->devices[idx];
    gs_region_write_begin(r);
    uint64_t b = bytes <= p->used[idx] ? bytes : p->used[idx];
    p->used[idx] -= b;
    d->used = d->used >= b ? d->used - b : 0;
    if (ctx_delta && p->contexts[idx]) p->contexts[idx]--;
    gs_region_write_end(r);
    gs_region_unlock(r);
}

void gs_mem_release(int ordinal, uint64_t bytes)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx >= 0 && bytes) release_idx(idx, bytes, 0);
}

CUresult gs_mem_ctx_add(int ordinal)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0) return outside_slice(ordinal, "context creation");
    return reserve_idx(ordinal, idx, gs_shared->devices[idx].context_overhead, 1, "context creation");
}

void gs_mem_ctx_remove(int ordinal)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx >= 0) release_idx(idx, gs_shared->devices[idx].context_overhead, 1);
}

/* ------------------------------------------------------------------ queries */
int gs_mem_query(int ordinal, uint64_t *limit, uint64_t *used)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0) return -1;
    *limit = g_mylimit[idx];
    *used = __atomic_load_n(&gs_shared->devices[idx].used, __ATOMIC_RELAXED);
    return 0;
}

int gs_mem_query_uuid(const char *uuid, uint64_t *limit, uint64_t *used)
{
    struct gs_region *r = gs_shared;
    uint32_t n = __atomic_load_n(&r->device_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_MAX_DEVICES; i++) {
        if (strncmp(r->devices[i].uuid, uuid, 64)) continue;
        uint64_t lim = r->devices[i].limit;
        int found;
        uint64_t mine = gs_cfg.device_count ? gs_config_limit_for_uuid(&gs_cfg, uuid, &found) : lim;
        *limit = mine < lim ? mine : lim;
        *used = __atomic_load_n(&r->devices[i].used, __ATOMIC_RELAXED);
        return 0;
    }
    /* Not yet in the region (no process of the slice touched it): still show the slice's limit. */
    int found = 0;
    uint64_t lim = gs_cfg.device_count ? gs_config_limit_for_uuid(&gs_cfg, uuid, &found) : GS_UNLIMITED;
    if (!found) return -1;
    *limit = lim;
    *used = 0;
    return 0;
}

int gs_mem_proc_usage(const char *uuid, uint32_t pid, uint64_t *bytes)
{
    struct gs_region *r = gs_shared;
    uint32_t n = __atomic_load_n(&r->device_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_MAX_DEVICES; i++) {
        if (strncmp(r->devices[i].uuid, uuid, 64)) continue;
        for (int p = 0; p < GS_REGION_MAX_PROCS; p++)
            if (r->procs[p].state == 1 && (uint32_t)r->procs[p].pid == pid) {
                *bytes = r->procs[p].used[i];
                return 1;
            }
    }
    return 0;
}

int gs_mem_init(void)
{
    pthread_mutex_lock(&g_devidx_lock);
    for (int i = 0; i < MAX_ORD; i++) g_devidx[i] = -2;
    g_devidx_ready = 1;
    pthread_mutex_unlock(&g_devidx_lock);
    return 0;
}

void gs_mem_after_fork_child(void)
{
    /* The child owns none of the parent's device memory (CUDA contexts do not survive fork): start
     * with an empty table. Re-create the locks in case another thread of the parent held them. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_tab_lock = fresh;
    g_devidx_lock = fresh;
    free(g_tab);
    g_tab = NULL;
    g_cap = g_filled = g_live = 0;
}
