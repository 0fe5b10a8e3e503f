/* A small CPU double of the CUDA driver API, loaded as libcuda.so.1 by the native tests. It keeps
 * the behaviour the enforcer depends on and nothing more:
 *  - devices with fixed UUIDs and a memory size (double_common.h), per-thread current context,
 *    primary contexts with a retain count, created contexts;
 *  - allocations backed by host memory (mmap MAP_NORESERVE, so a test can "allocate" gigabytes;
 *    GSDOUBLE_NOBACK=1 hands out unbacked addresses for benchmarks)
 *    and refused with CUDA_ERROR_OUT_OF_MEMORY past the device size, like a full card;
 *  - every allocation path the enforcer hooks (plain, pitch, managed, async, pools, VMM, arrays, and
 *    the legacy 32-bit cuMemAlloc/cuMemAllocPitch/cuMemFree/cuMemGetInfo/cuDeviceTotalMem);
 *  - VMM as CUDA frees it: a handle's memory goes when it is released AND no mapping of it remains
 *    (cuMemRelease of a mapped handle keeps the memory until the last cuMemUnmap);
 *  - stream-ordered pools: a default pool per device (plus cuMemPoolCreate'd ones) whose reservation
 *    grows in chunks of GSDOUBLE_POOL_CHUNK bytes (default 32 MiB) and is what the device holds;
 *    freed blocks stay cached up to CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0; the real driver
 *    releases at the next synchronisation, the double at the free itself); cuMemPoolTrimTo shrinks
 *    it; CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT/USED_MEM_CURRENT report it;
 *  - launches are no-ops that count (gsdouble_launches) so tests see pass-through;
 *  - cuGetProcAddress / _v2 with the real protocol: a base name plus cudaVersion and the
 *    per-thread-default-stream flag select the exported version (cuMemAlloc -> cuMemAlloc_v2,
 *    cuLaunchKernel + PTDS -> cuLaunchKernel_ptsz, cuGetProcAddress at 12000 -> cuGetProcAddress_v2),
 *    answered from an internal table (the real driver does not use dlsym for it either).
 * gsdouble_used(dev) lets tests compare what the enforcer counted with what the "driver" holds. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../../include/gpuslice/cuda_types.h"
#include "double_common.h"

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 8

struct ctx {
    int dev;
    int alive;
};
static struct ctx g_primary[MAXDEV];
static int g_primary_refs[MAXDEV];
static __thread struct ctx *t_current;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_used[MAXDEV];
static int g_inited;
EXPORT unsigned long gsdouble_launches;

/* live allocations: address -> (size, device); a tiny open-addressing table */
#define TAB 65536
/* kinds: 1 linear, 2 VMM handle, 3 array, 4 mipmapped array, 5 pool allocation (dev = pool index),
 * 6 VMM mapping (aux = handle). A handle counts its mappings in refs; released marks cuMemRelease. */
static struct { uint64_t key, size, aux; int dev, kind, refs, released, retains; } g_tab[TAB];

EXPORT unsigned long long gsdouble_used(int dev) { return dev >= 0 && dev < MAXDEV ? g_used[dev] : 0; }
/* What the live contexts of each device take (GSDOUBLE_CTX_BYTES per context, default 0): NVML's
 * double reports it as used, so the enforcer can measure a context's cost on this "card". */
static unsigned long long g_ctx_bytes[MAXDEV];
EXPORT unsigned long long gsdouble_ctx_bytes(int dev) { return dev >= 0 && dev < MAXDEV ? __atomic_load_n(&g_ctx_bytes[dev], __ATOMIC_RELAXED) : 0; }
static void ctx_bytes(int dev, int sign)
{
    const char *e = getenv("GSDOUBLE_CTX_BYTES");
    unsigned long long b = e ? strtoull(e, NULL, 10) : 0;
    if (sign > 0) __atomic_add_fetch(&g_ctx_bytes[dev], b, __ATOMIC_RELAXED);
    else __atomic_sub_fetch(&g_ctx_bytes[dev], b <= g_ctx_bytes[dev] ? b : g_ctx_bytes[dev], __ATOMIC_RELAXED);
}

static int ndev(void) { return dbl_device_count(); }

static CUresult take(int dev, uint64_t size)
{
    if (dev < 0 || dev >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    if (g_used[dev] + size > dbl_total()) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_used[dev] += size;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

static void record_aux(uint64_t key, uint64_t size, int dev, int kind, uint64_t aux)
{
    pthread_mutex_lock(&g_lock);
    size_t i = (key >> 4) % TAB;
    while (g_tab[i].key) i = (i + 1) % TAB;
    g_tab[i].key = key;
    g_tab[i].size = size;
    g_tab[i].dev = dev;
    g_tab[i].kind = kind;
    g_tab[i].aux = aux;
    g_tab[i].refs = g_tab[i].released = 0;
    pthread_mutex_unlock(&g_lock);
}
static void record(uint64_t key, uint64_t size, int dev, int kind) { record_aux(key, size, dev, kind, 0); }

/* Slot of (key, kind), or -1; caller holds g_lock. */
static long slot_of(uint64_t key, int kind)
{
    size_t i = (key >> 4) % TAB;
    while (g_tab[i].key && !(g_tab[i].key == key && g_tab[i].kind == kind)) i = (i + 1) % TAB;
    return g_tab[i].key ? (long)i : -1;
}

/* Remove key; returns size or 0 when unknown. Deletion re-inserts the rest of the probe run. Linear
 * memory, handles and arrays give their bytes back to the device; pool allocations and mappings do
 * not (the pool's reservation and the handle hold those). */
static uint64_t forget_aux(uint64_t key, int kind, int *dev, uint64_t *aux)
{
    pthread_mutex_lock(&g_lock);
    long found = slot_of(key, kind);
    if (found < 0) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    size_t i = (size_t)found;
    uint64_t size = g_tab[i].size;
    *dev = g_tab[i].dev;
    if (aux) *aux = g_tab[i].aux;
    if (kind != 5 && kind != 6) g_used[*dev] -= size;
    g_tab[i].key = 0;
    for (size_t j = (i + 1) % TAB; g_tab[j].key; j = (j + 1) % TAB) {
        __typeof__(g_tab[0]) e = g_tab[j];
        g_tab[j].key = 0;
        size_t k = (e.key >> 4) % TAB;
        while (g_tab[k].key) k = (k + 1) % TAB;
        g_tab[k] = e;
    }
    pthread_mutex_unlock(&g_lock);
    return size;
}
static uint64_t forget(uint64_t key, int kind, int *dev) { return forget_aux(key, kind, dev, NULL); }

/* GSDOUBLE_NOBACK=1: hand out unbacked, never-reused addresses (benchmarks of the enforcer's own
 * cost, where mmap would dominate). Nothing may touch that memory. */
static uintptr_t g_fake_next = (uintptr_t)1 << 44;
static void *host_map(uint64_t size)
{
    if (getenv("GSDOUBLE_NOBACK"))
        return (void *)__atomic_fetch_add(&g_fake_next, (size + 4095) & ~(uint64_t)4095, __ATOMIC_RELAXED);
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static CUresult alloc_on(int dev, uint64_t size, CUdeviceptr *out, int kind)
{
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = take(dev, size);
    if (r) return r;
    void *p = host_map(size);
    if (!p) {
        pthread_mutex_lock(&g_lock);
        g_used[dev] -= size;
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (CUdeviceptr)(uintptr_t)p;
    record(*out, size, dev, kind);
    return CUDA_SUCCESS;
}

static CUresult free_kind(uint64_t key, int kind)
{
    int dev;
    uint64_t size = forget(key, kind, &dev);
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    if (!getenv("GSDOUBLE_NOBACK")) munmap((void *)(uintptr_t)key, size);
    return CUDA_SUCCESS;
}

static int cur_dev(void) { return t_current && t_current->alive ? t_current->dev : -1; }
#define NEED_CTX() do { if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED; if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

static void capture_call(void); /* a question to the driver while a capture runs (below) */
/* gsdouble_capture_invalidated_by_alloc: the next captured allocation succeeds and the capture is invalidated right
 * after it (another thread's prohibited call): cuStreamIsCapturing then answers INVALIDATED (2) and cuStreamEndCapture
 * ends it with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, as the driver does. */
EXPORT int gsdouble_capture_invalidated_by_alloc;
static int g_capture_invalidated;
static int g_restart_pending;    /* a restart around the next allocation (capture_query): 1 between, 2 into the new one */
static uint64_t g_capture_epoch; /* bumped by every end and restart: part of a capture's id */
/* ---- init, devices */
EXPORT CUresult cuInit(unsigned flags) { (void)flags; g_inited = 1; return ndev() ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { capture_call(); if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED; *n = ndev(); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int i) { if (i < 0 || i >= ndev()) return CUDA_ERROR_INVALID_DEVICE; *d = i; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE; dbl_uuid_bytes(d, (unsigned char *)u->bytes); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) { snprintf(name, (size_t)len, "gpuslice CPU double %d", d); return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE; *b = dbl_total(); return CUDA_SUCCESS; }

/* ---- contexts */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_primary[d].dev = d;
    g_primary[d].alive = 1;
    if (g_primary_refs[d]++ == 0) ctx_bytes(d, +1);
    pthread_mutex_unlock(&g_lock);
    *pctx = (CUcontext)&g_primary[d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    if (d < 0 || d >= ndev() || g_primary_refs[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    if (--g_primary_refs[d] == 0) {
        g_primary[d].alive = 0;
        ctx_bytes(d, -1);
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }

static CUresult ctx_create(CUcontext *pctx, CUdevice d)
{
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    struct ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = d;
    c->alive = 1;
    ctx_bytes(d, +1);
    t_current = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *p, unsigned f, CUdevice d) { (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *p, void *a, int n, unsigned f, CUdevice d) { (void)a; (void)n; (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *p, void *a, unsigned f, CUdevice d) { (void)a; (void)f; return ctx_create(p, d); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
    struct ctx *x = (struct ctx *)c;
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    if (t_current == x) t_current = NULL;
    if (x->alive) ctx_bytes(x->dev, -1);
    x->alive = 0;
    if (x < g_primary || x >= g_primary + MAXDEV) free(x);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate(CUcontext *p, unsigned f, CUdevice d) { return cuCtxCreate_v2(p, f, d); }
EXPORT CUresult cuCtxDestroy(CUcontext c) { return cuCtxDestroy_v2(c); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { t_current = (struct ctx *)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)t_current; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT; *d = cur_dev(); return CUDA_SUCCESS; }
static CUresult unsafe_call(void); /* stream capture's rule (below) */
static CUresult violation(CUresult r);
EXPORT CUresult cuCtxSynchronize(void) { return unsafe_call(); }

/* ---- memory */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t b) { NEED_CTX(); return alloc_on(cur_dev(), b, p, 1); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t b, unsigned f) { (void)f; NEED_CTX(); return alloc_on(cur_dev(), b, p, 1); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e)
{
    (void)e;
    NEED_CTX();
    *pitch = (w + 511) & ~(size_t)511;
    return alloc_on(cur_dev(), (uint64_t)*pitch * h, p, 1);
}
/* ---- stream-ordered pools: [0, MAXDEV) are the devices' default pools, the rest cuMemPoolCreate'd */
#define MAXPOOL 320 /* past the enforcer's 256 tracked pools (test_enforcer_pool's s_untracked_pool_*) */
struct dpool { int dev, in_use_slot, destroyed; uint64_t reserved, used, threshold, reserved_high, used_high; };
static struct dpool g_pools[MAXPOOL];
static int g_current_pool[MAXDEV]; /* index of each device's current pool */
static uint64_t chunk(void) { const char *e = getenv("GSDOUBLE_POOL_CHUNK"); return e ? strtoull(e, NULL, 10) : 32ull << 20; }
static uint64_t round_chunk(uint64_t b) { uint64_t c = chunk(); return (b + c - 1) / c * c; }
static struct dpool *pool_of(CUmemoryPool h)
{
    struct dpool *p = (struct dpool *)h;
    return p >= g_pools && p < g_pools + MAXPOOL && (p - g_pools < MAXDEV ? p - g_pools < ndev() : p->in_use_slot) ? p : NULL;
}
/* Shrink a pool's reservation to `keep` bytes (whole chunks, never below what is in use). */
static void pool_shrink(struct dpool *p, uint64_t keep)
{
    uint64_t floor = round_chunk(p->used), target = keep > floor ? round_chunk(keep) : floor;
    if (target >= p->reserved) return;
    if (p->dev >= 0) g_used[p->dev] -= p->reserved - target;
    p->reserved = target;
}
static CUresult pool_alloc(struct dpool *p, CUdeviceptr *out, uint64_t b)
{
    if (!out || !b) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (p->used + b > p->reserved) {
        uint64_t grow = round_chunk(p->used + b - p->reserved);
        if (p->dev >= 0 && g_used[p->dev] + grow > dbl_total()) {
            pthread_mutex_unlock(&g_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (p->dev >= 0) g_used[p->dev] += grow;
        p->reserved += grow;
        if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
    }
    p->used += b;
    if (p->used > p->used_high) p->used_high = p->used;
    pthread_mutex_unlock(&g_lock);
    void *m = host_map(b);
    *out = (CUdeviceptr)(uintptr_t)m;
    record(*out, b, (int)(p - g_pools), 5);
    return CUDA_SUCCESS;
}
/* Free a pool allocation: back into the pool's cache, which keeps at most `threshold` bytes. */
static CUresult pool_free(CUdeviceptr ptr)
{
    int idx;
    uint64_t b = forget(ptr, 5, &idx);
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    if (!getenv("GSDOUBLE_NOBACK")) munmap((void *)(uintptr_t)ptr, b);
    pthread_mutex_lock(&g_lock);
    struct dpool *p = &g_pools[idx];
    p->used -= b;
    if (p->threshold < p->reserved - p->used) pool_shrink(p, p->used + p->threshold);
    if (p->destroyed && !p->used) {
        pool_shrink(p, 0);
        memset(p, 0, sizeof *p);
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    CUresult r = free_kind(p, 1);
    return r == CUDA_ERROR_INVALID_VALUE ? pool_free(p) : r; /* cudaFree of async memory */
}
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    NEED_CTX();
    *t = dbl_total();
    *f = dbl_total() - g_used[cur_dev()];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
    capture_call();
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    g_pools[d].dev = d;
    *pool = (CUmemoryPool)&g_pools[d];
    return CUDA_SUCCESS;
}
static CUresult current_pool(CUmemoryPool *pool, CUdevice d);
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
    capture_call();
    return current_pool(pool, d);
}
static CUresult current_pool(CUmemoryPool *pool, CUdevice d)
{
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    g_pools[d].dev = d;
    *pool = (CUmemoryPool)&g_pools[g_current_pool[d] ? g_current_pool[d] : d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool)
{
    struct dpool *p = pool_of(pool);
    if (d < 0 || d >= ndev() || !p || p->dev != d) return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[d] = (int)(p - g_pools);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *d) { (void)s; capture_call(); if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT; *d = cur_dev(); return CUDA_SUCCESS; }
/* During stream capture an asynchronous allocation is a node of the graph, owned by it and not by a pool: the
 * driver backs it from the device's graph memory pool when the graph is uploaded or launched (the double's
 * GSDOUBLE_GRAPH_BYTES). Here it gets an unbacked address of a range of its own, which a free in or after the
 * capture gives back. */
extern void *gsdouble_capture_stream;
EXPORT unsigned long gsdouble_graph_allocs; /* such allocations made */
/* The range is reserved (PROT_NONE, never touched) so that no mmap of the process, the pools' host memory among
 * them, can land in it: a fixed range (0x7e0000000000 + 1 TiB) did, in about one run of ten under ASan, wherever
 * ASLR put the mmap base, and the pools' frees inside it were taken for graph frees (test_enforcer s_every_path). */
#define GRAPH_VA_SPAN (64ull << 30)
static uint64_t g_graph_base, g_graph_va;
static pthread_once_t g_graph_once = PTHREAD_ONCE_INIT;
static void graph_reserve(void)
{
    void *m = mmap(NULL, GRAPH_VA_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) abort(); /* a test double without its range cannot tell its frees apart */
    __atomic_store_n(&g_graph_va, (uint64_t)(uintptr_t)m, __ATOMIC_RELAXED);
    __atomic_store_n(&g_graph_base, (uint64_t)(uintptr_t)m, __ATOMIC_RELEASE);
}
static int graph_owned(CUdeviceptr p)
{
    uint64_t base = __atomic_load_n(&g_graph_base, __ATOMIC_ACQUIRE);
    return base && p >= base && p < base + GRAPH_VA_SPAN;
}
static int graph_alloc(CUdeviceptr *p, size_t b, CUstream s)
{
    if (!s || (void *)s != __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED)) return 0;
    int restart = __atomic_exchange_n(&g_restart_pending, 0, __ATOMIC_RELAXED);
    if (restart) __atomic_add_fetch(&g_capture_epoch, 1, __ATOMIC_RELAXED);
    if (restart == 1) return 0; /* between two captures: the pool's */
    pthread_once(&g_graph_once, graph_reserve);
    *p = __atomic_fetch_add(&g_graph_va, (b + 0xfffff) & ~0xfffffull, __ATOMIC_RELAXED);
    if (*p + b > g_graph_base + GRAPH_VA_SPAN) abort(); /* more than a test asks for */
    __atomic_add_fetch(&gsdouble_graph_allocs, 1, __ATOMIC_RELAXED);
    return 1;
}
/* gsdouble_capture_grows_pool: bytes the current pool's reserve grows by across the next captured allocation (the
 * driver's own doing, e.g. another thread's allocation meanwhile): what the enforcer does when a capture's allocation
 * is still the graph's but the pool grew */
EXPORT unsigned long long gsdouble_capture_grows_pool;
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t b, CUstream s)
{
    NEED_CTX();
    CUmemoryPool pool = NULL;
    current_pool(&pool, cur_dev());
    if (p && b && graph_alloc(p, b, s)) {
        uint64_t grow = __atomic_exchange_n(&gsdouble_capture_grows_pool, 0, __ATOMIC_RELAXED);
        if (grow && take(cur_dev(), grow) == CUDA_SUCCESS) pool_of(pool)->reserved += grow;
        if (__atomic_exchange_n(&gsdouble_capture_invalidated_by_alloc, 0, __ATOMIC_RELAXED))
            __atomic_store_n(&g_capture_invalidated, 1, __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    return pool_alloc(pool_of(pool), p, b);
}
/* An allocation from the current pool that no hook sees (memory the enforcer did not count: tests of drift) */
EXPORT CUresult gsdouble_alloc_async_unseen(CUdeviceptr *p, size_t b) { return cuMemAllocAsync(p, b, NULL); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t b, CUstream s) { return cuMemAllocAsync(p, b, s ? s : (CUstream)0x2); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    if (graph_owned(p)) return CUDA_SUCCESS;
    CUresult r = pool_free(p);
    return r == CUDA_ERROR_INVALID_VALUE ? free_kind(p, 1) : r; /* cuMemAlloc'd memory may be freed async too */
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
/* CUmemPoolProps starts with allocType, handleTypes, location. */
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props)
{
    const struct { int alloc, handles; CUmemLocation loc; } *pp = props;
    if (!pool || !pp) return CUDA_ERROR_INVALID_VALUE;
    int on_dev = pp->loc.type == CU_MEM_LOCATION_TYPE_DEVICE;
    if (on_dev && (pp->loc.id < 0 || pp->loc.id >= ndev())) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    for (int i = MAXDEV; i < MAXPOOL; i++)
        if (!g_pools[i].in_use_slot) {
            memset(&g_pools[i], 0, sizeof g_pools[i]);
            g_pools[i].in_use_slot = 1;
            g_pools[i].dev = on_dev ? pp->loc.id : -1;
            pthread_mutex_unlock(&g_lock);
            *pool = (CUmemoryPool)&g_pools[i];
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct dpool *p = pool_of(pool);
    if (!p || p - g_pools < MAXDEV) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (p->used) {
        p->destroyed = 1; /* released with its last allocation */
    } else {
        pool_shrink(p, 0);
        memset(p, 0, sizeof *p);
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    capture_call();
    struct dpool *p = pool_of(pool);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    pool_shrink(p, keep);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
/* a prohibited call while the thread captures in global mode: on the H100 (driver 580.159) it failed with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidated the capture (bench/gpu/capture_pool_probe.py, 2026-12-06) */
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    capture_call();
    CUresult unsafe = unsafe_call();
    if (unsafe != CUDA_SUCCESS) return unsafe;
    struct dpool *p = pool_of(pool);
    if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
    uint64_t v;
    switch (attr) {
    case 4: v = p->threshold; break;
    case 5: v = p->reserved; break;
    case 6: v = p->reserved_high; break;
    case 7: v = p->used; break;
    case 8: v = p->used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    struct dpool *p = pool_of(pool);
    if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
    uint64_t v;
    memcpy(&v, value, sizeof v);
    pthread_mutex_lock(&g_lock);
    if (attr == 4) p->threshold = v;
    else if (attr == 6) p->reserved_high = p->reserved;
    else if (attr == 8) p->used_high = p->used;
    pthread_mutex_unlock(&g_lock);
    return attr == 4 || attr == 6 || attr == 8 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
/* The owning device has read-write access (3), others none (no peer access in the double). */
EXPORT CUresult cuMemPoolGetAccess(unsigned long long *flags, CUmemoryPool pool, CUmemLocation *loc)
{
    capture_call();
    struct dpool *p = pool_of(pool);
    if (!p || !flags || !loc) return CUDA_ERROR_INVALID_VALUE;
    *flags = loc->type == CU_MEM_LOCATION_TYPE_DEVICE && loc->id == p->dev ? 3 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t b, CUmemoryPool pool, CUstream s)
{
    struct dpool *dp = pool_of(pool);
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!dp) return CUDA_ERROR_INVALID_VALUE;
    if (p && b && graph_alloc(p, b, s)) return CUDA_SUCCESS;
    if (dp - g_pools < MAXDEV) dp->dev = (int)(dp - g_pools);
    return pool_alloc(dp, p, b);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t b, CUmemoryPool pool, CUstream s) { return cuMemAllocFromPoolAsync(p, b, pool, s ? s : (CUstream)0x2); }

/* ---- legacy 32-bit entry points: unbacked 32-bit addresses (nothing may touch them) */
static uint32_t g_legacy_next = 0x10000000u;
static CUresult legacy_alloc(CUdeviceptr_v1 *p, uint64_t b)
{
    if (!p || !b) return CUDA_ERROR_INVALID_VALUE;
    if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = take(cur_dev(), b);
    if (r) return r;
    *p = __atomic_fetch_add(&g_legacy_next, (uint32_t)((b + 4095) & ~4095ull), __ATOMIC_RELAXED);
    record(*p, b, cur_dev(), 7);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int b) { return legacy_alloc(p, b); }
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int e)
{
    (void)e;
    *pitch = (w + 511) & ~511u;
    return legacy_alloc(p, (uint64_t)*pitch * h);
}
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { int dev; return forget(p, 7, &dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemGetInfo(unsigned int *f, unsigned int *t)
{
    NEED_CTX();
    uint64_t tot = dbl_total(), fr = tot - g_used[cur_dev()];
    *t = tot > 0xFFFFFFFFull ? 0xFFFFFFFFu : (unsigned)tot;
    *f = fr > 0xFFFFFFFFull ? 0xFFFFFFFFu : (unsigned)fr;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d)
{
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    *b = dbl_total() > 0xFFFFFFFFull ? 0xFFFFFFFFu : (unsigned)dbl_total();
    return CUDA_SUCCESS;
}

/* VMM: a handle is the host mapping of the physical allocation. Its memory goes when it is released
 * and no mapping of it remains, whichever comes last (as CUDA documents for cuMemRelease). */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int opt) { (void)prop; (void)opt; *g = 2u << 20; return CUDA_SUCCESS; }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED;
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || size % (2u << 20)) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p;
    CUresult r = alloc_on(prop->location.id, size, &p, 2);
    if (!r) *h = p;
    return r;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    pthread_mutex_lock(&g_lock);
    long i = slot_of(h, 2);
    if (i < 0 || g_tab[i].released) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (g_tab[i].retains > 0) { /* a reference cuMemRetainAllocationHandle added: only it goes */
        g_tab[i].retains--;
        pthread_mutex_unlock(&g_lock);
        return CUDA_SUCCESS;
    }
    int mapped = g_tab[i].refs > 0;
    if (mapped) g_tab[i].released = 1; /* the memory stays until the last unmap */
    pthread_mutex_unlock(&g_lock);
    return mapped ? CUDA_SUCCESS : free_kind(h, 2);
}
/* The handle behind a mapped address, with one more reference (each needs its own cuMemRelease). */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    pthread_mutex_lock(&g_lock);
    long m = slot_of((uint64_t)(uintptr_t)addr, 6);
    long i = m >= 0 ? slot_of(g_tab[m].aux, 2) : -1;
    if (i >= 0) {
        g_tab[i].retains++;
        *h = g_tab[m].aux;
    }
    pthread_mutex_unlock(&g_lock);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f)
{
    (void)align; (void)addr; (void)f;
    void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { munmap((void *)(uintptr_t)p, size); return CUDA_SUCCESS; }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f)
{
    (void)f;
    if (off) return CUDA_ERROR_INVALID_VALUE; /* "currently must be zero" */
    pthread_mutex_lock(&g_lock);
    long i = slot_of(h, 2);
    int ok = i >= 0 && !g_tab[i].released && size <= g_tab[i].size;
    if (ok) g_tab[i].refs++;
    int dev = ok ? g_tab[i].dev : 0;
    pthread_mutex_unlock(&g_lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    record_aux(p, size, dev, 6, h);
    return CUDA_SUCCESS;
}
/* Unmap whole mappings covering [p, p+size). */
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    CUdeviceptr at = p;
    while (at < p + size) {
        int dev;
        uint64_t h, msize = forget_aux(at, 6, &dev, &h);
        if (!msize) return at == p ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        pthread_mutex_lock(&g_lock);
        long i = slot_of(h, 2);
        int gone = i >= 0 && --g_tab[i].refs == 0 && g_tab[i].released;
        pthread_mutex_unlock(&g_lock);
        if (gone) free_kind(h, 2);
        at += msize;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *d, size_t n) { (void)p; (void)size; (void)d; (void)n; return CUDA_SUCCESS; }

/* arrays: sized like the enforcer's estimate would be for 1/2/4-byte formats */
static uint64_t fmt_bytes(int f) { return f == 1 || f == 8 ? 1 : f == 2 || f == 9 || f == 16 ? 2 : 4; }
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    NEED_CTX();
    CUdeviceptr p;
    CUresult r = alloc_on(cur_dev(), (uint64_t)d->Width * (d->Height ? d->Height : 1) * fmt_bytes(d->Format) * d->NumChannels, &p, 3);
    if (!r) *a = (CUarray)(uintptr_t)p;
    return r;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    NEED_CTX();
    CUdeviceptr p;
    CUresult r = alloc_on(cur_dev(), (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * fmt_bytes(d->Format) * d->NumChannels, &p, 3);
    if (!r) *a = (CUarray)(uintptr_t)p;
    return r;
}
EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    CUDA_ARRAY_DESCRIPTOR v2 = {d->Width, d->Height, d->Format, d->NumChannels};
    return cuArrayCreate_v2(a, &v2);
}
EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    CUDA_ARRAY3D_DESCRIPTOR v2 = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
    return cuArray3DCreate_v2(a, &v2);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return free_kind((uintptr_t)a, 3); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    NEED_CTX();
    uint64_t b = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < levels; l++) {
        b += (uint64_t)w * (h ? h : 1) * (z ? z : 1) * fmt_bytes(d->Format) * d->NumChannels;
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h;
        if (!(d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP))) z = z > 1 ? z / 2 : z; /* layers and faces stay */
    }
    CUdeviceptr p;
    CUresult r = alloc_on(cur_dev(), b, &p, 4);
    if (!r) *a = (CUmipmappedArray)(uintptr_t)p;
    return r;
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return free_kind((uintptr_t)a, 4); }

/* ---- launches, streams, events (what a pacer needs; events carry a host timestamp) */
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh, CUstream s, void **p, void **x)
{
    (void)f; (void)a; (void)b; (void)c; (void)d; (void)e; (void)g; (void)sh; (void)p; (void)x;
    NEED_CTX();
    /* the legacy stream while the per-thread (blocking) stream captures: refused, the capture kept (stream capture's rule) */
    if ((s == NULL || (void *)s == (void *)0x1) && __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED) == (void *)0x2)
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    __atomic_add_fetch(&gsdouble_launches, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh, CUstream s, void **p, void **x) { return cuLaunchKernel(f, a, b, c, d, e, g, sh, s ? s : (CUstream)0x2, p, x); }
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **p, void **x) { return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, cfg ? cfg->hStream : NULL, p, x); }
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **p, void **x) { return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, cfg && cfg->hStream ? cfg->hStream : (CUstream)0x2, p, x); }
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh, CUstream s, void **p) { return cuLaunchKernel(f, a, b, c, d, e, g, sh, s, p, NULL); }
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned sh, CUstream s, void **p) { return cuLaunchKernel(f, a, b, c, d, e, g, sh, s ? s : (CUstream)0x2, p, NULL); }
/* ---- graphs: an executable graph made by cuGraphInstantiate* has memory nodes of GSDOUBLE_GRAPH_BYTES
 * (default 0), backed from the device's graph pool when it is uploaded or first launched; a destroyed
 * graph's memory stays reserved until cuDeviceGraphMemTrim (as the driver keeps it for reuse). */
struct gexec { int dev, backed, used; };
static struct gexec g_execs[64];
static unsigned long long g_graph_reserved[MAXDEV], g_graph_idle[MAXDEV];
static uint64_t graph_bytes(void) { const char *e = getenv("GSDOUBLE_GRAPH_BYTES"); return e ? strtoull(e, NULL, 10) : 0; }
static struct gexec *gexec_of(CUgraphExec g)
{
    struct gexec *x = (struct gexec *)g;
    return x >= g_execs && x < g_execs + 64 && x->used ? x : NULL;
}
static CUresult instantiate(CUgraphExec *p)
{
    NEED_CTX();
    for (int i = 0; i < 64; i++)
        if (!g_execs[i].used) {
            g_execs[i] = (struct gexec){cur_dev(), 0, 1};
            *p = (CUgraphExec)&g_execs[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult back(struct gexec *x)
{
    if (!x || x->backed) return CUDA_SUCCESS;
    uint64_t b = graph_bytes();
    uint64_t from_idle = b <= g_graph_idle[x->dev] ? b : g_graph_idle[x->dev]; /* reuse what the pool kept */
    if (b - from_idle && take(x->dev, b - from_idle) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    g_graph_idle[x->dev] -= from_idle;
    g_graph_reserved[x->dev] += b - from_idle;
    x->backed = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *p, void *g, unsigned long long f) { (void)g; (void)f; return instantiate(p); }
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *p, void *g, void *params) { (void)g; (void)params; return instantiate(p); }
EXPORT CUresult cuGraphUpload(CUgraphExec g, CUstream s) { (void)s; return back(gexec_of(g)); }
EXPORT CUresult cuGraphExecDestroy(CUgraphExec g)
{
    struct gexec *x = gexec_of(g);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    if (x->backed) g_graph_idle[x->dev] += graph_bytes();
    x->used = 0;
    return CUDA_SUCCESS;
}
/* As the driver documents it: memory of graphs not executing (none is, in the double) goes back to the system,
 * a live graph's included, and a trimmed graph's memory is backed again at its next launch. */
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d)
{
    if (d < 0 || d >= ndev()) return CUDA_ERROR_INVALID_DEVICE;
    uint64_t live = 0;
    for (int i = 0; i < 64; i++)
        if (g_execs[i].used && g_execs[i].dev == d && g_execs[i].backed) {
            g_execs[i].backed = 0;
            live += graph_bytes();
        }
    pthread_mutex_lock(&g_lock);
    g_used[d] -= g_graph_idle[d] + live;
    pthread_mutex_unlock(&g_lock);
    g_graph_reserved[d] -= g_graph_idle[d] + live;
    g_graph_idle[d] = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *v)
{
    capture_call();
    if (d < 0 || d >= ndev() || attr != 2) return CUDA_ERROR_INVALID_VALUE;
    *(cuuint64_t *)v = g_graph_reserved[d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    /* launched into a graph being captured: a node of that graph, nothing runs or is backed now */
    if (s && (void *)s == __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED)) return gexec_of(g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    CUresult r = back(gexec_of(g));
    return r != CUDA_SUCCESS ? r : cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s ? s : (CUstream)0x2); }
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned f) { (void)f; static int dummy; *s = (CUstream)&dummy; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return CUDA_SUCCESS; }
/* a query of or a wait for the capturing stream itself is forbidden in any mode; others are unsafe calls */
static CUresult stream_look(CUstream s)
{
    if (s && (void *)s == __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED)) return violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    return unsafe_call();
}
EXPORT CUresult cuStreamQuery(CUstream s) { return stream_look(s); }
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_look(s); }
struct ev { struct timespec t; int captured; };
EXPORT CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = calloc(1, sizeof(struct ev)); return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
EXPORT CUresult cuEventDestroy_v2(void *e) { free(e); return CUDA_SUCCESS; }
/* what the pacer asked about, so tests can tell the legacy stream (0) from the per-thread one (0x2):
 * the last stream an event was recorded on, how many records, and a stream "under capture" */
EXPORT void *gsdouble_last_event_stream;
EXPORT unsigned long gsdouble_event_records;
EXPORT void *gsdouble_capture_stream = (void *)-1; /* none */
EXPORT void *gsdouble_last_capture_query;
/* Stream capture as the driver polices it. gsdouble_capture_stream set is a capture in global mode (the default),
 * as by another thread of the process; the per-thread default stream (0x2) is a blocking stream, the streams a
 * test makes up are non-blocking ones. Meanwhile:
 *  - a look at an event (query, elapsed time, synchronize) or a stream or context synchronize or query from a
 *    thread in global mode is a "potentially unsafe" call: it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 *    and invalidates the capture (a thread in thread-local or relaxed mode (cuThreadExchangeStreamCaptureMode)
 *    may make it);
 *  - a look at an event recorded into the capturing stream fails in any mode (CUDA_ERROR_CAPTURED_EVENT);
 *  - the legacy stream cannot be used while a blocking stream captures: cuStreamIsCapturing on it answers
 *    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT.
 * The double counts each forbidden call in gsdouble_capture_violations; gsdouble_event_looks counts every look. */
EXPORT unsigned long gsdouble_capture_violations, gsdouble_event_looks;
static __thread int t_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */
EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    capture_call();
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int was = t_capture_mode;
    t_capture_mode = *mode;
    *mode = was;
    return CUDA_SUCCESS;
}
static int capture_active(void) { return __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED) != (void *)-1; }
static CUresult violation(CUresult r)
{
    __atomic_add_fetch(&gsdouble_capture_violations, 1, __ATOMIC_RELAXED);
    return r;
}
/* gsdouble_capture_calls: questions to the driver made while a capture runs, in any mode (the device count, a stream's
 * device, a pool, a pool's attribute or access, graph memory, a trim, a capture-mode exchange); the capture's own
 * work (allocations, frees, launches), cuStreamIsCapturing and cuCtxGetDevice are not counted (the launch hooks ask
 * the current device at every launch, captured ones included, and PyTorch's captures with its default allocator
 * pass under the enforcer on the H100: tests/local/test_gpu_coloc.py, 2026-12-06). The H100 failed a capture when the
 * enforcer asked such questions around a captured allocation, its pool reads in relaxed mode included (2026-12-06);
 * the H200 passed it when the enforcer asked none but cuStreamIsCapturing (7b50452, 2026-11-30). Which question the
 * driver minds is not known, so the double counts them all. */
EXPORT __thread unsigned long gsdouble_capture_calls; /* the asking thread's: the pacer's poller, relaxed for good from
                                                       * its start (which may fall inside a capture), asks on its own */
static void capture_call(void)
{
    if (capture_active()) gsdouble_capture_calls++;
}
/* the capture on s ends (the dummy graph it made is not one the double's graph calls know) */
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    void *cap = (void *)s;
    if (!__atomic_compare_exchange_n(&gsdouble_capture_stream, &cap, (void *)-1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return CUDA_ERROR_ILLEGAL_STATE;
    __atomic_add_fetch(&g_capture_epoch, 1, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&g_capture_invalidated, 0, __ATOMIC_RELAXED)) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    static int dummy;
    if (g) *g = (CUgraph)&dummy;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return cuStreamEndCapture(s ? s : (CUstream)0x2, g); }
static CUresult unsafe_call(void)
{
    return capture_active() && t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
                                                                               : CUDA_SUCCESS;
}
static CUresult look(const struct ev *x)
{
    __atomic_add_fetch(&gsdouble_event_looks, 1, __ATOMIC_RELAXED);
    CUresult r = unsafe_call();
    if (r == CUDA_SUCCESS && x && x->captured) r = violation(CUDA_ERROR_CAPTURED_EVENT);
    return r;
}
EXPORT CUresult cuEventRecord(void *e, CUstream s)
{
    __atomic_store_n(&gsdouble_last_event_stream, (void *)s, __ATOMIC_RELAXED);
    __atomic_add_fetch(&gsdouble_event_records, 1, __ATOMIC_RELAXED);
    clock_gettime(CLOCK_MONOTONIC, &((struct ev *)e)->t);
    ((struct ev *)e)->captured = (void *)s == __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord_ptsz(void *e, CUstream s) { return cuEventRecord(e, s ? s : (CUstream)0x2); }
/* gsdouble_capture_ends_after_query: the capture ends right after the next "active" answer (another thread's
 * cuStreamEndCapture between the question and what the asker does next) */
EXPORT int gsdouble_capture_ends_after_query;
/* gsdouble_capture_restarts_after_query: right after the next "active" answer the capture ends and another begins on
 * the same stream, as when another thread ends a capture and begins one around the asker's allocation; the capture's
 * id changes. 1: the next allocation falls in between (the driver's: a pool allocation); 2: it is the new graph's. */
EXPORT int gsdouble_capture_restarts_after_query;
static CUresult capture_query(CUstream s, int *status, uint64_t *id)
{
    __atomic_store_n(&gsdouble_last_capture_query, (void *)s, __ATOMIC_RELAXED);
    void *cap = __atomic_load_n(&gsdouble_capture_stream, __ATOMIC_RELAXED);
    if ((s == NULL || (void *)s == (void *)0x1) && cap == (void *)0x2) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *status = (void *)s == cap ? (__atomic_load_n(&g_capture_invalidated, __ATOMIC_RELAXED) ? 2 : 1) : 0; /* ACTIVE, INVALIDATED */
    if (id) *id = *status == 1 ? ((uint64_t)(uintptr_t)cap << 16) + __atomic_load_n(&g_capture_epoch, __ATOMIC_RELAXED) : 0;
    if (*status && __atomic_exchange_n(&gsdouble_capture_ends_after_query, 0, __ATOMIC_RELAXED))
        __atomic_store_n(&gsdouble_capture_stream, (void *)-1, __ATOMIC_RELAXED);
    int restart = *status == 1 ? __atomic_exchange_n(&gsdouble_capture_restarts_after_query, 0, __ATOMIC_RELAXED) : 0;
    if (restart) __atomic_store_n(&g_restart_pending, restart, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) { return capture_query(s, status, NULL); }
/* CUDA 12.3's form; the enforcer asks it for the capture's id (the graph, dependencies and edges are not modelled:
 * asked for, they are refused) */
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, int *status, uint64_t *id, void *graph, void *deps, void *edges,
                                          size_t *ndeps)
{
    if (!status || graph || deps || edges || ndeps) return CUDA_ERROR_INVALID_VALUE;
    return capture_query(s, status, id);
}
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, int *status, uint64_t *id, void *graph, void *deps,
                                               void *edges, size_t *ndeps)
{
    return cuStreamGetCaptureInfo_v3(s ? s : (CUstream)0x2, status, id, graph, deps, edges, ndeps);
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s ? s : (CUstream)0x2, status); }
/* nonzero: every event stays pending (CUDA_ERROR_NOT_READY), as behind a long queue: a process's drain
 * record then says "backlog" to its yielding neighbours (test_enforcer_spatial) */
EXPORT int gsdouble_events_pending;
EXPORT CUresult cuEventQuery(void *e)
{
    CUresult r = look(e);
    if (r != CUDA_SUCCESS) return r;
    return __atomic_load_n(&gsdouble_events_pending, __ATOMIC_RELAXED) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(void *e) { return look(e); }
EXPORT CUresult cuEventElapsedTime(float *ms, void *a, void *b)
{
    struct ev *x = a, *y = b;
    CUresult r = look(x);
    if (r == CUDA_SUCCESS && y->captured) r = look(y);
    if (r != CUDA_SUCCESS) return r;
    *ms = (float)((y->t.tv_sec - x->t.tv_sec) * 1e3 + (y->t.tv_nsec - x->t.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}

/* modules: any image "loads"; functions are dummies the no-op launches accept (for benchmarks) */
static int g_module_dummy, g_function_dummy;
EXPORT CUresult cuModuleLoadData(void **mod, const void *image) { (void)image; *mod = &g_module_dummy; return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) { (void)mod; (void)name; *fn = &g_function_dummy; return CUDA_SUCCESS; }

/* ---- cuGetProcAddress: (base name, cudaVersion, flags) -> exported version */
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st);
#define F(n) {#n, (void *)n}
static const struct { const char *name; void *fn; } g_syms[] = {
    F(cuInit), F(cuDriverGetVersion), F(cuDeviceGetCount), F(cuDeviceGet), F(cuDeviceGetUuid), F(cuDeviceGetUuid_v2),
    F(cuDeviceGetName), F(cuDeviceTotalMem_v2), F(cuDevicePrimaryCtxRetain), F(cuDevicePrimaryCtxRelease),
    F(cuDevicePrimaryCtxRelease_v2), F(cuDevicePrimaryCtxReset), F(cuDevicePrimaryCtxReset_v2), F(cuCtxCreate_v2),
    F(cuCtxCreate_v3), F(cuCtxCreate_v4), F(cuCtxDestroy_v2), F(cuCtxSetCurrent), F(cuCtxGetCurrent), F(cuCtxGetDevice),
    F(cuCtxSynchronize), F(cuMemAlloc_v2), F(cuMemAllocManaged), F(cuMemAllocPitch_v2), F(cuMemFree_v2),
    F(cuMemGetInfo_v2), F(cuMemAllocAsync), F(cuMemAllocAsync_ptsz), F(cuMemFreeAsync), F(cuMemFreeAsync_ptsz),
    F(cuMemPoolCreate), F(cuMemPoolDestroy), F(cuMemAllocFromPoolAsync), F(cuMemAllocFromPoolAsync_ptsz),
    F(cuMemGetAllocationGranularity), F(cuMemCreate), F(cuMemRelease), F(cuMemAddressReserve), F(cuMemAddressFree),
    F(cuMemMap), F(cuMemUnmap), F(cuMemSetAccess), F(cuMemRetainAllocationHandle), F(cuArrayCreate_v2), F(cuArray3DCreate_v2), F(cuArrayDestroy),
    F(cuMipmappedArrayCreate), F(cuMipmappedArrayDestroy), F(cuLaunchKernel), F(cuLaunchKernel_ptsz),
    F(cuLaunchKernelEx), F(cuLaunchKernelEx_ptsz), F(cuLaunchCooperativeKernel), F(cuLaunchCooperativeKernel_ptsz),
    F(cuGraphLaunch), F(cuGraphLaunch_ptsz), F(cuGraphInstantiateWithFlags), F(cuGraphInstantiateWithParams),
    F(cuGraphUpload), F(cuGraphExecDestroy), F(cuDeviceGraphMemTrim), F(cuDeviceGetGraphMemAttribute), F(cuStreamCreate), F(cuStreamDestroy_v2), F(cuStreamQuery),
    F(cuStreamSynchronize), F(cuEventCreate), F(cuEventDestroy_v2), F(cuEventRecord), F(cuEventRecord_ptsz),
    F(cuEventQuery), F(cuEventSynchronize), F(cuEventElapsedTime), F(cuStreamIsCapturing), F(cuStreamIsCapturing_ptsz), F(cuStreamEndCapture), F(cuStreamEndCapture_ptsz), F(cuStreamGetCaptureInfo_v3), F(cuStreamGetCaptureInfo_v3_ptsz), F(cuThreadExchangeStreamCaptureMode), F(cuGetProcAddress), F(cuGetProcAddress_v2),
    F(cuModuleLoadData), F(cuModuleGetFunction), F(cuDeviceGetDefaultMemPool), F(cuDeviceGetMemPool),
    F(cuDeviceSetMemPool), F(cuStreamGetDevice), F(cuMemPoolTrimTo), F(cuMemPoolGetAttribute),
    F(cuMemPoolSetAttribute), F(cuMemPoolGetAccess), F(cuMemAlloc), F(cuMemAllocPitch), F(cuMemFree),
    F(cuMemGetInfo), F(cuDeviceTotalMem), F(cuArrayCreate), F(cuArray3DCreate), F(cuCtxCreate), F(cuCtxDestroy),
};
/* Versioned names and the CUDA version that introduced each (cuda.h's __CUDA_API_VERSION rules). */
static const struct { const char *base; int since; const char *suffix; } g_versions[] = {
    {"cuMemAlloc", 3020, "_v2"}, {"cuMemAllocPitch", 3020, "_v2"}, {"cuMemFree", 3020, "_v2"},
    {"cuMemGetInfo", 3020, "_v2"}, {"cuDeviceTotalMem", 3020, "_v2"}, {"cuArrayCreate", 3020, "_v2"},
    {"cuArray3DCreate", 3020, "_v2"}, {"cuCtxCreate", 12050, "_v4"}, {"cuCtxCreate", 11040, "_v3"},
    {"cuCtxCreate", 3020, "_v2"}, {"cuCtxDestroy", 4000, "_v2"}, {"cuDevicePrimaryCtxRelease", 11000, "_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "_v2"}, {"cuGetProcAddress", 12000, "_v2"}, {"cuDeviceGetUuid", 11040, "_v2"},
    {"cuStreamDestroy", 4000, "_v2"}, {"cuEventDestroy", 4000, "_v2"},
};
static const char *g_ptsz[] = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
                               "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuEventRecord"};

static void *lookup(const char *sym, int ver, cuuint64_t flags)
{
    char name[128];
    snprintf(name, sizeof name, "%s", sym);
    for (size_t i = 0; i < sizeof g_versions / sizeof g_versions[0]; i++)
        if (!strcmp(sym, g_versions[i].base) && ver >= g_versions[i].since) {
            snprintf(name, sizeof name, "%s%s", sym, g_versions[i].suffix);
            break;
        }
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (size_t i = 0; i < sizeof g_ptsz / sizeof g_ptsz[0]; i++)
            if (!strcmp(sym, g_ptsz[i])) snprintf(name, sizeof name, "%s_ptsz", sym);
    for (size_t i = 0; i < sizeof g_syms / sizeof g_syms[0]; i++)
        if (!strcmp(name, g_syms[i].name)) return g_syms[i].fn;
    return NULL;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(sym, ver, flags);
    if (st) *st = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / _SYMBOL_NOT_FOUND */
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
