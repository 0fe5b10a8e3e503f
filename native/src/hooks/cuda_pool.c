/* Stream-ordered allocations (cudaMallocAsync, PyTorch backend:cudaMallocAsync, CuPy's async pool),
 * accounted by what their pool really holds on the device.
 *
 * A pool keeps freed memory cached (PyTorch sets the release threshold to the maximum), so counting
 * request sizes and giving them back at cuMemFreeAsync would let two processes of a slice each
 * hold a full slice of cache. Instead each pool this process uses is charged its reservation,
 * CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
 *  - before an allocation the bytes its cache cannot cover (in use + size - charged) are reserved
 *    against the limit (cached memory is already counted; charging it twice would trim a warm cache
 *    for nothing);
 *  - when that is refused, this process's pools on the device are trimmed to what they have in use
 *    (cuMemPoolTrimTo) and reconciled, and the reservation is tried once more before the refusal;
 *  - after the allocation the charge is set to the reservation the driver reports; if the pool grew
 *    by more than was reserved (chunk rounding, fragmentation) past the limit, the allocation is
 *    undone (freed, stream synchronised, pool trimmed) and refused;
 *  - frees, cuMemPoolTrimTo and cuMemPoolSetAttribute reconcile the charge too, and any other
 *    allocation that would be refused first trims this process's pools (make_room, which the
 *    accounting reaches through the callback registered when the first pool is tracked).
 * cuMemAllocAsync allocates from the current pool of the stream's device (cuDeviceGetMemPool);
 * cuMemAllocFromPoolAsync charges the pool's device (from its creation properties, else found with
 * cuDeviceGetDefaultMemPool / cuDeviceGetMemPool / cuMemPoolGetAccess), not the current context's.
 * Pools in host memory are not the slice's business. One mutex serialises this process's pool
 * operations (taken before the region lock, never after). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpuslice/fork.h"
#include "gpuslice/capture.h"
#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"
#include "gpuslice/u64map.h"

#define ATTR_RELEASE_THRESHOLD 4
#define ATTR_RESERVED_MEM_CURRENT 5
#define ATTR_USED_MEM_CURRENT 7
#define ACCESS_READWRITE 3
#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)
#define MAX_POOLS 256

struct pool {
    CUmemoryPool h;
    int ord;        /* device the pool's memory lives on */
    int uncounted;  /* host-located pool */
    int destroyed;  /* cuMemPoolDestroy'd with allocations outstanding */
    uint64_t charged; /* bytes this pool holds in the region */
    uint64_t in_use;  /* bytes of its live allocations that we saw */
};

static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool g_pools[MAX_POOLS];
static int g_npools;
static struct gs_u64map g_ptrs; /* allocation -> a: size, b: pool handle */

/* The child has none of the parent's pools (CUDA state does not survive fork). */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_pool_lock = fresh;
    g_npools = 0;
    gs_u64map_clear(&g_ptrs);
}
GS_ON_FORK_CHILD(after_fork_child);

/* ------------------------------------------------------------------ the driver's view */
#define REAL_FN(type, name) ((type)gs_real(name))

/* The enforcer's own questions to the driver are asked in relaxed capture mode (gpuslice/capture.h): asked while
 * the calling thread captures a graph in global mode (torch.cuda.graph's default), a pool's attribute is a
 * prohibited call that fails (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates the user's capture (H100,
 * driver 580.159, 2026-12-06: bench/gpu/capture_pool_probe.py, tests/enforcer/test_gpu_enforcer.py). */
static int reserved_of(CUmemoryPool h, uint64_t *out)
{
    CUresult (*get)(CUmemoryPool, int, void *) = REAL_FN(CUresult(*)(CUmemoryPool, int, void *), "cuMemPoolGetAttribute");
    cuuint64_t v = 0;
    struct gs_capture_mode m = gs_capture_relax();
    CUresult r = get ? get(h, ATTR_RESERVED_MEM_CURRENT, &v) : CUDA_ERROR_NOT_FOUND;
    gs_capture_restore(&m);
    if (r != CUDA_SUCCESS) return -1;
    *out = v;
    return 0;
}

static void trim(struct pool *p)
{
    CUresult (*get)(CUmemoryPool, int, void *) = REAL_FN(CUresult(*)(CUmemoryPool, int, void *), "cuMemPoolGetAttribute");
    CUresult (*trim_to)(CUmemoryPool, size_t) = REAL_FN(CUresult(*)(CUmemoryPool, size_t), "cuMemPoolTrimTo");
    cuuint64_t used = p->in_use;
    struct gs_capture_mode m = gs_capture_relax(); /* see reserved_of */
    if (get) get(p->h, ATTR_USED_MEM_CURRENT, &used); /* the driver's count includes what we never saw */
    if (trim_to) trim_to(p->h, (size_t)used);
    gs_capture_restore(&m);
}

/* Device of a pool we did not see created: the device whose default or current pool it is, else the
 * one device with read-write access (the owner always has it), else the current one. */
static int device_of(CUmemoryPool h)
{
    CUresult (*count)(int *) = REAL_FN(CUresult(*)(int *), "cuDeviceGetCount");
    CUresult (*def)(CUmemoryPool *, CUdevice) = REAL_FN(CUresult(*)(CUmemoryPool *, CUdevice), "cuDeviceGetDefaultMemPool");
    CUresult (*cur)(CUmemoryPool *, CUdevice) = REAL_FN(CUresult(*)(CUmemoryPool *, CUdevice), "cuDeviceGetMemPool");
    CUresult (*access)(unsigned long long *, CUmemoryPool, CUmemLocation *) =
        REAL_FN(CUresult(*)(unsigned long long *, CUmemoryPool, CUmemLocation *), "cuMemPoolGetAccess");
    int n = 0, rw = -1, nrw = 0, found = -1;
    struct gs_capture_mode m = gs_capture_relax(); /* see reserved_of */
    if (!count || count(&n) != CUDA_SUCCESS) n = 0;
    for (int d = 0; d < n; d++) {
        CUmemoryPool q = NULL;
        if ((def && def(&q, d) == CUDA_SUCCESS && q == h) || (cur && cur(&q, d) == CUDA_SUCCESS && q == h)) {
            found = d;
            break;
        }
        unsigned long long flags = 0;
        CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, d};
        if (access && access(&flags, h, &loc) == CUDA_SUCCESS && flags == ACCESS_READWRITE) {
            rw = d;
            nrw++;
        }
    }
    gs_capture_restore(&m);
    if (found >= 0) return found;
    if (nrw == 1) return rw;
    int ord = gs_current_ordinal();
    GS_WARN("memory pool %p: owning device not found; charging device %d (the current context's)", (void *)h, ord);
    return ord;
}

/* ------------------------------------------------------------------ our books (g_pool_lock held) */
static struct pool *find(CUmemoryPool h)
{
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i].h == h) return &g_pools[i];
    return NULL;
}

static uint64_t make_room(int ordinal);

static struct pool *add(CUmemoryPool h, int ord, int uncounted)
{
    if (g_npools == MAX_POOLS) return NULL;
    /* From now on there may be cache to give back before the accounting refuses anything. (Before
     * the first pool there is none: the callback would find nothing to trim.) */
    gs_mem_set_make_room(make_room);
    struct pool *p = &g_pools[g_npools++];
    *p = (struct pool){h, ord, uncounted, 0, 0, 0};
    return p;
}

static void drop(struct pool *p)
{
    *p = g_pools[--g_npools];
}

static struct pool *get(CUmemoryPool h)
{
    struct pool *p = find(h);
    if (p) return p;
    int ord = device_of(h);
    return ord < 0 ? NULL : add(h, ord, 0);
}

/* Set the pool's charge to what the driver says it reserves. Growth is counted even past the limit
 * (the device holds it); the alloc path checks for that itself. */
static void reconcile(struct pool *p)
{
    uint64_t r;
    if (p->uncounted || p->destroyed || reserved_of(p->h, &r)) return;
    if (r < p->charged) gs_mem_release(p->ord, p->charged - r);
    else if (r > p->charged) gs_mem_charge(p->ord, r - p->charged);
    p->charged = r;
}

static uint64_t make_room_locked(int ordinal);

static uint64_t uncovered(const struct pool *p, uint64_t size)
{
    return p->in_use + size > p->charged ? p->in_use + size - p->charged : 0;
}

/* ------------------------------------------------------------------ allocation and free */
struct call {
    CUdeviceptr *dptr;
    size_t size;
    CUmemoryPool pool; /* NULL: cuMemAllocAsync */
    CUstream s;
    void *real;
    int ptsz;
};

static CUresult invoke(const struct call *c)
{
    if (c->pool)
        return ((CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))c->real)(c->dptr, c->size, c->pool, c->s);
    return ((CUresult(*)(CUdeviceptr *, size_t, CUstream))c->real)(c->dptr, c->size, c->s);
}

/* The pool grew past what the slice allows: forget the allocation, free it again, let the stream reach the free,
 * trim, and count what is left. The wait is made in relaxed capture mode (gpuslice/capture.h): another thread's
 * capture in global mode must not be invalidated by it. Never for an allocation a capture made the graph's. */
static void undo(struct pool *p, const struct call *c)
{
    CUresult (*fr)(CUdeviceptr, CUstream) = REAL_FN(CUresult(*)(CUdeviceptr, CUstream), c->ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
    CUresult (*sync)(CUstream) = REAL_FN(CUresult(*)(CUstream), c->ptsz ? "cuStreamSynchronize_ptsz" : "cuStreamSynchronize");
    if (!sync) sync = REAL_FN(CUresult(*)(CUstream), "cuStreamSynchronize");
    gs_u64map_take(&g_ptrs, *c->dptr, NULL);
    p->in_use -= c->size;
    if (fr) fr(*c->dptr, c->s);
    struct gs_capture_mode m = gs_capture_relax();
    if (sync) sync(c->s);
    gs_capture_restore(&m);
    trim(p);
    reconcile(p);
    *c->dptr = 0;
}

/* An allocation the pool made: tracked, and the pool's growth past what is charged reserved now, or the
 * allocation undone and refused. */
static CUresult settle_locked(const char *what, struct pool *p, const struct call *c)
{
    if (gs_u64map_put(&g_ptrs, *c->dptr, (struct gs_u64val){c->size, (uint64_t)(uintptr_t)p->h, 0}))
        GS_WARN("%s: out of host memory for the allocation table; the pool's charge stays until exit", what);
    p->in_use += c->size;
    uint64_t reserved;
    if (reserved_of(p->h, &reserved) || reserved <= p->charged) {
        reconcile(p);
        return CUDA_SUCCESS;
    }
    CUresult more = gs_mem_try_reserve(p->ord, reserved - p->charged, what);
    if (more == CUDA_SUCCESS || more == GS_PASS_UNCOUNTED) {
        if (more == CUDA_SUCCESS) p->charged = reserved;
        return CUDA_SUCCESS;
    }
    undo(p, c);
    return gs_mem_refused(p->ord, c->size, what);
}

static CUresult alloc_locked(const char *what, struct pool *p, const struct call *c)
{
    if (gs_mem_dev_index(p->ord) == -1) return gs_mem_try_reserve(p->ord, c->size, what); /* outside: refused */
    uint64_t need = uncovered(p, c->size);
    CUresult r = need ? gs_mem_try_reserve(p->ord, need, what) : CUDA_SUCCESS;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        make_room_locked(p->ord); /* this pool's cache and the others' on the device, once */
        need = uncovered(p, c->size);
        r = need ? gs_mem_try_reserve(p->ord, need, what) : CUDA_SUCCESS;
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return gs_mem_refused(p->ord, c->size, what);
    }
    if (r == GS_PASS_UNCOUNTED) return invoke(c);
    if (r != CUDA_SUCCESS) return r;
    p->charged += need;
    r = invoke(c);
    if (r != CUDA_SUCCESS) {
        reconcile(p); /* gives back what we reserved and the pool did not take */
        return r;
    }
    return settle_locked(what, p, c);
}

static CUstream capture_stream(const struct call *c)
{
    return !c->s && c->ptsz ? STREAM_PER_THREAD : c->s;
}

int gs_stream_device(CUstream s)
{
    CUresult (*get)(CUstream, CUdevice *) = REAL_FN(CUresult(*)(CUstream, CUdevice *), "cuStreamGetDevice");
    CUdevice d = -1;
    if (s && s != STREAM_LEGACY && s != STREAM_PER_THREAD && get) {
        struct gs_capture_mode m = gs_capture_relax(); /* see reserved_of: asked also while other threads capture */
        CUresult r = get(s, &d);
        gs_capture_restore(&m);
        if (r == CUDA_SUCCESS) return d;
    }
    return gs_current_ordinal();
}

/* The pool an allocation draws on (the call's, else the current pool of the stream's device) and the device it
 * charges (*ord; -1 for a call's pool until it is looked up). -1 when there is no pool to look at: *ord then says
 * the device, -1 without a context. */
/* The current pool of device `ord` (cuDeviceGetMemPool), NULL when there is none to look at. */
static CUmemoryPool current_pool(int ord)
{
    CUresult (*cur)(CUmemoryPool *, CUdevice) = REAL_FN(CUresult(*)(CUmemoryPool *, CUdevice), "cuDeviceGetMemPool");
    CUmemoryPool h = NULL;
    if (ord < 0 || !cur) return NULL;
    struct gs_capture_mode m = gs_capture_relax(); /* see reserved_of */
    if (cur(&h, ord) != CUDA_SUCCESS) h = NULL;
    gs_capture_restore(&m);
    return h;
}

static int pool_of_call(const struct call *c, CUmemoryPool *h, int *ord)
{
    *h = c->pool;
    *ord = -1;
    if (*h) return 0;
    *ord = gs_stream_device(c->s);
    *h = current_pool(*ord);
    return *h ? 0 : -1;
}

/* An allocation made already that no pool of ours records, counted by its size as pool_alloc counts one from an
 * untracked pool (past the limit if need be: the driver holds it) and given back at its free (GS_FREED). For a
 * graph's allocation that is an over-count until that free (its graph memory is counted once backed too). */
static CUresult by_size(int ord, const struct call *c)
{
    if (ord < 0) return CUDA_SUCCESS; /* no context: nothing the slice could be charged on */
    gs_mem_charge(ord, c->size);
    gs_track_add(GS_K_DPTR, *c->dptr, ord, c->size);
    return CUDA_SUCCESS;
}

/* The device an allocation is charged on, asking the driver nothing: a tracked pool's own (none, -1, for a host
 * pool), else the current one (for cuMemAllocAsync on a stream of another device's context that is the wrong
 * device: the stream's is not asked while it captures). */
static int charged_device(const struct call *c)
{
    if (c->pool) {
        pthread_mutex_lock(&g_pool_lock);
        struct pool *p = find(c->pool);
        int ord = !p ? -2 : p->uncounted ? -1 : p->ord; /* a host pool's memory is not the slice's: -1, nothing */
        pthread_mutex_unlock(&g_pool_lock);
        if (ord != -2) return ord;
    }
    return gs_current_ordinal();
}

/* The capture ended around a captured allocation (another thread may end it; no pool was looked at before): had it
 * ended before the call, the driver made the allocation the pool's. It is settled as any pool allocation: tracked,
 * and the pool's growth past its charge reserved (or undone and refused past the limit). Had it ended after the call
 * the allocation is the graph's; tracked all the same, it only keeps a destroyed pool's charge until it is freed (the
 * safe side: not tracked, a pool allocation's pool could be destroyed and its charge given back while it lives). */
static CUresult ended_alloc(const char *what, struct call *c)
{
    CUmemoryPool h;
    int ord;
    GS_DEBUG("%s of %zu bytes into a capture that ended around it: counted as the pool's", what, c->size);
    if (pool_of_call(c, &h, &ord)) return by_size(ord, c); /* no pool to look at */
    pthread_mutex_lock(&g_pool_lock);
    struct pool *p = find(h);
    if (!p) p = ord >= 0 ? add(h, ord, 0) : get(h);
    if (!p) { /* past the pools we track */
        pthread_mutex_unlock(&g_pool_lock);
        return by_size(ord >= 0 ? ord : gs_current_ordinal(), c);
    }
    CUresult r = p->uncounted ? CUDA_SUCCESS : settle_locked(what, p, c);
    pthread_mutex_unlock(&g_pool_lock);
    return r;
}

/* Into a graph being captured (into_capture): the graph owns the allocation, the pool does not grow, nothing is
 * reserved for it or tracked, and it is never undone (a free and a wait on a capturing stream would join or
 * invalidate the user's graph). The enforcer asks the driver nothing but the allocation and the stream's capture
 * status: the H100's capture test failed while it also asked for the stream's device, the current pool and (in
 * relaxed mode) the pool's size around the allocation (2026-12-06), and passed on the H200 when it asked nothing
 * else (7b50452, 2026-11-30). What the pools and the graph memory did meanwhile is counted once the capture ended
 * (gs_pool_capture_ended, from cuStreamEndCapture's hook) or at the pool's next event. The same capture still
 * running (its id unchanged), invalidated or of unknown status after the call: the graph's. One that ended around
 * it: ended_alloc. One that gave way to another capture of the stream: by_size. */
static CUresult captured_alloc(const char *what, struct call *c, uint64_t id)
{
    CUresult r = invoke(c);
    uint64_t now = 0;
    int st = gs_capture_info(capture_stream(c), &now);
    if (r != CUDA_SUCCESS) { /* the H100's capture test failed here, its capture invalidated before (2026-12-06) */
        GS_DEBUG("%s of %zu bytes into a capture: the driver answered %d; its stream's capture status is now %d", what,
                 c->size, (int)r, st);
        return r;
    }
    if (st == 0) return ended_alloc(what, c);
    if (st == 1 && now != id) {
        /* Another capture of the stream since (another thread ended one and began one around the call): the
         * allocation is the new graph's, or the pool's if it fell between the two. Counted by its size, asking
         * nothing (the stream captures again) and undoing nothing there: over-counted while it lives if the graph's
         * (its graph memory is counted too once backed), never missed if the pool's. */
        GS_DEBUG("%s of %zu bytes: its stream's capture changed around it; counted by its size", what, c->size);
        return by_size(charged_device(c), c);
    }
    return CUDA_SUCCESS;
}

/* Whether the allocation goes into a graph being captured on its stream (capture status ACTIVE). Such an
 * allocation is a node of the graph, owned by it and not by the pool: the driver backs it from the device's graph
 * memory pool when the graph is uploaded or launched, which cuda_graph.c charges. Counted as the pool's, it
 * inflated the pool's use until freed and, near the limit, trimmed the program's pools and refused inside the
 * capture (H200, 2026-11-30). An error (the legacy stream while a blocking stream captures) or an invalidated
 * capture is no capture here: the allocation is counted as the pool's, or the driver refuses it. */
static int into_capture(const struct call *c, const char *what, uint64_t *id)
{
    int st = gs_capture_info(capture_stream(c), id);
    if (st != 0 && st != 1)
        GS_DEBUG("%s of %zu bytes: its stream's capture status is %d; counted as the pool's", what, c->size, st);
    return st == 1; /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
}

static CUresult pool_alloc(const char *what, struct call *c)
{
    uint64_t id;
    if (into_capture(c, what, &id)) return captured_alloc(what, c, id);
    CUmemoryPool h;
    int ord;
    if (pool_of_call(c, &h, &ord)) {
        if (ord < 0) return invoke(c); /* no context: the driver refuses it */
        /* No pool to look at (a driver without pools would not serve this either): count by size. */
        GS_ACCOUNTED(what, ord, c->size, GS_K_DPTR, *c->dptr, invoke(c));
    }
    pthread_mutex_lock(&g_pool_lock);
    struct pool *p = find(h);
    if (!p) p = ord >= 0 ? add(h, ord, 0) : get(h);
    if (!p) {
        pthread_mutex_unlock(&g_pool_lock);
        GS_WARN("%s: more than %d memory pools; counting this allocation by its size", what, MAX_POOLS);
        int o = ord >= 0 ? ord : gs_current_ordinal();
        if (o < 0) return invoke(c);
        GS_ACCOUNTED(what, o, c->size, GS_K_DPTR, *c->dptr, invoke(c));
    }
    CUresult r = p->uncounted ? invoke(c) : alloc_locked(what, p, c);
    pthread_mutex_unlock(&g_pool_lock);
    return r;
}

/* Free a pool allocation with `fn`; GS_POOL_NOT_MINE when ptr is not one. A free captured into a graph (`capture`:
 * the stream to ask, NULL for a synchronous free) is a node of it: the pool is not read inside the capture (see
 * captured_alloc); its charge follows at the capture's end. */
static CUresult pool_free(CUdeviceptr ptr, CUresult (*fn)(void *real, CUdeviceptr, CUstream), void *real, CUstream s,
                          CUstream capture)
{
    pthread_mutex_lock(&g_pool_lock);
    struct gs_u64val v;
    if (!gs_u64map_take(&g_ptrs, ptr, &v)) {
        pthread_mutex_unlock(&g_pool_lock);
        return GS_POOL_NOT_MINE;
    }
    CUresult r = fn(real, ptr, s);
    struct pool *p = find((CUmemoryPool)(uintptr_t)v.b);
    if (r != CUDA_SUCCESS) {
        gs_u64map_put(&g_ptrs, ptr, v);
    } else if (p) {
        p->in_use = p->in_use >= v.a ? p->in_use - v.a : 0;
        if (p->destroyed && p->in_use == 0) {
            gs_mem_release(p->ord, p->charged); /* the driver lets a destroyed pool go with its last allocation */
            drop(p);
        } else if (!capture || gs_capture_status(capture) != 1) {
            reconcile(p);
        }
    }
    pthread_mutex_unlock(&g_pool_lock);
    return r;
}

static CUresult call_free_async(void *real, CUdeviceptr p, CUstream s)
{
    return ((CUresult(*)(CUdeviceptr, CUstream))real)(p, s);
}

static CUresult call_free_sync(void *real, CUdeviceptr p, CUstream s)
{
    (void)s;
    return ((CUresult(*)(CUdeviceptr))real)(p);
}

CUresult gs_pool_free_sync(CUdeviceptr ptr, void *real)
{
    return pool_free(ptr, call_free_sync, real, NULL, NULL);
}

/* ------------------------------------------------------------------ making room */
/* Trim this process's pools on ordinal down to what they have in use; returns the bytes that left
 * the books. (g_pool_lock held.) */
static uint64_t make_room_locked(int ordinal)
{
    uint64_t before = 0, after = 0;
    for (int i = 0; i < g_npools; i++) {
        struct pool *p = &g_pools[i];
        if (p->ord != ordinal || p->uncounted || p->destroyed) continue;
        before += p->charged;
        reconcile(p); /* a pool with a low release threshold may have shrunk at a synchronisation */
        if (p->charged > p->in_use) {
            trim(p);
            reconcile(p);
        }
        after += p->charged;
    }
    return before > after ? before - after : 0;
}

/* The accounting's make-room callback (gs_mem_set_make_room): called without g_pool_lock. */
static uint64_t make_room(int ordinal)
{
    pthread_mutex_lock(&g_pool_lock);
    uint64_t freed = make_room_locked(ordinal);
    pthread_mutex_unlock(&g_pool_lock);
    return freed;
}

struct gone {
    CUmemoryPool h[MAX_POOLS];
    int n;
};

static int of_gone_pool(uint64_t key, struct gs_u64val *v, void *arg)
{
    (void)key;
    const struct gone *g = arg;
    for (int i = 0; i < g->n; i++)
        if ((uint64_t)(uintptr_t)g->h[i] == v->b) return 1;
    return 0;
}

void gs_pool_forget_device(int ordinal)
{
    static struct gone g; /* under g_pool_lock */
    pthread_mutex_lock(&g_pool_lock);
    g.n = 0;
    for (int i = g_npools - 1; i >= 0; i--) {
        struct pool *p = &g_pools[i];
        if (p->ord != ordinal) continue;
        if (!p->uncounted && p->charged) gs_mem_release(ordinal, p->charged);
        g.h[g.n++] = p->h;
        drop(p);
    }
    /* Their allocations died too: a pointer the driver hands out again must not look like one. */
    if (g.n) gs_u64map_filter(&g_ptrs, of_gone_pool, &g);
    pthread_mutex_unlock(&g_pool_lock);
}

/* A capture on a stream of `ordinal` ended (cuda_graph.c's hook on cuStreamEndCapture): what the pools did while no
 * pool was read (their growth across captured allocations, the driver's own doing) is counted now, the current pool
 * of the stream's device included (a captured cudaMallocAsync may be the first use of it: nothing looked it up). */
void gs_pool_capture_ended(int ordinal)
{
    CUmemoryPool h = current_pool(ordinal);
    pthread_mutex_lock(&g_pool_lock);
    if (h && !find(h)) add(h, ordinal, 0);
    for (int i = 0; i < g_npools; i++) reconcile(&g_pools[i]);
    pthread_mutex_unlock(&g_pool_lock);
}

/* ------------------------------------------------------------------ hooks */
/* The stream-ordered allocation and free entry points, each next to its per-thread-stream twin:
 *   X(name, generator, _ptsz) */
#define STREAM_HOOKS(X)                                                                       \
    X(cuMemAllocAsync, ASYNC_ALLOC, 0)                                                        \
    X(cuMemAllocAsync_ptsz, ASYNC_ALLOC, 1)                                                   \
    X(cuMemAllocFromPoolAsync, POOL_ALLOC, 0)                                                 \
    X(cuMemAllocFromPoolAsync_ptsz, POOL_ALLOC, 1)                                            \
    X(cuMemFreeAsync, ASYNC_FREE, 0)                                                          \
    X(cuMemFreeAsync_ptsz, ASYNC_FREE, 1)

#define ASYNC_ALLOC(name, is_ptsz)                                                            \
    GS_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream s)                      \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, bytes, s));                                                    \
        struct call c = {dptr, bytes, NULL, s, (void *)real, is_ptsz};                        \
        return pool_alloc("cuMemAllocAsync", &c);                                             \
    }

#define POOL_ALLOC(name, is_ptsz)                                                             \
    GS_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)   \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, bytes, pool, s));                                              \
        if (!pool) return real(dptr, bytes, pool, s); /* the driver's error */                \
        struct call c = {dptr, bytes, pool, s, (void *)real, is_ptsz};                        \
        return pool_alloc("cuMemAllocFromPoolAsync", &c);                                     \
    }

/* (A free does not care which stream flavour it is: the stream is handed through as given.) */
#define ASYNC_FREE(name, is_ptsz)                                                             \
    GS_EXPORT CUresult name(CUdeviceptr dptr, CUstream s)                                     \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, s));                                                           \
        CUresult r_ = pool_free(dptr, call_free_async, (void *)real, s,                       \
                                !s && is_ptsz ? STREAM_PER_THREAD : s ? s : STREAM_LEGACY);   \
        if (r_ != GS_POOL_NOT_MINE) return r_;                                                \
        GS_FREED(GS_K_DPTR, dptr, real(dptr, s)); /* cuMemAlloc'd memory freed async */       \
    }

#define STREAM_HOOK(name, generator, is_ptsz) generator(name, is_ptsz)
STREAM_HOOKS(STREAM_HOOK)

/* The first fields of CUmemPoolProps (the rest is opaque to us). */
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
} gs_pool_props_head;

GS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props)
{
    __typeof__(&cuMemPoolCreate) real = GS_REAL(cuMemPoolCreate);
    GS_PROLOGUE(real(pool, props));
    CUresult r = real(pool, props);
    if (r != CUDA_SUCCESS || !pool || !props) return r;
    const gs_pool_props_head *pp = props;
    int on_device = pp->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    pthread_mutex_lock(&g_pool_lock);
    struct pool *old = find(*pool);
    if (old) { /* the driver reuses a handle only once the pool it named is gone */
        if (!old->uncounted && old->charged) gs_mem_release(old->ord, old->charged);
        drop(old);
    }
    if (!add(*pool, on_device ? pp->location.id : -1, !on_device))
        GS_WARN("cuMemPoolCreate: more than %d memory pools; the new one is looked up on use", MAX_POOLS);
    pthread_mutex_unlock(&g_pool_lock);
    return r;
}

GS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    __typeof__(&cuMemPoolDestroy) real = GS_REAL(cuMemPoolDestroy);
    GS_PROLOGUE(real(pool));
    pthread_mutex_lock(&g_pool_lock);
    CUresult r = real(pool);
    struct pool *p = r == CUDA_SUCCESS ? find(pool) : NULL;
    if (p && p->in_use) {
        p->destroyed = 1; /* its memory goes with the last outstanding allocation */
    } else if (p) {
        if (!p->uncounted && p->charged) gs_mem_release(p->ord, p->charged);
        drop(p);
    }
    pthread_mutex_unlock(&g_pool_lock);
    return r;
}

/* Calls that may change what a pool reserves: the charge follows the driver's answer.
 *   X(name, parameters, arguments) */
#define RECONCILING_HOOKS(X)                                                                  \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep), (pool, keep))                        \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value), (pool, attr, value))

#define RECONCILING_HOOK(name, params, args)                                                  \
    GS_EXPORT CUresult name params                                                            \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real args);                                                               \
        pthread_mutex_lock(&g_pool_lock);                                                     \
        CUresult r = real args;                                                               \
        struct pool *p = find(pool);                                                          \
        if (r == CUDA_SUCCESS && p) reconcile(p);                                             \
        pthread_mutex_unlock(&g_pool_lock);                                                   \
        return r;                                                                             \
    }
RECONCILING_HOOKS(RECONCILING_HOOK)

const struct gs_hook gs_hooks_pool[] = {
    STREAM_HOOKS(GS_HOOK_ROW)
    GS_HOOK_ENTRY(cuMemPoolCreate)
    GS_HOOK_ENTRY(cuMemPoolDestroy)
    RECONCILING_HOOKS(GS_HOOK_ROW)
    {0, 0},
};
