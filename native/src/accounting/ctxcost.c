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
 * region file so they do not measure each other's contexts. Other slices on the same device cannot be
 * serialised: NVML's list of compute processes is read before and after too, and the measurement is
 * dropped when any process but this one appeared, ended or changed its memory meanwhile (on the H100,
 * 8 slices starting together measured 5.4 and 7.5 GB for a 523-MiB context before this check, and a
 * 4-GiB slice was full before its first allocation). Where NVML lists no processes (a container that
 * cannot see them) the check has nothing to say and only plausibility guards the value (1 MiB to
 * 8 GiB). The first kept measurement wins (later contexts never change it); a dropped one leaves the
 * built-in default, and the slice's next first context measures again. What a context grows by later
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

/* NVML's compute processes on the device uuid names, into out (at most GS_CTX_PROBE_PROCS); the count,
 * or -1 when NVML cannot say or there are more than fit. */
static int nvml_procs(const char *uuid, struct gs_ctx_proc *out)
{
    static nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    static nvmlReturn_t (*list)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
    if (!list) {
        by_uuid = (nvmlReturn_t(*)(const char *, nvmlDevice_t *))gs_real_nvml("nvmlDeviceGetHandleByUUID");
        list = (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))gs_real_nvml(
            "nvmlDeviceGetComputeRunningProcesses_v3");
    }
    nvmlDevice_t d;
    nvmlProcessInfo_t info[GS_CTX_PROBE_PROCS];
    unsigned n = GS_CTX_PROBE_PROCS;
    if (!by_uuid || !list || uuid[0] == '#' || by_uuid(uuid, &d) != NVML_SUCCESS || list(d, &n, info) != NVML_SUCCESS)
        return -1;
    for (unsigned i = 0; i < n; i++) out[i] = (struct gs_ctx_proc){info[i].pid, info[i].usedGpuMemory};
    return (int)n;
}

static const struct gs_ctx_proc *find_proc(const struct gs_ctx_proc *v, int n, unsigned pid)
{
    for (int i = 0; i < n; i++)
        if (v[i].pid == pid) return &v[i];
    return NULL;
}

/* Whether the free-memory difference is this process's context alone: every process listed before or
 * after but ours is in both lists with the same memory. Ours is this pid when NVML lists it, else the one
 * process new in the list (NVML names host pids, which a pid namespace hides from getpid). */
static int nobody_else_moved(const struct gs_ctx_probe *p, const struct gs_ctx_proc *after, int n_after)
{
    if (p->nprocs < 0 || n_after < 0) return p->nprocs == n_after; /* NVML could not say either time */
    unsigned mine = (unsigned)getpid();
    if (!find_proc(after, n_after, mine)) {
        int fresh = 0;
        for (int i = 0; i < n_after; i++)
            if (!find_proc(p->procs, p->nprocs, after[i].pid)) mine = after[i].pid, fresh++;
        if (fresh > 1) return 0; /* two processes appeared: which one is ours cannot be told */
    }
    for (int i = 0; i < n_after; i++) {
        const struct gs_ctx_proc *b = find_proc(p->procs, p->nprocs, after[i].pid);
        if (after[i].pid != mine && (!b || b->used != after[i].used)) return 0;
    }
    for (int i = 0; i < p->nprocs; i++)
        if (p->procs[i].pid != mine && !find_proc(after, n_after, p->procs[i].pid)) return 0;
    return 1;
}

static int measured(int idx)
{
    return (__atomic_load_n(&gs_shared->flags, __ATOMIC_ACQUIRE) & MEASURED_BIT(idx)) != 0;
}

struct gs_ctx_probe gs_ctx_cost_probe(int ordinal)
{
    struct gs_ctx_probe p = {0, -1, -1, -1, {{0, 0}}};
    if (gs_cfg.context_overhead != GS_UNLIMITED) return p; /* the slice says what a context costs */
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0 || measured(idx)) return p;
    if (gs_cfg.region[0]) {
        p.fd = open(gs_cfg.region, O_RDONLY | O_CLOEXEC);
        if (p.fd >= 0) flock(p.fd, LOCK_EX); /* the slice's other first contexts wait for this one */
    }
    if (!measured(idx)) {
        p.idx = idx;
        p.free_before = nvml_free(gs_shared->devices[idx].uuid); /* initialises NVML first */
        p.nprocs = nvml_procs(gs_shared->devices[idx].uuid, p.procs);
    }
    return p;
}

uint64_t gs_ctx_cost_settle(int ordinal, struct gs_ctx_probe p, uint64_t charged, int created)
{
    if (p.idx >= 0 && created && p.free_before) {
        uint64_t after = nvml_free(gs_shared->devices[p.idx].uuid);
        uint64_t cost = after && after < p.free_before ? p.free_before - after : 0;
        struct gs_ctx_proc now_procs[GS_CTX_PROBE_PROCS];
        int clean = nobody_else_moved(&p, now_procs, nvml_procs(gs_shared->devices[p.idx].uuid, now_procs));
        if (!clean) {
            GS_INFO("context cost not measured on %s: other processes on the device changed their memory "
                    "meanwhile (counting %llu per context until a later context measures it)",
                    gs_shared->devices[p.idx].uuid, (unsigned long long)charged);
        } else if (cost >= MIN_PLAUSIBLE && cost <= MAX_PLAUSIBLE && gs_region_lock(gs_shared) == 0) {
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
