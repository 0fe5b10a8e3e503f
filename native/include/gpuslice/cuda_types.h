/* The few CUDA driver API and NVML types the enforcer needs, declared here so that the enforcer
 * builds with a plain C compiler and no CUDA toolkit. Layouts follow cuda.h / nvml.h of CUDA 12-13
 * (they are ABI: the driver has kept them stable since they appeared). Only what we read is declared. */
#ifndef GPUSLICE_CUDA_TYPES_H
#define GPUSLICE_CUDA_TYPES_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ILLEGAL_STATE = 401, /* cuStreamEndCapture on a stream that does not capture */
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600, /* cuEventQuery / cuStreamQuery: not complete yet */
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, /* a call stream capture forbids (it invalidates the capture) */
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, /* the capture was invalidated before (cuStreamEndCapture ends it so) */
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,    /* the legacy stream used while a blocking stream captures */
    CUDA_ERROR_CAPTURED_EVENT = 907,             /* a look at an event recorded inside a capture */
};
/* CUstreamCaptureMode (cuThreadExchangeStreamCaptureMode): a thread in relaxed mode may make "potentially unsafe"
 * calls (an event query) while another thread captures in global mode, the default */
enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1, CU_STREAM_CAPTURE_MODE_RELAXED = 2 };
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraph_st *CUgraph;
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2 /* CUgraphMem_attribute */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { char bytes[16]; } CUuuid;
typedef int CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2

typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* Legacy (pre-CUDA 3.2) entry points that libcuda still exports under the unversioned names
 * (cuMemAlloc, cuMemGetInfo, ...): 32-bit device pointers and sizes. */
typedef unsigned int CUdeviceptr_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04

typedef struct {
    int type; /* CUmemLocationType: 1 = device */
    int id;
} CUmemLocation;
#define CU_MEM_LOCATION_TYPE_DEVICE 1

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* ---------------------------------------------------------------- NVML */
typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
/* _v2 and _v3 of the process queries share this layout (pid, memory, GPU/compute instance ids). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlDeviceGetRunningProcessDetailList (driver 535+), used by nvidia-smi for its process table. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;
typedef struct {
    unsigned int version;
    unsigned int mode; /* 0 compute, 1 graphics, 2 MPS compute */
    unsigned int numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

#endif
