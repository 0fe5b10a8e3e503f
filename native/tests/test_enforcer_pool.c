/* Stream-ordered pools over the CPU double, whose pools reserve device memory in chunks
 * (GSDOUBLE_POOL_CHUNK) and keep freed blocks cached up to their release threshold, as CUDA's do.
 * The slice is charged what a pool reserves, not what was requested: memory a pool keeps cached
 * after a free is still on the device, so two processes of a slice caching at once must not exceed
 * the limit. Also run with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <stdint.h>

CUresult cuThreadExchangeStreamCaptureMode(int *);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
extern unsigned long gsdouble_capture_violations;
extern __thread unsigned long gsdouble_capture_calls; /* this thread's (the double's comment) */

static const uint64_t KEEP_ALL = UINT64_MAX; /* PyTorch's cudaMallocAsync sets the threshold to this */

static CUmemoryPool default_pool(int dev)
{
    CUmemoryPool p = NULL;
    CHECK_EQ(cuDeviceGetDefaultMemPool(&p, dev), CUDA_SUCCESS);
    return p;
}

static uint64_t reserved(CUmemoryPool p)
{
    uint64_t v = 0;
    CHECK_EQ(cuMemPoolGetAttribute(p, POOL_ATTR_RESERVED_MEM_CURRENT, &v), CUDA_SUCCESS);
    return v;
}

static void keep_cache(CUmemoryPool p)
{
    uint64_t t = KEEP_ALL;
    CHECK_EQ(cuMemPoolSetAttribute(p, POOL_ATTR_RELEASE_THRESHOLD, &t), CUDA_SUCCESS);
}

/* What a pool caches stays counted; the same process reuses its cache without new charges. */
static void s_cached_memory_stays_counted(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    keep_cache(pool);
    CUdeviceptr a, b;
    CHECK_EQ(cuMemAllocAsync(&a, 300 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(reserved(pool), 320 * MiB); /* 32 MiB chunks */
    CHECK_EQ(t_used(0), CTX + 320 * MiB); /* the reservation, not the request */
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(gsdouble_used(0), 320 * MiB); /* still on the device, cached */
    CHECK_EQ(t_used(0), CTX + 320 * MiB);
    CHECK_EQ(cuMemAllocAsync(&b, 200 * MiB, NULL), CUDA_SUCCESS); /* served from the cache */
    CHECK_EQ(t_used(0), CTX + 320 * MiB);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(f, 512 * MiB - 320 * MiB);
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS); /* an explicit trim gives it back */
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
}

/* Two processes of one slice, each with a pool that keeps its cache (cudaMallocAsync-style). The
 * first holds 600 MiB of cache it no longer uses; the second may not take another 600 MiB of a
 * 1 GiB slice -- the device really holds the first's cache. */
static void s_two_processes_cached_pools(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", 2 * CTX + 1024 * MiB, CTX);
    int ready[2], done[2];
    if (pipe(ready) || pipe(done)) exit(2);
    fflush(NULL);
    pid_t first = fork();
    if (first == 0) {
        up(0);
        CUmemoryPool pool = default_pool(0);
        keep_cache(pool);
        CUdeviceptr a;
        int ok = cuMemAllocAsync(&a, 600 * MiB, NULL) == CUDA_SUCCESS && cuMemFreeAsync(a, NULL) == CUDA_SUCCESS &&
                 cuStreamSynchronize(NULL) == CUDA_SUCCESS;
        if (write(ready[1], &ok, sizeof ok) != sizeof ok) _exit(3);
        char ch;
        if (read(done[0], &ch, 1) != 1) _exit(3); /* keep the cache until the parent has looked */
        _exit(0);
    }
    int ok = 0;
    CHECK(read(ready[0], &ok, sizeof ok) == sizeof ok && ok, "first process allocated and freed");
    CHECK_EQ(t_used(0), CTX + 608 * MiB); /* its cache: 19 chunks */
    up(0);
    CUmemoryPool pool = default_pool(0);
    keep_cache(pool);
    CUdeviceptr b;
    CHECK_EQ(cuMemAllocAsync(&b, 600 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(cuMemAllocAsync(&b, 400 * MiB, NULL), CUDA_SUCCESS); /* what is left: 1024 - 608 = 416 */
    CHECK(t_used(0) <= 2 * CTX + 1024 * MiB, "accounted %llu over the limit", t_used(0));
    CHECK(gsdouble_used(0) <= 1024 * MiB, "device holds %llu over the slice", gsdouble_used(0));
    CHECK_EQ(gsdouble_used(0), 0 + 416 * MiB); /* the double is per process: this one's pool */
    if (write(done[1], "x", 1) != 1) exit(2);
    waitpid(first, NULL, 0);
}

/* A refusal first trims this process's pool caches on the device and retries once: here the default
 * pool's cache makes room for an explicit pool. */
static void s_refusal_trims_cache_then_retries(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool def = default_pool(0);
    keep_cache(def);
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemoryPool pool;
    CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    keep_cache(pool);
    CUdeviceptr a, b, c;
    CHECK_EQ(cuMemAllocAsync(&a, 256 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocAsync(&b, 64 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS); /* 256 MiB cached, 64 in use */
    CHECK_EQ(t_used(0), CTX + 320 * MiB);
    /* 384 MiB do not fit next to 320 counted; trimming the default pool's cache makes room */
    CHECK_EQ(cuMemAllocFromPoolAsync(&c, 384 * MiB, pool, NULL), CUDA_SUCCESS);
    CHECK_EQ(reserved(def), 64 * MiB);
    CHECK_EQ(t_used(0), CTX + 448 * MiB);
    CHECK_EQ(gsdouble_used(0), 448 * MiB);
    /* nothing cached left to trim: refused, and counted as one refusal */
    CUdeviceptr d;
    CHECK_EQ(cuMemAllocFromPoolAsync(&d, 128 * MiB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    struct gs_region *r = t_map_region();
    CHECK(r && r->devices[0].oom_refusals == 1, "one refusal recorded");
    if (r) munmap(r, sizeof *r);
    CHECK_EQ(t_used(0), CTX + 448 * MiB);
}

/* Another allocator's refusal gives this process's pool caches back first (cudaFree-style
 * allocations next to a cudaMallocAsync pool). */
static void s_other_allocations_trim_pool_cache(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    keep_cache(pool);
    CUdeviceptr a, b;
    CHECK_EQ(cuMemAllocAsync(&a, 400 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 416 * MiB);
    CHECK_EQ(cuMemAlloc_v2(&b, 400 * MiB), CUDA_SUCCESS);
    CHECK_EQ(reserved(pool), 0);
    CHECK_EQ(t_used(0), CTX + 400 * MiB);
    CHECK_EQ(gsdouble_used(0), 400 * MiB);
}

/* Chunk rounding can make a pool grow past what was reserved: the allocation is undone (freed, the
 * stream synchronised, the pool trimmed) and refused, so the slice never holds more than its limit. */
static void s_pool_growth_past_limit_undone(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 100 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    CUdeviceptr a, b;
    CHECK_EQ(cuMemAllocAsync(&a, 97 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* fits, but its 4 chunks do not */
    CHECK_EQ(reserved(pool), 0);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
    struct gs_region *r = t_map_region();
    CHECK(r && r->devices[0].peak <= CTX + 100 * MiB, "peak %llu over the limit", r ? (unsigned long long)r->devices[0].peak : 0ull);
    if (r) munmap(r, sizeof *r);
    CHECK_EQ(cuMemAllocAsync(&a, 90 * MiB, NULL), CUDA_SUCCESS); /* 3 chunks = 96 MiB fit */
    CHECK_EQ(t_used(0), CTX + 96 * MiB);
    CHECK_EQ(cuMemAllocAsync(&b, 20 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* a 4th chunk does not */
    CHECK_EQ(reserved(pool), 96 * MiB);
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX); /* default threshold 0: released */
    CHECK_EQ(gsdouble_used(0), 0);
}

/* An asynchronous allocation into a stream being captured is a node of the graph, owned by it, not by the pool
 * (the driver backs it from its graph memory pool when the graph is uploaded or launched, which the graph books
 * charge). It is neither counted nor refused by the pool's books, and does not inflate them for later
 * allocations; one on another stream meanwhile is counted as ever. */
extern void *gsdouble_capture_stream;
extern unsigned long gsdouble_graph_allocs;
static void s_captured_async_alloc_is_the_graphs(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    CUdeviceptr a, g1, g2, b;
    CUstream cap = (CUstream)0x5150;
    CHECK_EQ(cuMemAllocAsync(&a, 300 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 320 * MiB);
    unsigned long n0 = gsdouble_graph_allocs, v0 = gsdouble_capture_violations, r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = cap;
    CHECK_EQ(cuMemAllocAsync(&g1, 400 * MiB, cap), CUDA_SUCCESS); /* past what the slice has left: the graph's */
    CHECK_EQ(cuMemAllocFromPoolAsync(&g2, 100 * MiB, pool, cap), CUDA_SUCCESS);
    CHECK(gsdouble_graph_allocs == n0 + 2, "both became graph allocations (%lu)", gsdouble_graph_allocs - n0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    /* the double's graph addresses are a reserved range: no mapping of the process (a pool's host memory) can
     * land there and have its free taken for a graph's (a fixed range did, as ASLR willed: s_every_path) */
    void *m = mmap((void *)(uintptr_t)g1, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(m == MAP_FAILED && errno == EEXIST, "the graph address %#llx is not reserved (mmap gave %p)",
          (unsigned long long)g1, m);
    if (m != MAP_FAILED) munmap(m, 4096);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
    CHECK_EQ(t_used(0), CTX + 320 * MiB);
    int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED: the test's own question, asked as the enforcer asks its own */
    CHECK_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CHECK_EQ(reserved(pool), 320 * MiB); /* the pool was not trimmed to make room */
    CHECK_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocAsync(&b, 150 * MiB, NULL), CUDA_SUCCESS); /* another stream: counted */
    CHECK_EQ(t_used(0), CTX + 480 * MiB);
    CHECK_EQ(cuMemFreeAsync(g2, cap), CUDA_SUCCESS);
    gsdouble_capture_stream = (void *)-1;
    CHECK_EQ(cuMemFreeAsync(g1, NULL), CUDA_SUCCESS); /* a graph's allocation freed after the capture */
    CHECK_EQ(t_used(0), CTX + 480 * MiB);
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* The capture ends between the enforcer's question and the allocation (another thread's cuStreamEndCapture): the
 * driver makes it the pool's, and the pool's growth is counted, or undone and refused past the limit, as any. */
extern int gsdouble_capture_ends_after_query;
static void s_capture_ending_meanwhile_is_counted(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    CUstream cap = (CUstream)0x5150;
    CUdeviceptr a = 0, b = 0;
    gsdouble_capture_stream = cap;
    gsdouble_capture_ends_after_query = 1;
    CHECK_EQ(cuMemAllocAsync(&a, 2048 * MiB, cap), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(gsdouble_capture_stream == (void *)-1, "the capture ended meanwhile");
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0); /* undone */
    gsdouble_capture_stream = cap;
    gsdouble_capture_ends_after_query = 1;
    CHECK_EQ(cuMemAllocAsync(&b, 100 * MiB, cap), CUDA_SUCCESS);
    CHECK_EQ(reserved(pool), 128 * MiB);
    CHECK_EQ(t_used(0), CTX + 128 * MiB); /* counted as the pool's */
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocAsync(&b, 1 * MiB, NULL), CUDA_SUCCESS); /* the next pool event brings the books in line */
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* Undoing an allocation past the limit waits for the stream; while another thread captures in global mode, that
 * wait is made in relaxed mode, so the capture is not invalidated by it. */
static void s_undo_during_a_capture_elsewhere(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 100 * MiB, CTX);
    up(0);
    CUdeviceptr a;
    unsigned long v0 = gsdouble_capture_violations;
    gsdouble_capture_stream = (CUstream)0x5150;
    CHECK_EQ(cuMemAllocAsync(&a, 97 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* fits, its 4 chunks do not: undone */
    gsdouble_capture_stream = (void *)-1;
    CHECK_EQ(gsdouble_used(0), 0);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
}

/* A graph's allocation is the graph's even when the pool's reserve is already ahead of the books (memory the
 * enforcer did not see, a pass-through): it is never undone on the capturing stream (a free and a wait there would
 * join or invalidate the user's graph) nor refused. */
CUresult gsdouble_alloc_async_unseen(CUdeviceptr *p, size_t b);
/* The default pool of device 0, keeping its cache, holding 320 MiB the enforcer never saw (*u: 300 MiB of it). */
static CUmemoryPool pool_ahead_of_the_books(CUdeviceptr *u)
{
    CUmemoryPool pool = default_pool(0);
    keep_cache(pool);
    CHECK_EQ(gsdouble_alloc_async_unseen(u, 300 * MiB), CUDA_SUCCESS); /* past the enforcer */
    CHECK_EQ(reserved(pool), 320 * MiB);
    return pool;
}

static void s_captured_alloc_beside_an_unseen_pool_growth(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 256 * MiB, CTX);
    up(0);
    CUdeviceptr u = 0, g = 0;
    pool_ahead_of_the_books(&u);
    unsigned long n0 = gsdouble_graph_allocs, v0 = gsdouble_capture_violations, r0 = gsdouble_capture_calls;
    CUstream cap = (CUstream)0x5150;
    gsdouble_capture_stream = cap;
    CHECK_EQ(cuMemAllocAsync(&g, 1 * MiB, cap), CUDA_SUCCESS);
    CHECK(g != 0 && gsdouble_graph_allocs == n0 + 1 && gsdouble_capture_stream == cap, "the graph's, kept (%llx)",
          (unsigned long long)g);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    gsdouble_capture_stream = (void *)-1;
}

/* A pool that grew across a captured allocation while the capture still runs (the driver's own doing): nothing is
 * read, undone or refused inside the capture (a read there is what the H100's capture test failed with; a free and a
 * wait there would join or invalidate the user's graph); the capture's end counts the growth, past the limit if need
 * be. */
extern unsigned long long gsdouble_capture_grows_pool;
static void s_pool_growth_during_a_capture_is_counted_at_its_end(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 256 * MiB, CTX);
    up(0);
    CUmemoryPool pool = default_pool(0);
    CUdeviceptr g = 0;
    unsigned long n0 = gsdouble_graph_allocs, v0 = gsdouble_capture_violations, r0 = gsdouble_capture_calls;
    CUstream cap = (CUstream)0x5150;
    gsdouble_capture_stream = cap;
    gsdouble_capture_grows_pool = 320 * MiB;
    CHECK_EQ(cuMemAllocAsync(&g, 1 * MiB, cap), CUDA_SUCCESS);
    CHECK(g != 0 && gsdouble_graph_allocs == n0 + 1 && gsdouble_capture_stream == cap, "the graph's, kept (%llx)",
          (unsigned long long)g);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX); /* not yet known */
    CUgraph graph = NULL;
    CHECK_EQ(cuStreamEndCapture(cap, &graph), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "the catch-up asks only once the capture ended (%lu)", gsdouble_capture_calls - r0);
    CHECK(gsdouble_capture_stream == (void *)-1, "the capture ended");
    CHECK_EQ(t_used(0), CTX + 320 * MiB); /* what the device holds, past the limit */
    CHECK_EQ(gsdouble_used(0), 320 * MiB);
    CHECK_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* A capture invalidated right after a captured allocation (another thread's prohibited call) leaves it the graph's,
 * even beside pool growth the enforcer never saw: it is not settled as the pool's (which would track it forever, or
 * free it and wait on the capturing stream). The invalidated capture's end (an error, but the stream no longer
 * captures) brings the books in line. */
extern int gsdouble_capture_invalidated_by_alloc;
static void s_invalidated_capture_is_caught_up_at_its_end(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUdeviceptr u = 0, g = 0;
    CUmemoryPool pool = pool_ahead_of_the_books(&u);
    CUstream cap = (CUstream)0x5150;
    unsigned long n0 = gsdouble_graph_allocs, r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = cap;
    gsdouble_capture_invalidated_by_alloc = 1;
    CHECK_EQ(cuMemAllocAsync(&g, 1 * MiB, cap), CUDA_SUCCESS);
    CHECK(gsdouble_graph_allocs == n0 + 1, "the graph's (%lu)", gsdouble_graph_allocs - n0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX); /* neither settled as the pool's nor the unseen growth known yet */
    CHECK_EQ(cuStreamEndCapture(cap, NULL), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(gsdouble_capture_calls == r0, "the catch-up asks only once the capture ended (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX + 320 * MiB); /* the pool's reservation, counted at the end */
    CHECK_EQ(cuMemFreeAsync(u, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* A pool allocation freed inside a capture (a free node of the graph) asks the driver nothing there either; the
 * capture's end on the per-thread stream (cuStreamEndCapture_ptsz) reconciles the pool. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
static void s_free_inside_a_capture_asks_nothing(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    keep_cache(default_pool(0));
    CUdeviceptr a = 0, g = 0;
    CHECK_EQ(cuMemAllocAsync(&a, 100 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 128 * MiB);
    unsigned long r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = (CUstream)0x2; /* the per-thread default stream captures */
    gsdouble_capture_grows_pool = 64 * MiB;
    CHECK_EQ(cuMemAllocAsync_ptsz(&g, 1 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync_ptsz(a, NULL), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(cuStreamEndCapture_ptsz(NULL, NULL), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "the catch-up asks only once the capture ended (%lu)", gsdouble_capture_calls - r0);
    CHECK(gsdouble_capture_stream == (void *)-1, "the capture ended");
    CHECK_EQ(t_used(0), CTX + 128 * MiB + 64 * MiB); /* the growth during the capture, counted at its end (the freed
                                                       * 100 MiB stay cached) */
}

/* Another thread ends the capture and begins a new one on the same stream around the allocation, which the driver
 * then makes the pool's: the capture's id changed, so the allocation is counted, by its size, at once (the status
 * alone, active before and after, would have taken it for the graph's and left real pool memory uncounted), with
 * nothing asked or undone on the stream that captures again. */
extern int gsdouble_capture_restarts_after_query;
static void s_capture_restarted_around_an_allocation_is_counted(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUdeviceptr b = 0;
    CUstream cap = (CUstream)0x5150;
    unsigned long n0 = gsdouble_graph_allocs, r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = cap;
    gsdouble_capture_restarts_after_query = 1;
    CHECK_EQ(cuMemAllocAsync(&b, 100 * MiB, cap), CUDA_SUCCESS);
    CHECK(gsdouble_capture_stream == cap && gsdouble_graph_allocs == n0, "the pool's, between two captures (%lu)",
          gsdouble_graph_allocs - n0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the new capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX + 100 * MiB); /* counted at once, by its size */
    CHECK_EQ(cuStreamEndCapture(cap, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 100 * MiB + 128 * MiB); /* and the pool's growth once the capture ended: over, never under */
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemPoolTrimTo(default_pool(0), 0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* The same race, the allocation captured into the new graph: counted by its size, past the limit if need be (an
 * over-count while it lives), and nothing asked, undone or waited for on the stream that captures (an undo's free
 * and wait there would join or invalidate the new graph). Its free gives the count back. */
static void s_allocation_into_a_restarted_capture_is_never_undone(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 64 * MiB, CTX);
    up(0);
    CUdeviceptr b = 0;
    CUstream cap = (CUstream)0x5150;
    unsigned long n0 = gsdouble_graph_allocs, v0 = gsdouble_capture_violations, r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = cap;
    gsdouble_capture_restarts_after_query = 2;
    CHECK_EQ(cuMemAllocAsync(&b, 100 * MiB, cap), CUDA_SUCCESS);
    CHECK(gsdouble_graph_allocs == n0 + 1, "the new graph's (%lu)", gsdouble_graph_allocs - n0);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the new capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX + 100 * MiB); /* over the limit, counted: over, never under */
    CHECK_EQ(cuMemFreeAsync(b, cap), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(cuStreamEndCapture(cap, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX); /* the catch-up finds the pool as it was: nothing */
}

/* A device-0 pool created after the 256 the enforcer tracks (none of them used). */
static CUmemoryPool pool_past_the_tracked(void)
{
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemoryPool pool = NULL;
    for (int i = 0; i < 257; i++) CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    return pool;
}

/* A capture that ends around an allocation from a pool past the 256 the enforcer tracks: the pool's allocation is
 * counted by its size (no pool of ours records it) and given back at its free. */
static void s_race_on_an_untracked_pool_is_counted_by_size(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool untracked = pool_past_the_tracked();
    CUdeviceptr b = 0;
    gsdouble_capture_stream = (CUstream)0x5150;
    gsdouble_capture_ends_after_query = 1;
    CHECK_EQ(cuMemAllocFromPoolAsync(&b, 100 * MiB, untracked, (CUstream)0x5150), CUDA_SUCCESS);
    CHECK(gsdouble_capture_stream == (void *)-1, "the capture ended meanwhile");
    CHECK_EQ(t_used(0), CTX + 100 * MiB);
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* Past the 256 pools the enforcer tracks, allocations are counted by their size; one captured into a graph is the
 * graph's all the same: not counted, and nothing read or waited for inside the capture (counted by size it could
 * sleep there under oom_policy=wait, asking cuMemGetInfo between sleeps). */
static void s_untracked_pool_captured_alloc_is_the_graphs(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    CUmemoryPool untracked = pool_past_the_tracked();
    CUdeviceptr a = 0, g = 0;
    CHECK_EQ(cuMemAllocFromPoolAsync(&a, 100 * MiB, untracked, NULL), CUDA_SUCCESS); /* untracked: by its size */
    CHECK_EQ(t_used(0), CTX + 100 * MiB);
    unsigned long n0 = gsdouble_graph_allocs, v0 = gsdouble_capture_violations, r0 = gsdouble_capture_calls;
    CUstream cap = (CUstream)0x5150;
    gsdouble_capture_stream = cap;
    CHECK_EQ(cuMemAllocFromPoolAsync(&g, 600 * MiB, untracked, cap), CUDA_SUCCESS); /* past the limit: the graph's */
    CHECK(gsdouble_graph_allocs == n0 + 1, "the graph's (%lu)", gsdouble_graph_allocs - n0);
    CHECK(gsdouble_capture_violations == v0, "no call the capture forbids (%lu)", gsdouble_capture_violations - v0);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX + 100 * MiB);
    CHECK_EQ(cuStreamEndCapture(cap, NULL), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "the catch-up asks only once the capture ended (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* An allocation the capture's end made the pool's (it ended between the question and the call) is tracked as the
 * pool's, whether it grew the pool or the pool served it from its cache: destroying the pool while it lives keeps
 * its charge, as for any live allocation (untracked, the charge went with the pool while the driver still held the
 * memory). */
static void race_then_destroy(int from_cache)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 512 * MiB, CTX);
    up(0);
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemoryPool pool;
    CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    CUdeviceptr a = 0, b = 0;
    if (from_cache) {
        keep_cache(pool);
        CHECK_EQ(cuMemAllocFromPoolAsync(&a, 100 * MiB, pool, NULL), CUDA_SUCCESS);
        CHECK_EQ(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
    }
    CUstream cap = (CUstream)0x5150;
    gsdouble_capture_stream = cap;
    gsdouble_capture_ends_after_query = 1;
    CHECK_EQ(cuMemAllocFromPoolAsync(&b, from_cache ? 50 * MiB : 100 * MiB, pool, cap), CUDA_SUCCESS);
    CHECK(gsdouble_capture_stream == (void *)-1, "the capture ended meanwhile");
    CHECK_EQ(t_used(0), CTX + 128 * MiB);
    CHECK_EQ(cuMemPoolDestroy(pool), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 128 * MiB); /* live: the driver keeps the destroyed pool until its last free */
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

static void s_pool_destroyed_after_the_race_keeps_its_charge(void) { race_then_destroy(0); }
static void s_race_served_from_cache_keeps_its_pool_charged(void) { race_then_destroy(1); }

/* cuMemAllocFromPoolAsync charges the pool's device, not the current context's. */
static void s_explicit_pool_charges_its_device(void)
{
    char u1[64];
    t_uuid(1, u1);
    t_slice("memory_limit=1g\nmemory_limit.%s=256m\ncontext_overhead=%llu\n", u1, CTX);
    up(0); /* the current context is device 0 */
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 1);
    CUmemoryPool pool;
    CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    CUdeviceptr a;
    CHECK_EQ(cuMemAllocFromPoolAsync(&a, 192 * MiB, pool, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocFromPoolAsync(&a, 96 * MiB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* device 1: 256 MiB */
    struct gs_region *r = t_map_region();
    CHECK(r != NULL, "region");
    if (r) {
        int i1 = -1;
        for (uint32_t i = 0; i < r->device_count; i++)
            if (!strcmp(r->devices[i].uuid, u1)) i1 = (int)i;
        CHECK(i1 >= 0 && r->devices[i1].used == 192 * MiB, "device 1 charged the pool's 192 MiB");
        CHECK_EQ(r->devices[0].used, CTX); /* device 0 only its context */
        munmap(r, sizeof *r);
    }
    /* the device's default pool, obtained without us seeing it, is found too */
    CUmemoryPool def1 = default_pool(1);
    CHECK_EQ(cuMemAllocFromPoolAsync(&a, 96 * MiB, def1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    /* host-located pools are not device memory */
    struct t_pool_props hp = t_pool_on(2 /* CU_MEM_LOCATION_TYPE_HOST */, 0);
    CUmemoryPool host;
    CHECK_EQ(cuMemPoolCreate(&host, &hp), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocFromPoolAsync(&a, 2048 * MiB, host, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
}

/* cudaFree of cudaMallocAsync memory, a pool destroyed with allocations outstanding. */
static void s_sync_free_and_destroyed_pool(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr a;
    CHECK_EQ(cuMemAllocAsync(&a, 64 * MiB, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemoryPool pool;
    CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    keep_cache(pool);
    CUdeviceptr b, c;
    CHECK_EQ(cuMemAllocFromPoolAsync(&b, 64 * MiB, pool, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocFromPoolAsync(&c, 64 * MiB, pool, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 128 * MiB);
    CHECK_EQ(cuMemPoolDestroy(pool), CUDA_SUCCESS); /* c still outstanding: the pool lives on */
    CHECK_EQ(t_used(0), CTX + 128 * MiB);
    CHECK_EQ(cuMemFreeAsync(c, NULL), CUDA_SUCCESS); /* its last allocation: all of it goes */
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    setenv("GSDOUBLE_POOL_CHUNK", "33554432", 1); /* 32 MiB */
    SCENARIO(s_cached_memory_stays_counted);
    SCENARIO(s_two_processes_cached_pools);
    SCENARIO(s_refusal_trims_cache_then_retries);
    SCENARIO(s_other_allocations_trim_pool_cache);
    SCENARIO(s_pool_growth_past_limit_undone);
    SCENARIO(s_explicit_pool_charges_its_device);
    SCENARIO(s_sync_free_and_destroyed_pool);
    SCENARIO(s_captured_async_alloc_is_the_graphs);
    SCENARIO(s_capture_ending_meanwhile_is_counted);
    SCENARIO(s_undo_during_a_capture_elsewhere);
    SCENARIO(s_captured_alloc_beside_an_unseen_pool_growth);
    SCENARIO(s_pool_destroyed_after_the_race_keeps_its_charge);
    SCENARIO(s_race_served_from_cache_keeps_its_pool_charged);
    SCENARIO(s_pool_growth_during_a_capture_is_counted_at_its_end);
    SCENARIO(s_untracked_pool_captured_alloc_is_the_graphs);
    SCENARIO(s_invalidated_capture_is_caught_up_at_its_end);
    SCENARIO(s_free_inside_a_capture_asks_nothing);
    SCENARIO(s_capture_restarted_around_an_allocation_is_counted);
    SCENARIO(s_allocation_into_a_restarted_capture_is_never_undone);
    SCENARIO(s_race_on_an_untracked_pool_is_counted_by_size);
    fprintf(stderr, "test_enforcer_pool%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
