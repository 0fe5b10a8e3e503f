/* CUDA graph memory: graph memory nodes (cuGraphAddMemAllocNode, and cudaMallocAsync captured into a
 * graph) allocate from a per-device graph memory pool that the driver backs with physical memory when an
 * executable graph is uploaded or first launched, keeps while graphs may use it, and gives back when
 * trimmed (cuDeviceGraphMemTrim). No allocation call the enforcer sees carries those bytes, so the books
 * follow the driver's own count instead: after every call that can change it -- instantiate (an upload
 * may be asked for), upload, an executable graph's first launch, destroying an executable graph, trim --
 * this process's CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT of the device is read and its change charged to
 * the slice (gs_mem_charge: the driver already holds it, so the books say so even past the limit, and the
 * slice's next allocations are refused) or given back (gs_mem_release).
 *
 * Only the current context's device is read, devices this process already charged graph memory on, and the
 * devices of streams whose capture ended (watched until their primary context goes): asking about a device
 * without a context could create one. A launch costs one lookup in the set of
 * executable graphs launched before (first launches read the attribute: a few microseconds, once).
 * Called by the launch hooks (gs_graph_launched) after a graph launch. Nothing is read while the launching
 * stream captures a graph; the end of a capture (cuStreamEndCapture) brings the graph books and the pools'
 * charges in line. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "gpuslice/capture.h"
#include "gpuslice/fork.h"
#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"
#include "gpuslice/u64map.h"

#define MAX_ORD 64
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_charged[MAX_ORD];   /* graph memory this process charged per ordinal */
static int g_watch[MAX_ORD];          /* ordinals a captured stream-ordered allocation may back memory on */
static struct gs_u64map g_launched;   /* executable graphs launched at least once (since the last trim) */

static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_lock = fresh;
    for (int i = 0; i < MAX_ORD; i++) g_charged[i] = g_watch[i] = 0; /* the child holds none of the parent's graphs */
    gs_u64map_clear(&g_launched);
}
GS_ON_FORK_CHILD(after_fork_child);

static void reconcile_ord(int ord)
{
    static CUresult (*attr)(CUdevice, int, void *);
    if (!attr) attr = (CUresult(*)(CUdevice, int, void *))gs_real("cuDeviceGetGraphMemAttribute");
    cuuint64_t now = 0;
    struct gs_capture_mode m = gs_capture_relax(); /* read also while a graph is captured (gs_graph_launched) */
    CUresult r = attr ? attr(ord, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) : CUDA_ERROR_NOT_FOUND;
    gs_capture_restore(&m);
    if (r != CUDA_SUCCESS) return;
    if (now > g_charged[ord]) gs_mem_charge(ord, now - g_charged[ord]);
    else if (now < g_charged[ord]) gs_mem_release(ord, g_charged[ord] - now);
    g_charged[ord] = now;
}

/* Bring the books in line with the driver's graph memory of the current device (and of the devices
 * charged before). */
static void reconcile(void)
{
    int cur = gs_current_ordinal();
    pthread_mutex_lock(&g_lock);
    for (int ord = 0; ord < MAX_ORD; ord++)
        if (ord == cur || g_charged[ord] || g_watch[ord]) reconcile_ord(ord);
    pthread_mutex_unlock(&g_lock);
}

void gs_graph_forget_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORD) return;
    pthread_mutex_lock(&g_lock);
    g_watch[ordinal] = 0; /* no more reads of a device without a context of ours (it could create one) */
    pthread_mutex_unlock(&g_lock);
}

void gs_graph_watch_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORD) return;
    pthread_mutex_lock(&g_lock);
    g_watch[ordinal] = 1;
    pthread_mutex_unlock(&g_lock);
}

void gs_graph_launched(CUgraphExec exec, CUstream s, CUresult r)
{
    if (r != CUDA_SUCCESS) return;
    /* launched into a graph being captured: a node of that graph, not this graph's run, which is still to come
     * and is counted when it comes. Nothing is read inside the capture (cuda_pool.c's captured_alloc says why);
     * a real first run that a capture begun by another thread hid from this question is counted at that capture's
     * end (captured) or at this graph's next launch, which counts as a first one still */
    if (gs_capture_status(s) > 0) return;
    pthread_mutex_lock(&g_lock);
    int first = !gs_u64map_get(&g_launched, (uint64_t)(uintptr_t)exec);
    if (first) gs_u64map_put(&g_launched, (uint64_t)(uintptr_t)exec, (struct gs_u64val){0, 0, 0});
    pthread_mutex_unlock(&g_lock);
    if (first) reconcile();
}

static CUresult after(CUresult r)
{
    if (r == CUDA_SUCCESS) reconcile();
    return r;
}

/* A capture's end was asked for: once the stream no longer captures (a successful end, and also an invalidated
 * capture's, which the driver ends with an error), what graph memory and pools did while it ran, when the enforcer
 * read neither, is counted now, and the stream's device is read for graph memory from now on (a stream-ordered
 * allocation captured there is backed on it; nothing was asked at the allocation: cuda_pool.c's captured_alloc).
 * Another thread's capture is asked about in relaxed mode, as every read of the enforcer's. */
static CUresult captured(CUresult r, CUstream s)
{
    if (gs_capture_status(s) != 0) return r; /* still capturing (a wrong thread's call), or no answer */
    int ord = gs_stream_device(s);
    gs_graph_watch_device(ord);
    reconcile();
    gs_pool_capture_ended(ord);
    return r;
}

static CUresult exec_destroy(CUresult (*real)(CUgraphExec), CUgraphExec exec)
{
    CUresult r = real(exec);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        gs_u64map_take(&g_launched, (uint64_t)(uintptr_t)exec, NULL); /* the handle may come back for another */
        pthread_mutex_unlock(&g_lock);
        reconcile();
    }
    return r;
}

/* A trim gives idle graph memory back, and the driver backs a trimmed graph's memory again at its next launch:
 * every graph's next launch is read again as a first one (a launch, a trim and a launch again held the memory
 * uncounted: a review's finding, 2026-11-30). */
static CUresult trimmed(CUresult r)
{
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&g_lock);
    gs_u64map_clear(&g_launched);
    pthread_mutex_unlock(&g_lock);
    reconcile();
    return r;
}

/* Every entry point whose call can change the graph memory the driver holds (the legacy 5-argument
 * cuGraphInstantiate / _v2 of CUDA 11 headers beside CUDA 12's WithFlags / WithParams):
 *   X(name, parameters, arguments, what) */
#define GRAPH_HOOKS(X)                                                                                    \
    X(cuGraphInstantiate, (CUgraphExec *pexec, CUgraph graph, void *error_node, char *log, size_t log_size),   \
      (pexec, graph, error_node, log, log_size), AFTER)                                                   \
    X(cuGraphInstantiate_v2, (CUgraphExec *pexec, CUgraph graph, void *error_node, char *log, size_t log_size),\
      (pexec, graph, error_node, log, log_size), AFTER)                                                   \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *pexec, CUgraph graph, unsigned long long flags),         \
      (pexec, graph, flags), AFTER)                                                                       \
    X(cuGraphInstantiateWithParams, (CUgraphExec *pexec, CUgraph graph, void *params), (pexec, graph, params), \
      AFTER)                                                                                              \
    X(cuGraphInstantiateWithParams_ptsz, (CUgraphExec *pexec, CUgraph graph, void *params),               \
      (pexec, graph, params), AFTER)                                                                      \
    X(cuGraphUpload, (CUgraphExec exec, CUstream stream), (exec, stream), AFTER)                          \
    X(cuGraphUpload_ptsz, (CUgraphExec exec, CUstream stream), (exec, stream), AFTER)                     \
    X(cuDeviceGraphMemTrim, (CUdevice dev), (dev), TRIM)                                                  \
    X(cuGraphExecDestroy, (CUgraphExec exec), (exec), DESTROY)                                            \
    X(cuStreamEndCapture, (CUstream stream, CUgraph *graph), (stream, graph), CAPTURED)                   \
    X(cuStreamEndCapture_ptsz, (CUstream stream, CUgraph *graph), (stream, graph), CAPTURED_PTSZ)

#define AFTER(call) return after(call)
#define TRIM(call) return trimmed(call)
#define DESTROY(call) return exec_destroy(real, exec)
#define CAPTURED(call) return captured(call, stream ? stream : (CUstream)0x1)
#define CAPTURED_PTSZ(call) return captured(call, stream ? stream : (CUstream)0x2)
GRAPH_HOOKS(GS_HOOK_DEFINE)

const struct gs_hook gs_hooks_graph[] = {GRAPH_HOOKS(GS_HOOK_ROW){0, 0}};
