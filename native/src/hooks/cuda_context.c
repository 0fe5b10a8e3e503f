/* Context hooks: each CUDA context costs device memory the program never asked for, so the enforcer
 * counts a per-device cost per context: once per process for the primary context (refcounted
 * retain/release), once per cuCtxCreate. The cost is measured on the card around the slice's first
 * context there (src/accounting/ctxcost.c; the slice's context_overhead= wins, the built-in default
 * stands in until measured), and each context gives back exactly what it was charged.
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
static uint64_t g_primary_charge[MAX_ORD]; /* bytes the primary context of each ordinal was charged */

/* The child holds no contexts of the parent. */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_primary_lock = fresh;
    for (int i = 0; i < MAX_ORD; i++) {
        g_primary_refs[i] = 0;
        g_primary_ctx[i] = NULL;
        g_primary_charge[i] = 0;
    }
}
GS_ON_FORK_CHILD(after_fork_child);

static CUresult primary_retain(CUresult (*real)(CUcontext *, CUdevice), CUcontext *pctx, CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(pctx, dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = CUDA_SUCCESS;
    uint64_t charged = 0;
    int first = g_primary_refs[dev] == 0;
    struct gs_ctx_probe probe = {0, -1, -1, -1, {{0, 0}}};
    if (first) {
        probe = gs_ctx_cost_probe(dev);
        r = gs_mem_ctx_add(dev, &charged);
        if (r == GS_PASS_UNCOUNTED) r = CUDA_SUCCESS;
    }
    if (r == CUDA_SUCCESS) {
        r = real(pctx, dev);
        if (r == CUDA_SUCCESS) {
            g_primary_refs[dev]++;
            if (pctx) g_primary_ctx[dev] = *pctx;
        } else if (charged) {
            gs_mem_ctx_remove(dev, charged);
        }
    }
    if (first) {
        charged = gs_ctx_cost_settle(dev, probe, charged, r == CUDA_SUCCESS);
        if (r == CUDA_SUCCESS) g_primary_charge[dev] = charged;
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

/* The primary context of dev is gone and its allocations with it: so is its pools' memory. */
static void primary_freed(CUcontext ctx, CUdevice dev)
{
    gs_track_drop_ctx(ctx);
    gs_pool_forget_device(dev); /* the device's pools and their cache went with the context */
    gs_graph_forget_device(dev);
}

static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && g_primary_refs[dev] > 0 && --g_primary_refs[dev] == 0) {
        primary_freed(g_primary_ctx[dev], dev);
        g_primary_ctx[dev] = NULL;
        gs_mem_ctx_remove(dev, g_primary_charge[dev]);
        g_primary_charge[dev] = 0;
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

/* After the real cuCtxCreate: settle the charge (measuring the card's context cost if it is the
 * slice's first there), remember the context with what it was charged, or give the charge back. */
static CUresult ctx_created(CUresult r, CUcontext *pctx, CUdevice dev, struct gs_ctx_probe probe, uint64_t charged)
{
    charged = gs_ctx_cost_settle(dev, probe, charged, r == CUDA_SUCCESS && pctx);
    if (r == CUDA_SUCCESS && pctx) gs_track_add(GS_K_CTX, (uintptr_t)*pctx, dev, charged);
    else gs_mem_ctx_remove(dev, charged);
    return r;
}

/* Creating a context (every version of cuCtxCreate, `call` being the real one): count its cost first,
 * then ctx_created. */
#define CTX_CREATE(call)                                                       \
    do {                                                                       \
        uint64_t charged_;                                                     \
        struct gs_ctx_probe probe_ = gs_ctx_cost_probe(dev);                   \
        CUresult rr = gs_mem_ctx_add(dev, &charged_);                          \
        if (rr != CUDA_SUCCESS) {                                              \
            gs_ctx_cost_settle(dev, probe_, 0, 0);                             \
            return rr == GS_PASS_UNCOUNTED ? (call) : rr;                      \
        }                                                                      \
        return ctx_created((call), pctx, dev, probe_, charged_);               \
    } while (0)

static CUresult ctx_destroy(CUresult (*real)(CUcontext), CUcontext ctx)
{
    int ord;
    uint64_t charged;
    int had = gs_track_take(GS_K_CTX, (uintptr_t)ctx, &ord, &charged);
    CUresult r = real(ctx);
    if (!had) return r;
    if (r == CUDA_SUCCESS) {
        gs_track_drop_ctx(ctx);
        gs_mem_ctx_remove(ord, charged);
    } else {
        gs_track_add(GS_K_CTX, (uintptr_t)ctx, ord, charged);
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
