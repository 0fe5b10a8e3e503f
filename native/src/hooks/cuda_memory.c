/* Driver API memory hooks for linear memory: cuMemAlloc, pitched, managed, cuMemFree, and the
 * memory queries (which report the slice instead of the card). Each allocation counts against the
 * slice and is refused past the limit with CUDA_ERROR_OUT_OF_MEMORY; each free gives back what its
 * allocation counted. Arrays: cuda_array.c; VMM: cuda_vmm.c; stream-ordered pools: cuda_pool.c. */
#define _GNU_SOURCE
#include <stdint.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"
#include "gpuslice/mps.h"

/* The linear-memory entry points come in two generations that mean the same: the _v2 functions
 * (64-bit pointers and sizes) and the legacy pre-CUDA-3.2 ones libcuda still exports under the plain
 * names (32-bit). cuda.h maps the plain names to _v2 at compile time, so only programs that look
 * the plain names up themselves (dlsym, ctypes, cuGetProcAddress with an old version) reach the
 * legacy ones -- and they must meet the same limit. One row per generation, one column per twin:
 *   X(pointer type, size type, legacy, alloc, pitch, free, get_info, total_mem)
 * `legacy` keeps the two ways the generations' hooks have always differed: a legacy cuMemAlloc
 * hands a NULL pointer straight to the driver, and only cuMemFree_v2 can meet stream-ordered pool
 * memory (cudaFree of cudaMallocAsync memory; a 32-bit pointer never names it). */
#define LINEAR_MEMORY_GENERATIONS(X)                                                                  \
    X(CUdeviceptr, size_t, 0,                                                                         \
      cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemFree_v2, cuMemGetInfo_v2, cuDeviceTotalMem_v2)          \
    X(CUdeviceptr_v1, unsigned int, 1,                                                                \
      cuMemAlloc, cuMemAllocPitch, cuMemFree, cuMemGetInfo, cuDeviceTotalMem)

GS_EXPORT CUresult cuInit(unsigned int flags)
{
    __typeof__(&cuInit) real = GS_REAL(cuInit);
    GS_PROLOGUE(real(flags));
    gs_mps_hold(&gs_cfg); /* the MPS variables as the slice says, whatever the process set since */
    return real(flags);
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

#define ALLOC_HOOK(name, PTR, SIZE, legacy)                                                           \
    GS_EXPORT CUresult name(PTR *dptr, SIZE bytes)                                                    \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(dptr, bytes));                                                               \
        ORD_OR_PASS(real(dptr, bytes));                                                               \
        if ((legacy) && !dptr) return real(dptr, bytes);                                              \
        GS_ACCOUNTED("cuMemAlloc", ord, bytes, GS_K_DPTR, *dptr, real(dptr, bytes));                  \
    }

/* The pitch is only known afterwards: reserve with the usual 512-byte row alignment, then settle the
 * difference (refusing, and freeing, if the real rows were wider than the slice allows). `call`
 * makes the real allocation and reports its pointer and pitch; `fr` frees it. */
static CUresult pitched(int ord, uint64_t width, uint64_t height, CUresult (*call)(void *, uint64_t *, uint64_t *),
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

/* For `pitched`, per generation: the arguments, the real call, and the real free. */
#define PITCH_HOOK(name, PTR, SIZE, free_name)                                                        \
    struct name##_args {                                                                              \
        CUresult (*real)(PTR *, SIZE *, SIZE, SIZE, unsigned int);                                    \
        PTR *dptr;                                                                                    \
        SIZE *pitch, width, height;                                                                   \
        unsigned int elem;                                                                            \
    };                                                                                                \
    static CUresult name##_call(void *v, uint64_t *ptr, uint64_t *pitch)                              \
    {                                                                                                 \
        struct name##_args *a = v;                                                                    \
        SIZE pt = 0;                                                                                  \
        CUresult r = a->real(a->dptr, a->pitch ? a->pitch : &pt, a->width, a->height, a->elem);       \
        if (r == CUDA_SUCCESS) {                                                                      \
            *ptr = *a->dptr;                                                                          \
            *pitch = a->pitch ? *a->pitch : pt;                                                       \
        }                                                                                             \
        return r;                                                                                     \
    }                                                                                                 \
    static CUresult name##_free(void *v, uint64_t ptr)                                                \
    {                                                                                                 \
        (void)v;                                                                                      \
        CUresult (*fr)(PTR) = (CUresult(*)(PTR))gs_real(#free_name);                                  \
        return fr ? fr((PTR)ptr) : CUDA_ERROR_NOT_FOUND;                                              \
    }                                                                                                 \
    GS_EXPORT CUresult name(PTR *dptr, SIZE *pitch, SIZE width, SIZE height, unsigned int elem)       \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(dptr, pitch, width, height, elem));                                          \
        ORD_OR_PASS(real(dptr, pitch, width, height, elem));                                          \
        if (!dptr) return real(dptr, pitch, width, height, elem);                                     \
        struct name##_args a = {real, dptr, pitch, width, height, elem};                              \
        return pitched(ord, width, height, name##_call, &a, name##_free);                             \
    }

#define FREE_HOOK(name, PTR, legacy)                                                                  \
    GS_EXPORT CUresult name(PTR dptr)                                                                 \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(dptr));                                                                      \
        if (!(legacy)) {                                                                              \
            CUresult r = gs_pool_free_sync(dptr, (void *)real); /* cudaFree of cudaMallocAsync memory */ \
            if (r != GS_POOL_NOT_MINE) return r;                                                      \
        }                                                                                             \
        GS_FREED(GS_K_DPTR, dptr, real(dptr));                                                        \
    }

/* ---- queries: the slice, not the card */
static void clamp_mem_info(uint64_t *free_b, uint64_t *total_b)
{
    uint64_t lim, used;
    int ord = gs_current_ordinal();
    if (ord < 0 || gs_mem_query(ord, &lim, &used) || lim == GS_UNLIMITED) return;
    uint64_t total = lim < *total_b ? lim : *total_b;
    uint64_t left = total > used ? total - used : 0;
    *total_b = total;
    *free_b = left < *free_b ? left : *free_b;
}

static void clamp_total_mem(int dev, uint64_t *bytes)
{
    uint64_t lim, used;
    if (gs_mem_query(dev, &lim, &used) == 0 && lim < *bytes) *bytes = lim;
}

/* The clamps only ever lower the driver's answer: a legacy one still fits 32 bits. */
#define GET_INFO_HOOK(name, SIZE)                                                                     \
    GS_EXPORT CUresult name(SIZE *free_b, SIZE *total_b)                                              \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(free_b, total_b));                                                           \
        SIZE f = 0, t = 0;                                                                            \
        CUresult r = real(&f, &t);                                                                    \
        if (r != CUDA_SUCCESS) return r;                                                              \
        uint64_t f64 = f, t64 = t;                                                                    \
        clamp_mem_info(&f64, &t64);                                                                   \
        if (free_b) *free_b = (SIZE)f64;                                                              \
        if (total_b) *total_b = (SIZE)t64;                                                            \
        return CUDA_SUCCESS;                                                                          \
    }

#define TOTAL_MEM_HOOK(name, SIZE)                                                                    \
    GS_EXPORT CUresult name(SIZE *bytes, CUdevice dev)                                                \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(bytes, dev));                                                                \
        CUresult r = real(bytes, dev);                                                                \
        if (r == CUDA_SUCCESS && bytes) {                                                             \
            uint64_t b = *bytes;                                                                      \
            clamp_total_mem(dev, &b);                                                                 \
            *bytes = (SIZE)b;                                                                         \
        }                                                                                             \
        return r;                                                                                     \
    }

#define GENERATION_HOOKS(PTR, SIZE, legacy, alloc, pitch, free_, get_info, total_mem)                 \
    ALLOC_HOOK(alloc, PTR, SIZE, legacy)                                                              \
    PITCH_HOOK(pitch, PTR, SIZE, free_)                                                               \
    FREE_HOOK(free_, PTR, legacy)                                                                     \
    GET_INFO_HOOK(get_info, SIZE)                                                                     \
    TOTAL_MEM_HOOK(total_mem, SIZE)
LINEAR_MEMORY_GENERATIONS(GENERATION_HOOKS)

#define GENERATION_ROWS(PTR, SIZE, legacy, alloc, pitch, free_, get_info, total_mem)                  \
    GS_HOOK_ENTRY(alloc) GS_HOOK_ENTRY(pitch) GS_HOOK_ENTRY(free_) GS_HOOK_ENTRY(get_info) GS_HOOK_ENTRY(total_mem)
const struct gs_hook gs_hooks_memory[] = {
    GS_HOOK_ENTRY(cuInit)
    GS_HOOK_ENTRY(cuMemAllocManaged)
    LINEAR_MEMORY_GENERATIONS(GENERATION_ROWS)
    {0, 0},
};
