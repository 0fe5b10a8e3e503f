/* Context hooks: each CUDA context costs device memory the program never asked for (measured, see
 * GS_DEFAULT_CONTEXT_OVERHEAD in src/accounting/memory.c), so the enforcer counts a per-device
 * overhead per context: once per process for the primary context (refcounted retain/release), once
 * per cuCtxCreate.
 * Destroying a context (or resetting the primary one) frees its allocations with it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "gpuslice/fork.h"
#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"

#define MAX_ORD 64
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_primary_refs[MAX_ORD];
static CUcontext g_primary_ctx[MAX_ORD];

/* The child holds no contexts of the parent. */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_primary_lock = fresh;
    for (int i = 0; i < MAX_ORD; i++) {
        g_primary_refs[i] = 0;
        g_primary_ctx[i] = NULL;
    }
}
GS_ON_FORK_CHILD(after_fork_child);

static CUresult primary_retain(CUresult (*real)(CUcontext *, CUdevice), CUcontext *pctx, CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(pctx, dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = CUDA_SUCCESS;
    int counted = 0;
    if (g_primary_refs[dev] == 0) {
        r = gs_mem_ctx_add(dev);
        if (r == GS_PASS_UNCOUNTED) r = CUDA_SUCCESS;
        else if (r == CUDA_SUCCESS) counted = 1;
    }
    if (r == CUDA_SUCCESS) {
        r = real(pctx, dev);
        if (r == CUDA_SUCCESS) {
            g_primary_refs[dev]++;
            if (pctx) g_primary_ctx[dev] = *pctx;
        } else if (counted) {
            gs_mem_ctx_remove(dev);
        }
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

/* The primary context of dev is gone and its allocations with it: so is its pools' memory. */
static void primary_freed(CUcontext ctx, CUdevice dev)
{
    gs_track_drop_ctx(ctx);
    gs_pool_forget_device(dev); /* the device's pools and their cache went with the context */
}

static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && g_primary_refs[dev] > 0 && --g_primary_refs[dev] == 0) {
        primary_freed(g_primary_ctx[dev], dev);
        g_primary_ctx[dev] = NULL;
        gs_mem_ctx_remove(dev);
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

/* Reset destroys the primary context's allocations but keeps the retain count: the context comes
 * back (and is counted again) on next use only if someone still holds a reference. */
static CUresult primary_reset(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUcontext ctx = g_primary_ctx[dev];
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && ctx) primary_freed(ctx, dev);
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

/* Creating a context (every version of cuCtxCreate, `call` being the real one): count its overhead
 * first, remember the context once it exists, give the overhead back when it does not. */
#define CTX_CREATE(call)                                                       \
    do {                                                                       \
        CUresult rr = gs_mem_ctx_add(dev);                                     \
        if (rr == GS_PASS_UNCOUNTED) return (call);                            \
        if (rr != CUDA_SUCCESS) return rr;                                     \
        rr = (call);                                                           \
        if (rr == CUDA_SUCCESS && pctx) gs_track_add(GS_K_CTX, (uintptr_t)*pctx, dev, 0); \
        else gs_mem_ctx_remove(dev);                                           \
        return rr;                                                             \
    } while (0)

static CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx)
{
    int ord;
    uint64_t zero;
    int had = gs_track_take(GS_K_CTX, (uintptr_t)ctx, &ord, &zero);
    CUresult r = real(ctx);
    if (!had) return r;
    if (r == CUDA_SUCCESS) {
        gs_track_drop_ctx(ctx);
        gs_mem_ctx_remove(ord);
    } else {
        gs_track_add(GS_K_CTX, (uintptr_t)ctx, ord, 0);
    }
    return r;
}

/* Every context entry point. The versions of one function do the same and differ only in their
 * parameters (cuCtxCreate_v3/_v4 in those between pctx and dev; the unversioned names are the
 * legacy twins, reachable through dlsym):
 *   X(name, parameters, arguments, what it does -- a statement that sees `real` and the parameters) */
#define CONTEXT_HOOKS(X)                                                                                   \
    X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev), RETAIN)                     \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev), RELEASE)                                        \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev), RELEASE)                                           \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev), RESET)                                            \
    X(cuDevicePrimaryCtxReset, (CUdevice dev), (dev), RESET)                                               \
    X(cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), CREATE)       \
    X(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev), CREATE)    \
    X(cuCtxCreate_v3, (CUcontext *pctx, void *params, int nparams, unsigned int flags, CUdevice dev),     \
      (pctx, params, nparams, flags, dev), CREATE)                                                         \
    X(cuCtxCreate_v4, (CUcontext *pctx, void *params, unsigned int flags, CUdevice dev),                  \
      (pctx, params, flags, dev), CREATE)                                                                  \
    X(cuCtxDestroy, (CUcontext ctx), (ctx), DESTROY)                                                       \
    X(cuCtxDestroy_v2, (CUcontext ctx), (ctx), DESTROY)

#define RETAIN(call) return primary_retain(real, pctx, dev)
#define RELEASE(call) return primary_release(real, dev)
#define RESET(call) return primary_reset(real, dev)
#define CREATE(call) CTX_CREATE(call)
#define DESTROY(call) return ctx_destroy(real, ctx)
CONTEXT_HOOKS(GS_HOOK_DEFINE)

const struct gs_hook gs_hooks_context[] = {CONTEXT_HOOKS(GS_HOOK_ROW){0, 0}};
