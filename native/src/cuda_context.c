/* Context hooks: each CUDA context costs device memory the program never asked for (measured, see
 * memory.c GS_DEFAULT_CONTEXT_OVERHEAD), so the enforcer counts a per-device overhead per context:
 * once per process for the primary context (refcounted retain/release), once per cuCtxCreate.
 * Destroying a context (or resetting the primary one) frees its allocations with it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"

#define MAX_ORD 64
static pthread_mutex_t g_primary_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_primary_refs[MAX_ORD];
static CUcontext g_primary_ctx[MAX_ORD];

/* Called by init.c's fork handler: the child holds no contexts of the parent. */
void gs_ctx_after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_primary_lock = fresh;
    for (int i = 0; i < MAX_ORD; i++) {
        g_primary_refs[i] = 0;
        g_primary_ctx[i] = NULL;
    }
}

GS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRetain) real = GS_REAL(cuDevicePrimaryCtxRetain);
    GS_PROLOGUE(real(pctx, dev));
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

static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && g_primary_refs[dev] > 0 && --g_primary_refs[dev] == 0) {
        gs_track_drop_ctx(g_primary_ctx[dev]);
        gs_pool_forget_device(dev); /* the device's pools and their cache went with the context */
        g_primary_ctx[dev] = NULL;
        gs_mem_ctx_remove(dev);
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

GS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRelease_v2) real = GS_REAL(cuDevicePrimaryCtxRelease_v2);
    GS_PROLOGUE(real(dev));
    return primary_release(real, dev);
}

GS_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxRelease) real = GS_REAL(cuDevicePrimaryCtxRelease);
    GS_PROLOGUE(real(dev));
    return primary_release(real, dev);
}

static CUresult primary_reset(CUresult (*real)(CUdevice), CUdevice dev)
{
    if (dev < 0 || dev >= MAX_ORD) return real(dev);
    pthread_mutex_lock(&g_primary_lock);
    CUcontext ctx = g_primary_ctx[dev];
    CUresult r = real(dev);
    /* Reset destroys the primary context's allocations but keeps the retain count: the context comes
     * back (and is counted again) on next use only if someone still holds a reference. */
    if (r == CUDA_SUCCESS && ctx) {
        gs_track_drop_ctx(ctx);
        gs_pool_forget_device(dev);
    }
    pthread_mutex_unlock(&g_primary_lock);
    return r;
}

GS_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxReset_v2) real = GS_REAL(cuDevicePrimaryCtxReset_v2);
    GS_PROLOGUE(real(dev));
    return primary_reset(real, dev);
}

GS_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    __typeof__(&cuDevicePrimaryCtxReset) real = GS_REAL(cuDevicePrimaryCtxReset);
    GS_PROLOGUE(real(dev));
    return primary_reset(real, dev);
}

/* cuCtxCreate_v2/_v3/_v4 differ only in the parameters between pctx and dev. */
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

GS_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v2) real = GS_REAL(cuCtxCreate_v2);
    GS_PROLOGUE(real(pctx, flags, dev));
    CTX_CREATE(real(pctx, flags, dev));
}

/* The legacy unversioned name (same parameters as _v2), reachable through dlsym. */
GS_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate) real = GS_REAL(cuCtxCreate);
    GS_PROLOGUE(real(pctx, flags, dev));
    CTX_CREATE(real(pctx, flags, dev));
}

GS_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int nparams, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v3) real = GS_REAL(cuCtxCreate_v3);
    GS_PROLOGUE(real(pctx, params, nparams, flags, dev));
    CTX_CREATE(real(pctx, params, nparams, flags, dev));
}

GS_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
    __typeof__(&cuCtxCreate_v4) real = GS_REAL(cuCtxCreate_v4);
    GS_PROLOGUE(real(pctx, params, flags, dev));
    CTX_CREATE(real(pctx, params, flags, dev));
}

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

GS_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    __typeof__(&cuCtxDestroy_v2) real = GS_REAL(cuCtxDestroy_v2);
    GS_PROLOGUE(real(ctx));
    return ctx_destroy(real, ctx);
}

GS_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    __typeof__(&cuCtxDestroy) real = GS_REAL(cuCtxDestroy);
    GS_PROLOGUE(real(ctx));
    return ctx_destroy(real, ctx);
}

const struct gs_hook gs_hooks_context[] = {
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxReset_v2", (void *)cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset},
    {"cuCtxCreate", (void *)cuCtxCreate},
    {"cuCtxCreate_v2", (void *)cuCtxCreate_v2},
    {"cuCtxCreate_v3", (void *)cuCtxCreate_v3},
    {"cuCtxCreate_v4", (void *)cuCtxCreate_v4},
    {"cuCtxDestroy", (void *)cuCtxDestroy},
    {"cuCtxDestroy_v2", (void *)cuCtxDestroy_v2},
    {0, 0},
};
