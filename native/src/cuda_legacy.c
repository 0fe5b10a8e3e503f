/* The legacy (pre-CUDA 3.2) memory entry points that libcuda still exports under the unversioned
 * names, with 32-bit pointers and sizes: cuMemAlloc, cuMemAllocPitch, cuMemFree, cuMemGetInfo,
 * cuDeviceTotalMem. cuda.h maps these names to the _v2 functions at compile time, so only programs
 * that look the plain names up themselves (dlsym, ctypes, cuGetProcAddress with an old version)
 * reach them -- and must meet the same limit. (Legacy arrays: cuda_array.c; cuCtxCreate/Destroy:
 * cuda_context.c.) */
#define _GNU_SOURCE
#include <stdint.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"

GS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
    __typeof__(&cuMemAlloc) real = GS_REAL(cuMemAlloc);
    GS_PROLOGUE(real(dptr, bytes));
    ORD_OR_PASS(real(dptr, bytes));
    if (!dptr) return real(dptr, bytes);
    GS_ACCOUNTED("cuMemAlloc", ord, bytes, GS_K_DPTR, *dptr, real(dptr, bytes));
}

struct pitch_v1 {
    CUresult (*real)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
    CUdeviceptr_v1 *dptr;
    unsigned int *pitch, width, height, elem;
};

static CUresult call_pitch_v1(void *v, uint64_t *ptr, uint64_t *pitch)
{
    struct pitch_v1 *a = v;
    unsigned int pt = 0;
    CUresult r = a->real(a->dptr, a->pitch ? a->pitch : &pt, a->width, a->height, a->elem);
    if (r == CUDA_SUCCESS) {
        *ptr = *a->dptr;
        *pitch = a->pitch ? *a->pitch : pt;
    }
    return r;
}

static CUresult free_v1(void *v, uint64_t ptr)
{
    (void)v;
    CUresult (*fr)(CUdeviceptr_v1) = (CUresult(*)(CUdeviceptr_v1))gs_real("cuMemFree");
    return fr ? fr((CUdeviceptr_v1)ptr) : CUDA_ERROR_NOT_FOUND;
}

GS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                                   unsigned int elem)
{
    __typeof__(&cuMemAllocPitch) real = GS_REAL(cuMemAllocPitch);
    GS_PROLOGUE(real(dptr, pitch, width, height, elem));
    ORD_OR_PASS(real(dptr, pitch, width, height, elem));
    if (!dptr) return real(dptr, pitch, width, height, elem);
    struct pitch_v1 a = {real, dptr, pitch, width, height, elem};
    return gs_pitched(ord, width, height, call_pitch_v1, &a, free_v1);
}

GS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    __typeof__(&cuMemFree) real = GS_REAL(cuMemFree);
    GS_PROLOGUE(real(dptr));
    GS_FREED(GS_K_DPTR, dptr, real(dptr));
}

GS_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    __typeof__(&cuMemGetInfo) real = GS_REAL(cuMemGetInfo);
    GS_PROLOGUE(real(free_b, total_b));
    unsigned int f = 0, t = 0;
    CUresult r = real(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    uint64_t f64 = f, t64 = t;
    gs_clamp_mem_info(&f64, &t64); /* only ever lowers: still fits 32 bits */
    if (free_b) *free_b = (unsigned int)f64;
    if (total_b) *total_b = (unsigned int)t64;
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    __typeof__(&cuDeviceTotalMem) real = GS_REAL(cuDeviceTotalMem);
    GS_PROLOGUE(real(bytes, dev));
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes) {
        uint64_t b = *bytes;
        gs_clamp_total_mem(dev, &b);
        *bytes = (unsigned int)b;
    }
    return r;
}

const struct gs_hook gs_hooks_legacy[] = {
    {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch},
    {"cuMemFree", (void *)cuMemFree},
    {"cuMemGetInfo", (void *)cuMemGetInfo},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem},
    {0, 0},
};
