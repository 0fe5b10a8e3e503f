/* The per-context cost, measured on the card the process runs on: the device memory a CUDA context
 * takes that nobody allocated. Before the first context of a slice on a device is created, NVML's free
 * memory of that device is read (through the real NVML: no context needed); after, again; the difference
 * is the cost, published in the region's device record (context_overhead, and a "measured" bit in the
 * header's flags) for every process of the slice. Every context charges the region's value at creation;
 * once measured, the creating process settles its charge to the measured value, so the books hold what
 * the device holds for contexts, whatever the card, driver or lazy-loading mode.
 *
 * Used only when the slice does not set context_overhead (an explicit value wins). Processes of the
 * slice that create their first context at the same moment are serialised by an advisory lock on the
 * region file so they do not measure each other's contexts; other slices on the same device cannot be
 * serialised, so the value kept is refused when it is not plausible (below 1 MiB or above 8 GiB), and
 * the first plausible measurement wins (later contexts never change it). What a context grows by later
 * (modules loaded lazily at the first launch of their kernels) is not in it: see native/README.md. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/real.h"
#include "gpuslice/state.h"

#define MEASURED_BIT(idx) (1u << (1 + (idx))) /* header flags: bit 0 = initialised */
#define MIN_PLAUSIBLE (1ull << 20)
#define MAX_PLAUSIBLE (8ull << 30)

/* Free bytes of the device NVML names uuid; 0 when NVML cannot say. */
static uint64_t nvml_free(const char *uuid)
{
    static nvmlReturn_t (*init)(void);
    static nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    static nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *);
    static int inited;
    if (!inited) {
        init = (nvmlReturn_t(*)(void))gs_real_nvml("nvmlInit_v2");
        by_uuid = (nvmlReturn_t(*)(const char *, nvmlDevice_t *))gs_real_nvml("nvmlDeviceGetHandleByUUID");
        info = (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))gs_real_nvml("nvmlDeviceGetMemoryInfo");
        inited = init && by_uuid && info && init() == NVML_SUCCESS ? 1 : -1;
    }
    nvmlDevice_t d;
    nvmlMemory_t m;
    if (inited < 0 || uuid[0] == '#' || by_uuid(uuid, &d) != NVML_SUCCESS || info(d, &m) != NVML_SUCCESS) return 0;
    return m.free;
}

static int measured(int idx)
{
    return (__atomic_load_n(&gs_shared->flags, __ATOMIC_ACQUIRE) & MEASURED_BIT(idx)) != 0;
}

struct gs_ctx_probe gs_ctx_cost_probe(int ordinal)
{
    struct gs_ctx_probe p = {0, -1, -1};
    if (gs_cfg.context_overhead != GS_UNLIMITED) return p; /* the slice says what a context costs */
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0 || measured(idx)) return p;
    if (gs_cfg.region[0]) {
        p.fd = open(gs_cfg.region, O_RDONLY | O_CLOEXEC);
        if (p.fd >= 0) flock(p.fd, LOCK_EX); /* the slice's other first contexts wait for this one */
    }
    if (!measured(idx)) {
        p.idx = idx;
        p.free_before = nvml_free(gs_shared->devices[idx].uuid);
    }
    return p;
}

uint64_t gs_ctx_cost_settle(int ordinal, struct gs_ctx_probe p, uint64_t charged, int created)
{
    if (p.idx >= 0 && created && p.free_before) {
        uint64_t after = nvml_free(gs_shared->devices[p.idx].uuid);
        uint64_t cost = after && after < p.free_before ? p.free_before - after : 0;
        if (cost >= MIN_PLAUSIBLE && cost <= MAX_PLAUSIBLE && gs_region_lock(gs_shared) == 0) {
            if (!measured(p.idx)) {
                gs_region_write_begin(gs_shared);
                gs_shared->devices[p.idx].context_overhead = cost;
                __atomic_or_fetch(&gs_shared->flags, MEASURED_BIT(p.idx), __ATOMIC_RELEASE);
                gs_region_write_end(gs_shared);
                GS_INFO("device %s: a CUDA context costs %llu bytes here (measured; counted per context)",
                        gs_shared->devices[p.idx].uuid, (unsigned long long)cost);
            }
            gs_region_unlock(gs_shared);
        } else if (cost) {
            GS_INFO("context cost measured as %llu bytes: not plausible (another process allocated meanwhile?); "
                    "keeping %llu", (unsigned long long)cost, (unsigned long long)charged);
        }
    }
    if (p.fd >= 0) {
        flock(p.fd, LOCK_UN);
        close(p.fd);
    }
    int idx = gs_mem_dev_index(ordinal);
    if (!created || !charged || idx < 0 || !measured(idx)) return charged;
    /* settle this context's charge to the measured value (it was charged the value of the moment) */
    uint64_t now = __atomic_load_n(&gs_shared->devices[idx].context_overhead, __ATOMIC_RELAXED);
    if (now > charged) gs_mem_charge(ordinal, now - charged);
    else if (now < charged) gs_mem_release(ordinal, charged - now);
    return now;
}
