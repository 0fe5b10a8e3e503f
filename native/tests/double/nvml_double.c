/* A tiny CPU double of NVML (libnvidia-ml.so.1) for the native tests: the devices of
 * double_common.h (GSDOUBLE_MIG=1: their UUIDs spelled MIG-..., as NVML names MIG instances);
 * memory info reports GSDOUBLE_NVML_USED bytes used (default 1 GiB) plus what the CUDA double's live
 * contexts take (GSDOUBLE_CTX_BYTES each, default 0: gsdouble_ctx_bytes); the compute process list is
 * GSDOUBLE_NVML_PIDS ("pid:bytes,pid:bytes", default: none; GSDOUBLE_NVML_PIDS_WITH_CTX instead while a
 * context of the CUDA double is live, when set), the MPS compute list
 * GSDOUBLE_NVML_MPS_PIDS, the graphics list GSDOUBLE_NVML_GFX_PIDS (every version of each). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "../../include/gpuslice/cuda_types.h"
#include "double_common.h"

#define EXPORT __attribute__((visibility("default")))
static int g_ids[8];

EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = (unsigned)dbl_device_count(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d)
{
    if ((int)i >= dbl_device_count()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    g_ids[i] = (int)i;
    *d = (nvmlDevice_t)&g_ids[i];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned len)
{
    char u[64];
    dbl_uuid_string(*(int *)d, u);
    if (getenv("GSDOUBLE_MIG")) memcpy(u, "MIG-", 4);
    if (strlen(u) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, u);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    for (int i = 0; i < dbl_device_count(); i++) {
        char u[64];
        dbl_uuid_string(i, u);
        if (!strcmp(u + 4, uuid + (strncmp(uuid, "GPU-", 4) && strncmp(uuid, "MIG-", 4) ? 0 : 4))) {
            g_ids[i] = i;
            *d = (nvmlDevice_t)&g_ids[i];
            return NVML_SUCCESS;
        }
    }
    return 6; /* NVML_ERROR_NOT_FOUND */
}
static unsigned long long used_on(nvmlDevice_t d)
{
    const char *e = getenv("GSDOUBLE_NVML_USED");
    unsigned long long (*ctx)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "gsdouble_ctx_bytes");
    return (e ? strtoull(e, NULL, 10) : 1ull << 30) + (ctx && d ? ctx(*(int *)d) : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    (void)d;
    m->total = dbl_total();
    m->used = used_on(d);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    (void)d;
    m->total = dbl_total();
    m->reserved = 300ull << 20;
    m->used = used_on(d);
    m->free = m->total - m->used - m->reserved;
    return NVML_SUCCESS;
}
/* The list in var, or in var_WITH_CTX (when set) while the CUDA double has a live context on d: a test
 * makes other processes appear or grow while a context is created. */
static const char *procs_env(const char *var, nvmlDevice_t d)
{
    char with[64];
    snprintf(with, sizeof with, "%s_WITH_CTX", var);
    unsigned long long (*ctx)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "gsdouble_ctx_bytes");
    const char *w = getenv(with);
    return w && ctx && d && ctx(*(int *)d) ? w : getenv(var);
}
#define PROCS(name, T, var)                                                    \
    EXPORT nvmlReturn_t name(nvmlDevice_t d, unsigned *count, T *infos)        \
    {                                                                          \
        (void)d;                                                               \
        const char *e = procs_env(var, d);                                     \
        unsigned n = 0, cap = *count;                                          \
        while (e && *e) {                                                      \
            char *end;                                                         \
            unsigned pid = (unsigned)strtoul(e, &end, 10);                     \
            unsigned long long b = *end == ':' ? strtoull(end + 1, &end, 10) : 0; \
            if (infos && n < cap) {                                            \
                memset(&infos[n], 0, sizeof infos[n]);                         \
                infos[n].pid = pid;                                            \
                infos[n].usedGpuMemory = b;                                    \
            }                                                                  \
            n++;                                                               \
            e = *end == ',' ? end + 1 : end;                                   \
            if (*e && *e != ',' && (*e < '0' || *e > '9')) break;              \
        }                                                                      \
        *count = n;                                                            \
        return n > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;          \
    }
PROCS(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, "GSDOUBLE_NVML_PIDS")
PROCS(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t, "GSDOUBLE_NVML_PIDS")
PROCS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, "GSDOUBLE_NVML_PIDS")
PROCS(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, "GSDOUBLE_NVML_MPS_PIDS")
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t, "GSDOUBLE_NVML_MPS_PIDS")
PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, "GSDOUBLE_NVML_MPS_PIDS")
PROCS(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, "GSDOUBLE_NVML_GFX_PIDS")
PROCS(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t, "GSDOUBLE_NVML_GFX_PIDS")
PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, "GSDOUBLE_NVML_GFX_PIDS")

/* The same lists through the detail API (driver 535+; mode 0 compute, 1 graphics, 2 MPS). */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, nvmlProcessDetailList_t *l)
{
    nvmlProcessInfo_t tmp[64];
    unsigned n = 64;
    nvmlReturn_t r = l->mode == 1 ? nvmlDeviceGetGraphicsRunningProcesses_v3(d, &n, tmp)
                   : l->mode == 2 ? nvmlDeviceGetMPSComputeRunningProcesses_v3(d, &n, tmp)
                                  : nvmlDeviceGetComputeRunningProcesses_v3(d, &n, tmp);
    if (r) return r;
    unsigned cap = l->numProcArrayEntries;
    for (unsigned i = 0; i < n && l->procArray && i < cap; i++) {
        memset(&l->procArray[i], 0, sizeof l->procArray[i]);
        l->procArray[i].pid = tmp[i].pid;
        l->procArray[i].usedGpuMemory = tmp[i].usedGpuMemory;
    }
    l->numProcArrayEntries = n;
    return n > cap || !l->procArray ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
