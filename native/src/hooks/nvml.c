/* NVML hooks: memory info and process lists of a device in the slice show the slice (its limit, its
 * accounted usage, its processes), so nvidia-smi and NVML-based tools inside the slice agree with
 * cuMemGetInfo. Devices outside the slice are reported as the driver says. Devices are matched by
 * UUID hex part (NVML names a MIG instance MIG-..., the slice may too; CUDA only gives the bytes). */
#define _GNU_SOURCE
#include <string.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/nvml_view.h"

#define GS_NVML_REAL(name) GS_REAL_FROM(gs_real_nvml, name)
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_UNINITIALIZED 1

static nvmlReturn_t (*uuid_fn(void))(nvmlDevice_t, char *, unsigned)
{
    static nvmlReturn_t (*f)(nvmlDevice_t, char *, unsigned);
    if (!f) f = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))gs_real_nvml("nvmlDeviceGetUUID");
    return f;
}

/* 1 with the slice's view of device if it is in the slice and the enforcer is active. */
static int slice_view(nvmlDevice_t device, char uuid[96], uint64_t *limit, uint64_t *used)
{
    if (gs_state_now() != GS_STATE_ACTIVE) return 0;
    nvmlReturn_t (*get)(nvmlDevice_t, char *, unsigned) = uuid_fn();
    if (!get || get(device, uuid, 96) != NVML_SUCCESS) return 0;
    return gs_mem_query_uuid(uuid, limit, used) == 0 && *limit != GS_UNLIMITED;
}

/* Memory info in both versions: X(name, struct, what else the slice's view sets). The _v2 answer
 * also has the driver's reservation, which is outside the slice. */
#define MEMORY_INFO_HOOKS(X)                                                                      \
    X(nvmlDeviceGetMemoryInfo, nvmlMemory_t, (void)0)                                             \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlMemory_v2_t, mem->reserved = 0)

#define MEMORY_INFO_HOOK(name, T, also)                                                           \
    GS_EXPORT nvmlReturn_t name(nvmlDevice_t device, T *mem)                                      \
    {                                                                                             \
        __typeof__(&name) real = GS_NVML_REAL(name);                                              \
        if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;                                          \
        nvmlReturn_t r = real(device, mem);                                                       \
        char uuid[96];                                                                            \
        uint64_t lim, used;                                                                       \
        if (r != NVML_SUCCESS || !mem || !slice_view(device, uuid, &lim, &used)) return r;        \
        mem->total = lim < mem->total ? lim : mem->total;                                         \
        also;                                                                                     \
        mem->used = used;                                                                         \
        mem->free = mem->total > used ? mem->total - used : 0;                                    \
        return r;                                                                                 \
    }
MEMORY_INFO_HOOKS(MEMORY_INFO_HOOK)

/* ---- process lists: the slice's processes, each with the bytes the slice accounts for it. Which
 * processes those are, and why the region sometimes has to name them itself: nvml_view.h. */
#define MAX_LIST 512
#define NVML_NA 0xFFFFFFFFu
enum { LIST_COMPUTE, LIST_MPS, LIST_GRAPHICS };

/* Whether MPS serves the device (its clients are then listed as MPS processes, and the compute list
 * holds the MPS server, which is not the slice's). */
static int mps_active(nvmlDevice_t device)
{
    static nvmlReturn_t (*f)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
    if (!f) f = (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))gs_real_nvml("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    unsigned n = 0;
    if (!f) return 0;
    nvmlReturn_t r = f(device, &n, NULL);
    return (r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE) && n > 0;
}

/* The picks for NVML's list all[n] of `kind`; returns how many. */
#define VIEW(kind, device, uuid, all, n, picks)                                                   \
    __extension__({                                                                               \
        static __thread uint32_t pids_[MAX_LIST];                                                 \
        struct gs_slice_proc slice_[GS_REGION_MAX_PROCS];                                         \
        int m_ = gs_mem_slice_procs(uuid, slice_, GS_REGION_MAX_PROCS);                           \
        for (unsigned i_ = 0; i_ < (n); i_++) pids_[i_] = (all)[i_].pid;                          \
        int sub_ = (kind) == LIST_MPS || ((kind) == LIST_COMPUTE && !mps_active(device));         \
        gs_nvml_view(pids_, (n), slice_, m_, sub_, (picks), MAX_LIST);                            \
    })

/* Copy the picks into the caller's array in NVML's count protocol. */
#define EMIT(T, all, picks, k, infos, count)                                                      \
    __extension__({                                                                               \
        unsigned cap_ = *(count), kk_ = (k) < MAX_LIST ? (k) : MAX_LIST;                          \
        for (unsigned i_ = 0; i_ < kk_ && (infos) && i_ < cap_; i_++) {                           \
            T e_;                                                                                 \
            memset(&e_, 0, sizeof e_);                                                            \
            if ((picks)[i_].src >= 0) e_ = (all)[(picks)[i_].src];                                \
            else gs_nvml_na_ids(&e_, sizeof e_);                                                  \
            e_.pid = (picks)[i_].pid;                                                             \
            e_.usedGpuMemory = (picks)[i_].bytes;                                                 \
            (infos)[i_] = e_;                                                                     \
        }                                                                                         \
        *(count) = kk_;                                                                           \
        kk_ > cap_ || (kk_ && !(infos)) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;            \
    })

/* A process NVML could not name: no GPU/compute instance ids to report (as NVML for a full GPU). */
static void gs_nvml_na_ids(void *e, size_t size)
{
    if (size >= sizeof(nvmlProcessInfo_t)) {
        ((nvmlProcessInfo_t *)e)->gpuInstanceId = NVML_NA;
        ((nvmlProcessInfo_t *)e)->computeInstanceId = NVML_NA;
    }
}

/* The process lists, each in its three versions: X(name, entry struct, list). */
#define PROC_LIST_HOOKS(X)                                                                        \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, LIST_COMPUTE)                   \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, LIST_COMPUTE)                   \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, LIST_COMPUTE)                   \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, LIST_MPS)                    \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t, LIST_MPS)                    \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, LIST_MPS)                    \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, LIST_GRAPHICS)                 \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t, LIST_GRAPHICS)                 \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, LIST_GRAPHICS)

#define PROC_LIST(name, T, kind)                                                                  \
    GS_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, T *infos)               \
    {                                                                                             \
        __typeof__(&name) real = GS_NVML_REAL(name);                                              \
        if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;                                          \
        char uuid[96];                                                                            \
        uint64_t lim, used;                                                                       \
        if (!count || !slice_view(device, uuid, &lim, &used)) return real(device, count, infos);  \
        static __thread T all[MAX_LIST];                                                          \
        static __thread struct gs_nvml_pick picks[MAX_LIST];                                      \
        unsigned n = MAX_LIST;                                                                    \
        nvmlReturn_t r = real(device, &n, all);                                                   \
        if (r != NVML_SUCCESS) return r;                                                          \
        if (n > MAX_LIST) n = MAX_LIST;                                                           \
        unsigned k = VIEW(kind, device, uuid, all, n, picks);                                     \
        return EMIT(T, all, picks, k, infos, count);                                              \
    }
PROC_LIST_HOOKS(PROC_LIST)

GS_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *list)
{
    __typeof__(&nvmlDeviceGetRunningProcessDetailList) real = GS_NVML_REAL(nvmlDeviceGetRunningProcessDetailList);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    char uuid[96];
    uint64_t lim, used;
    if (!list || !slice_view(device, uuid, &lim, &used)) return real(device, list);
    static __thread nvmlProcessDetail_v1_t all[MAX_LIST];
    static __thread struct gs_nvml_pick picks[MAX_LIST];
    nvmlProcessDetailList_t mine = *list;
    mine.procArray = all;
    mine.numProcArrayEntries = MAX_LIST;
    nvmlReturn_t r = real(device, &mine);
    if (r != NVML_SUCCESS) return r;
    unsigned n = mine.numProcArrayEntries < MAX_LIST ? mine.numProcArrayEntries : MAX_LIST;
    int kind = list->mode == 1 ? LIST_GRAPHICS : list->mode == 2 ? LIST_MPS : LIST_COMPUTE;
    unsigned k = VIEW(kind, device, uuid, all, n, picks);
    unsigned cap = list->numProcArrayEntries, kk = k < MAX_LIST ? k : MAX_LIST;
    for (unsigned i = 0; i < kk && list->procArray && i < cap; i++) {
        nvmlProcessDetail_v1_t e;
        memset(&e, 0, sizeof e);
        if (picks[i].src >= 0) e = all[picks[i].src];
        else e.gpuInstanceId = e.computeInstanceId = NVML_NA;
        e.pid = picks[i].pid;
        e.usedGpuMemory = picks[i].bytes;
        list->procArray[i] = e;
    }
    list->numProcArrayEntries = kk;
    return kk > cap || (kk && !list->procArray) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

const struct gs_hook gs_hooks_nvml[] = {
    GS_HOOK_ENTRY(nvmlDeviceGetRunningProcessDetailList)
    MEMORY_INFO_HOOKS(GS_HOOK_ROW)
    PROC_LIST_HOOKS(GS_HOOK_ROW)
    {0, 0},
};
