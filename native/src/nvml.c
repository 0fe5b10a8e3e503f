/* NVML hooks: memory info and process lists of a device in the slice show the slice (its limit, its
 * accounted usage, its processes), so nvidia-smi and NVML-based tools inside the slice agree with
 * cuMemGetInfo. Devices outside the slice are reported as the driver says. */
#define _GNU_SOURCE
#include <string.h>

#include "gpuslice/hooks_common.h"

#define GS_NVML_REAL(name) __extension__({                                     \
    static __typeof__(&name) gs_r_;                                            \
    __typeof__(&name) gs_f_ = __atomic_load_n(&gs_r_, __ATOMIC_RELAXED);       \
    if (!gs_f_) {                                                              \
        gs_f_ = (__typeof__(&name))gs_real_nvml(#name);                        \
        __atomic_store_n(&gs_r_, gs_f_, __ATOMIC_RELAXED);                     \
    }                                                                          \
    gs_f_;                                                                     \
})
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

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem)
{
    __typeof__(&nvmlDeviceGetMemoryInfo) real = GS_NVML_REAL(nvmlDeviceGetMemoryInfo);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(device, mem);
    char uuid[96];
    uint64_t lim, used;
    if (r != NVML_SUCCESS || !mem || !slice_view(device, uuid, &lim, &used)) return r;
    mem->total = lim < mem->total ? lim : mem->total;
    mem->used = used;
    mem->free = mem->total > used ? mem->total - used : 0;
    return r;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem)
{
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) real = GS_NVML_REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(device, mem);
    char uuid[96];
    uint64_t lim, used;
    if (r != NVML_SUCCESS || !mem || !slice_view(device, uuid, &lim, &used)) return r;
    mem->total = lim < mem->total ? lim : mem->total;
    mem->reserved = 0; /* the driver's reservation is outside the slice */
    mem->used = used;
    mem->free = mem->total > used ? mem->total - used : 0;
    return r;
}

/* Process lists: keep the slice's processes (as the region knows them) with their accounted usage. */
#define MAX_LIST 512
#define PROC_LIST(name, T)                                                                        \
    GS_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, T *infos)               \
    {                                                                                             \
        __typeof__(&name) real = GS_NVML_REAL(name);                                              \
        if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;                                          \
        char uuid[96];                                                                            \
        uint64_t lim, used;                                                                       \
        if (!count || !slice_view(device, uuid, &lim, &used)) return real(device, count, infos);  \
        static __thread T all[MAX_LIST];                                                          \
        unsigned n = MAX_LIST;                                                                    \
        nvmlReturn_t r = real(device, &n, all);                                                   \
        if (r != NVML_SUCCESS) return r;                                                          \
        unsigned kept = 0;                                                                        \
        for (unsigned i = 0; i < n && i < MAX_LIST; i++) {                                        \
            uint64_t b;                                                                           \
            if (!gs_mem_proc_usage(uuid, all[i].pid, &b)) continue;                               \
            all[i].usedGpuMemory = b;                                                             \
            if (infos && kept < *count) infos[kept] = all[i];                                     \
            kept++;                                                                               \
        }                                                                                         \
        unsigned cap = *count;                                                                    \
        *count = kept;                                                                            \
        return kept > cap || (kept && !infos) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;      \
    }
PROC_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)

GS_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *list)
{
    __typeof__(&nvmlDeviceGetRunningProcessDetailList) real = GS_NVML_REAL(nvmlDeviceGetRunningProcessDetailList);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    char uuid[96];
    uint64_t lim, used;
    if (!list || !slice_view(device, uuid, &lim, &used)) return real(device, list);
    static __thread nvmlProcessDetail_v1_t all[MAX_LIST];
    nvmlProcessDetailList_t mine = *list;
    mine.procArray = all;
    mine.numProcArrayEntries = MAX_LIST;
    nvmlReturn_t r = real(device, &mine);
    if (r != NVML_SUCCESS) return r;
    unsigned kept = 0, cap = list->numProcArrayEntries;
    for (unsigned i = 0; i < mine.numProcArrayEntries && i < MAX_LIST; i++) {
        uint64_t b;
        if (!gs_mem_proc_usage(uuid, all[i].pid, &b)) continue;
        all[i].usedGpuMemory = b;
        if (list->procArray && kept < cap) list->procArray[kept] = all[i];
        kept++;
    }
    list->numProcArrayEntries = kept;
    return kept > cap || (kept && !list->procArray) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

const struct gs_hook gs_hooks_nvml[] = {
    {"nvmlDeviceGetRunningProcessDetailList", (void *)nvmlDeviceGetRunningProcessDetailList},
    {"nvmlDeviceGetMemoryInfo", (void *)nvmlDeviceGetMemoryInfo},
    {"nvmlDeviceGetMemoryInfo_v2", (void *)nvmlDeviceGetMemoryInfo_v2},
    {"nvmlDeviceGetComputeRunningProcesses", (void *)nvmlDeviceGetComputeRunningProcesses},
    {"nvmlDeviceGetComputeRunningProcesses_v2", (void *)nvmlDeviceGetComputeRunningProcesses_v2},
    {"nvmlDeviceGetComputeRunningProcesses_v3", (void *)nvmlDeviceGetComputeRunningProcesses_v3},
    {"nvmlDeviceGetGraphicsRunningProcesses_v3", (void *)nvmlDeviceGetGraphicsRunningProcesses_v3},
    {0, 0},
};
