/* Driver API memory hooks for linear memory: cuMemAlloc, pitched, managed, cuMemFree, and the
 * memory queries (which report the slice instead of the card). Each allocation counts against the
 * slice and is refused past the limit with CUDA_ERROR_OUT_OF_MEMORY; each free gives back what its
 * allocation counted. Arrays: cuda_array.c; VMM: cuda_vmm.c; stream-ordered pools: cuda_pool.c;
 * the legacy 32-bit entry points: cuda_legacy.c. */
#define _GNU_SOURCE
#include <stdint.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"

GS_EXPORT CUresult cuInit(unsigned int flags)
{
    __typeof__(&cuInit) real = GS_REAL(cuInit);
    GS_PROLOGUE(real(flags));
    return real(flags);
}

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    __typeof__(&cuMemAlloc_v2) real = GS_REAL(cuMemAlloc_v2);
    GS_PROLOGUE(real(dptr, bytes));
    ORD_OR_PASS(real(dptr, bytes));
    GS_ACCOUNTED("cuMemAlloc", ord, bytes, GS_K_DPTR, *dptr, real(dptr, bytes));
}

GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    /* Managed memory lives on the device while resident; counting it up front keeps the slice's
     * promise even when it all migrates in. */
    __typeof__(&cuMemAllocManaged) real = GS_REAL(cuMemAllocManaged);
    GS_PROLOGUE(real(dptr, bytes, flags));
    ORD_OR_PASS(real(dptr, bytes, flags));
    GS_ACCOUNTED("cuMemAllocManaged", ord, bytes, GS_K_DPTR, *dptr, real(dptr, bytes, flags));
}

/* The pitch is only known afterwards: reserve with the usual 512-byte row alignment, then settle the
 * difference (refusing, and freeing, if the real rows were wider than the slice allows). `call`
 * makes the real allocation and reports its pointer and pitch; `fr` frees it. Shared by the _v2 and
 * the legacy 32-bit entry points. */
CUresult gs_pitched(int ord, uint64_t width, uint64_t height, CUresult (*call)(void *, uint64_t *, uint64_t *),
                        void *args, CUresult (*fr)(void *, uint64_t))
{
    uint64_t est = ((width + 511) & ~511ull) * height, ptr = 0, pitch = 0;
    CUresult r = gs_mem_reserve(ord, est, "cuMemAllocPitch");
    if (r == GS_PASS_UNCOUNTED) return call(args, &ptr, &pitch);
    if (r != CUDA_SUCCESS) return r;
    r = call(args, &ptr, &pitch);
    if (r != CUDA_SUCCESS) {
        gs_mem_release(ord, est);
        return r;
    }
    uint64_t actual = pitch * height;
    if (actual > est) {
        CUresult more = gs_mem_reserve(ord, actual - est, "cuMemAllocPitch");
        if (more != CUDA_SUCCESS && more != GS_PASS_UNCOUNTED) {
            fr(args, ptr);
            gs_mem_release(ord, est);
            return more;
        }
    } else if (actual < est) {
        gs_mem_release(ord, est - actual);
    }
    gs_track_add(GS_K_DPTR, ptr, ord, actual);
    return CUDA_SUCCESS;
}

struct pitch_v2 {
    CUresult (*real)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUdeviceptr *dptr;
    size_t *pitch, width, height;
    unsigned elem;
};

static CUresult call_pitch_v2(void *v, uint64_t *ptr, uint64_t *pitch)
{
    struct pitch_v2 *a = v;
    size_t pt = 0;
    CUresult r = a->real(a->dptr, a->pitch ? a->pitch : &pt, a->width, a->height, a->elem);
    if (r == CUDA_SUCCESS) {
        *ptr = *a->dptr;
        *pitch = a->pitch ? *a->pitch : pt;
    }
    return r;
}

static CUresult free_v2(void *v, uint64_t ptr)
{
    (void)v;
    CUresult (*fr)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))gs_real("cuMemFree_v2");
    return fr ? fr(ptr) : CUDA_ERROR_NOT_FOUND;
}

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem)
{
    __typeof__(&cuMemAllocPitch_v2) real = GS_REAL(cuMemAllocPitch_v2);
    GS_PROLOGUE(real(dptr, pitch, width, height, elem));
    ORD_OR_PASS(real(dptr, pitch, width, height, elem));
    if (!dptr) return real(dptr, pitch, width, height, elem);
    struct pitch_v2 a = {real, dptr, pitch, width, height, elem};
    return gs_pitched(ord, width, height, call_pitch_v2, &a, free_v2);
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    __typeof__(&cuMemFree_v2) real = GS_REAL(cuMemFree_v2);
    GS_PROLOGUE(real(dptr));
    CUresult r = gs_pool_free_sync(dptr, (void *)real); /* cudaFree of cudaMallocAsync memory */
    if (r != GS_POOL_NOT_MINE) return r;
    GS_FREED(GS_K_DPTR, dptr, real(dptr));
}


/* ---- queries: the slice, not the card */
void gs_clamp_mem_info(uint64_t *free_b, uint64_t *total_b)
{
    uint64_t lim, used;
    int ord = gs_current_ordinal();
    if (ord < 0 || gs_mem_query(ord, &lim, &used) || lim == GS_UNLIMITED) return;
    uint64_t total = lim < *total_b ? lim : *total_b;
    uint64_t left = total > used ? total - used : 0;
    *total_b = total;
    *free_b = left < *free_b ? left : *free_b;
}

void gs_clamp_total_mem(int dev, uint64_t *bytes)
{
    uint64_t lim, used;
    if (gs_mem_query(dev, &lim, &used) == 0 && lim < *bytes) *bytes = lim;
}

GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    __typeof__(&cuMemGetInfo_v2) real = GS_REAL(cuMemGetInfo_v2);
    GS_PROLOGUE(real(free_b, total_b));
    size_t f = 0, t = 0;
    CUresult r = real(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    uint64_t f64 = f, t64 = t;
    gs_clamp_mem_info(&f64, &t64);
    if (free_b) *free_b = (size_t)f64;
    if (total_b) *total_b = (size_t)t64;
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    __typeof__(&cuDeviceTotalMem_v2) real = GS_REAL(cuDeviceTotalMem_v2);
    GS_PROLOGUE(real(bytes, dev));
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes) {
        uint64_t b = *bytes;
        gs_clamp_total_mem(dev, &b);
        *bytes = (size_t)b;
    }
    return r;
}

const struct gs_hook gs_hooks_memory[] = {
    {"cuInit", (void *)cuInit},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
    {"cuMemFree_v2", (void *)cuMemFree_v2},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2},
    {0, 0},
};
