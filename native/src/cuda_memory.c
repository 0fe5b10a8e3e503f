/* Driver API memory hooks: every allocation path counts against the slice and is refused past the
 * limit with CUDA_ERROR_OUT_OF_MEMORY; every free gives back what its allocation counted; memory
 * queries report the slice instead of the card. */
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

/* An allocation with no current context fails in the driver; account it on no device. */
#define ORD_OR_PASS(call)                  \
    int ord = gs_current_ordinal();        \
    if (ord < 0) return (call)

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

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem)
{
    __typeof__(&cuMemAllocPitch_v2) real = GS_REAL(cuMemAllocPitch_v2);
    GS_PROLOGUE(real(dptr, pitch, width, height, elem));
    ORD_OR_PASS(real(dptr, pitch, width, height, elem));
    /* The pitch is only known afterwards: reserve with the usual 512-byte row alignment, then settle
     * the difference (refusing, and freeing, if the real rows were wider than the slice allows). */
    uint64_t est = (((uint64_t)width + 511) & ~511ull) * height;
    CUresult r = gs_mem_reserve(ord, est, "cuMemAllocPitch");
    if (r == GS_PASS_UNCOUNTED) return real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) return r;
    r = real(dptr, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) {
        gs_mem_release(ord, est);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > est) {
        CUresult more = gs_mem_reserve(ord, actual - est, "cuMemAllocPitch");
        if (more != CUDA_SUCCESS && more != GS_PASS_UNCOUNTED) {
            CUresult (*fr)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))gs_real("cuMemFree_v2");
            if (fr) fr(*dptr);
            gs_mem_release(ord, est);
            return more;
        }
    } else if (actual < est) {
        gs_mem_release(ord, est - actual);
    }
    gs_track_add(GS_K_DPTR, *dptr, ord, actual);
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    __typeof__(&cuMemFree_v2) real = GS_REAL(cuMemFree_v2);
    GS_PROLOGUE(real(dptr));
    GS_FREED(GS_K_DPTR, dptr, real(dptr));
}

/* ---- stream-ordered allocator (cudaMallocAsync, PyTorch backend:cudaMallocAsync). Counted by
 * size at allocation and given back at cuMemFreeAsync; what the pool keeps cached in between is
 * bounded by what was counted. */
#define ASYNC_ALLOC(name, what)                                                               \
    GS_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream s)                      \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, bytes, s));                                                    \
        ORD_OR_PASS(real(dptr, bytes, s));                                                    \
        GS_ACCOUNTED(what, ord, bytes, GS_K_DPTR, *dptr, real(dptr, bytes, s));               \
    }
ASYNC_ALLOC(cuMemAllocAsync, "cuMemAllocAsync")
ASYNC_ALLOC(cuMemAllocAsync_ptsz, "cuMemAllocAsync")

#define POOL_ALLOC(name)                                                                      \
    GS_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)   \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, bytes, pool, s));                                              \
        ORD_OR_PASS(real(dptr, bytes, pool, s));                                              \
        GS_ACCOUNTED("cuMemAllocFromPoolAsync", ord, bytes, GS_K_DPTR, *dptr,                 \
                     real(dptr, bytes, pool, s));                                             \
    }
POOL_ALLOC(cuMemAllocFromPoolAsync)
POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)

#define ASYNC_FREE(name)                                                                      \
    GS_EXPORT CUresult name(CUdeviceptr dptr, CUstream s)                                     \
    {                                                                                         \
        __typeof__(&name) real = GS_REAL(name);                                               \
        GS_PROLOGUE(real(dptr, s));                                                           \
        GS_FREED(GS_K_DPTR, dptr, real(dptr, s));                                             \
    }
ASYNC_FREE(cuMemFreeAsync)
ASYNC_FREE(cuMemFreeAsync_ptsz)

/* ---- virtual memory management (PyTorch expandable_segments, JAX): physical memory is created by
 * cuMemCreate and returned by cuMemRelease; mapping moves no memory. */
GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    __typeof__(&cuMemCreate) real = GS_REAL(cuMemCreate);
    GS_PROLOGUE(real(handle, size, prop, flags));
    /* Host (NUMA) physical memory made through VMM is not device memory: not the slice's business. */
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return real(handle, size, prop, flags);
    int ord = prop->location.id;
    if (ord < 0) return real(handle, size, prop, flags);
    GS_ACCOUNTED("cuMemCreate", ord, size, GS_K_HANDLE, *handle, real(handle, size, prop, flags));
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    __typeof__(&cuMemRelease) real = GS_REAL(cuMemRelease);
    GS_PROLOGUE(real(handle));
    GS_FREED(GS_K_HANDLE, handle, real(handle));
}

/* ---- arrays: sized from the descriptor (element size x channels x extent; mip levels halve). */
static uint64_t format_bytes(int format)
{
    switch (format) {
    case 0x01: case 0x08: return 1;             /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2;  /* (un)signed int16, half */
    case 0x03: case 0x0a: case 0x20: return 4;  /* (un)signed int32, float */
    default: return 4;                          /* other/new formats: at most 4 bytes per channel */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels)
{
    uint64_t n = (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1);
    return n * format_bytes(format) * (channels ? channels : 1);
}

GS_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    __typeof__(&cuArrayCreate_v2) real = GS_REAL(cuArrayCreate_v2);
    GS_PROLOGUE(real(arr, desc));
    ORD_OR_PASS(real(arr, desc));
    if (!desc) return real(arr, desc);
    uint64_t b = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    GS_ACCOUNTED("cuArrayCreate", ord, b, GS_K_ARRAY, (uintptr_t)*arr, real(arr, desc));
}

GS_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    __typeof__(&cuArray3DCreate_v2) real = GS_REAL(cuArray3DCreate_v2);
    GS_PROLOGUE(real(arr, desc));
    ORD_OR_PASS(real(arr, desc));
    if (!desc) return real(arr, desc);
    uint64_t b = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    GS_ACCOUNTED("cuArray3DCreate", ord, b, GS_K_ARRAY, (uintptr_t)*arr, real(arr, desc));
}

GS_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    __typeof__(&cuArrayDestroy) real = GS_REAL(cuArrayDestroy);
    GS_PROLOGUE(real(arr));
    GS_FREED(GS_K_ARRAY, (uintptr_t)arr, real(arr));
}

GS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int levels)
{
    __typeof__(&cuMipmappedArrayCreate) real = GS_REAL(cuMipmappedArrayCreate);
    GS_PROLOGUE(real(arr, desc, levels));
    ORD_OR_PASS(real(arr, desc, levels));
    if (!desc) return real(arr, desc, levels);
    uint64_t b = 0;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    int layered = desc->Flags & 1; /* CUDA_ARRAY3D_LAYERED: depth counts layers, which do not shrink */
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        b += array_bytes(w, h, d, desc->Format, desc->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        if (!layered) d = d > 1 ? d / 2 : d;
    }
    GS_ACCOUNTED("cuMipmappedArrayCreate", ord, b, GS_K_MIPMAP, (uintptr_t)*arr, real(arr, desc, levels));
}

GS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    __typeof__(&cuMipmappedArrayDestroy) real = GS_REAL(cuMipmappedArrayDestroy);
    GS_PROLOGUE(real(arr));
    GS_FREED(GS_K_MIPMAP, (uintptr_t)arr, real(arr));
}

/* ---- queries: the slice, not the card */
GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    __typeof__(&cuMemGetInfo_v2) real = GS_REAL(cuMemGetInfo_v2);
    GS_PROLOGUE(real(free_b, total_b));
    size_t f = 0, t = 0;
    CUresult r = real(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    uint64_t lim, used;
    int ord = gs_current_ordinal();
    if (ord >= 0 && gs_mem_query(ord, &lim, &used) == 0 && lim != GS_UNLIMITED) {
        uint64_t total = lim < t ? lim : t;
        uint64_t left = total > used ? total - used : 0;
        t = (size_t)total;
        f = (size_t)(left < f ? left : f);
    }
    if (free_b) *free_b = f;
    if (total_b) *total_b = t;
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    __typeof__(&cuDeviceTotalMem_v2) real = GS_REAL(cuDeviceTotalMem_v2);
    GS_PROLOGUE(real(bytes, dev));
    CUresult r = real(bytes, dev);
    uint64_t lim, used;
    if (r == CUDA_SUCCESS && bytes && gs_mem_query(dev, &lim, &used) == 0 && lim < *bytes) *bytes = (size_t)lim;
    return r;
}

const struct gs_hook gs_hooks_memory[] = {
    {"cuInit", (void *)cuInit},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
    {"cuMemFree_v2", (void *)cuMemFree_v2},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuArrayCreate_v2", (void *)cuArrayCreate_v2},
    {"cuArray3DCreate_v2", (void *)cuArray3DCreate_v2},
    {"cuArrayDestroy", (void *)cuArrayDestroy},
    {"cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate},
    {"cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2},
    {0, 0},
};
