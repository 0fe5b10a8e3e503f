/* What the enforcer tests call: the driver and NVML entry points (declared here, no CUDA toolkit),
 * the double's introspection, and the helpers every scenario uses. Included after testlib.h. */
#ifndef GS_ENFORCER_API_H
#define GS_ENFORCER_API_H
#include "testlib.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t, nvmlProcessDetailList_t *);
unsigned long long gsdouble_used(int dev);
extern unsigned long gsdouble_launches;

CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuStreamSynchronize(CUstream);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);

#define CTX (64 * MiB) /* context_overhead every scenario configures */
#define POOL_ATTR_RELEASE_THRESHOLD 4
#define POOL_ATTR_RESERVED_MEM_CURRENT 5

/* The props of a pool on device dev (CUmemPoolProps starts allocType, handleTypes, location). */
struct t_pool_props { int alloc_type, handle_types; CUmemLocation location; void *win32; size_t max_size; unsigned short usage; unsigned char reserved[54]; };
static inline struct t_pool_props t_pool_on(int type, int dev)
{
    struct t_pool_props p;
    memset(&p, 0, sizeof p);
    p.alloc_type = 1; /* pinned */
    p.location.type = type;
    p.location.id = dev;
    return p;
}

static inline void up(int dev)
{
    CUcontext c;
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(c), CUDA_SUCCESS);
}

/* Allocate chunk-sized blocks with fn until refused; returns bytes granted, frees nothing. */
static inline unsigned long long fill(CUresult (*fn)(CUdeviceptr *, size_t), size_t chunk, CUdeviceptr *keep, int *n)
{
    unsigned long long got = 0;
    CUdeviceptr p;
    CUresult r;
    *n = 0;
    while ((r = fn(&p, chunk)) == CUDA_SUCCESS) {
        got += chunk;
        if (keep) keep[*n] = p;
        (*n)++;
    }
    CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
    return got;
}

#endif
