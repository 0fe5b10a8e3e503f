/* Memory accounting (src/accounting/): reserve against the slice's limit in the region before the
 * driver allocates, give back on failure or free; and the per-process table of live allocations
 * (pointer/handle -> size, device) so frees know what to give back. Called by the hooks; calls only
 * start-up's state (state.h), the region, the config and the real driver functions. */
#ifndef GPUSLICE_MEMORY_H
#define GPUSLICE_MEMORY_H
#include <stdint.h>
#include "gpuslice/cuda_types.h"

enum gs_alloc_kind { GS_K_DPTR = 1, GS_K_HANDLE = 2, GS_K_ARRAY = 3, GS_K_MIPMAP = 4, GS_K_CTX = 5 };

/* gs_mem_dev_index's answer when the region could not be locked: accounting is unavailable right
 * now (not cached; the caller follows fail_open). */
#define GS_DEV_UNAVAILABLE (-3)
/* Region device index for a CUDA ordinal (cached), -1 when the device is outside the slice (then its
 * allocations are refused), or GS_DEV_UNAVAILABLE. */
int gs_mem_dev_index(int ordinal);
/* Ordinal of the current context's device, or -1. */
int gs_current_ordinal(void);

/* gs_mem_reserve's answer when accounting itself failed and the slice says fail_open=1: call the
 * driver, but do not track (nothing was counted). */
#define GS_PASS_UNCOUNTED (-1)

/* Reserve bytes on ordinal. CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY past the limit (after
 * reclaiming dead processes once; counts the refusal; applies oom_policy=kill). */
CUresult gs_mem_reserve(int ordinal, uint64_t bytes, const char *what);
/* The same, but a refusal is only an answer: not counted, not logged, no oom_policy=kill; for callers
 * that can make room and retry (a pool trimmed of its cache). */
CUresult gs_mem_try_reserve(int ordinal, uint64_t bytes, const char *what);
/* Count, log and apply oom_policy to a refusal the caller decided; returns CUDA_ERROR_OUT_OF_MEMORY. */
CUresult gs_mem_refused(int ordinal, uint64_t bytes, const char *what);
/* Count bytes the driver already holds (a pool grew past what was reserved), even past the limit:
 * the books must say what the device holds; the caller then refuses or undoes. */
void gs_mem_charge(int ordinal, uint64_t bytes);
void gs_mem_release(int ordinal, uint64_t bytes);
/* Context accounting: adds the device's per-context cost as the region holds it now (configured, measured,
 * or the built-in default) and counts the context; *charged = the bytes counted (give them back with
 * gs_mem_ctx_remove, whatever the region says by then). */
CUresult gs_mem_ctx_add(int ordinal, uint64_t *charged);
void gs_mem_ctx_remove(int ordinal, uint64_t charged);

/* The per-context cost measured on the card (src/accounting/ctxcost.c). probe before creating a context
 * (free device memory by NVML, and the slice's measuring lock, when the device is not measured yet);
 * settle after (created: whether the context now exists): publishes a plausible measurement in the region
 * and returns what the context is charged now (the charge settled to the measured value). */
#define GS_CTX_PROBE_PROCS 32
struct gs_ctx_proc {
    unsigned pid;
    unsigned long long used;
};
struct gs_ctx_probe {
    uint64_t free_before; /* 0: nothing to measure */
    int fd;               /* the region file, flock'ed while measuring; -1 none */
    int idx;              /* region device being measured; -1 none */
    /* NVML's compute processes on the device before (-1: not known): a measurement is kept only when
     * none of them but this process changed meanwhile (another slice's context or allocation would be
     * in the free-memory difference) */
    int nprocs;
    struct gs_ctx_proc procs[GS_CTX_PROBE_PROCS];
};
struct gs_ctx_probe gs_ctx_cost_probe(int ordinal);
uint64_t gs_ctx_cost_settle(int ordinal, struct gs_ctx_probe probe, uint64_t charged, int created);

/* Live allocations of this process (src/accounting/track.c). */
void gs_track_add(int kind, uint64_t key, int ordinal, uint64_t bytes);
/* 1 and fills ordinal/bytes if found (and removes it), else 0. */
int gs_track_take(int kind, uint64_t key, int *ordinal, uint64_t *bytes);
/* Forget (and give back) every allocation made in context ctx: the driver freed them with it. */
void gs_track_drop_ctx(void *ctx);

/* Limit (min of the slice's and this process's) and slice usage for ordinal (used includes
 * contexts). 0 on success, -1 if not in slice. */
int gs_mem_query(int ordinal, uint64_t *limit, uint64_t *used);
int gs_mem_query_uuid(const char *uuid, uint64_t *limit, uint64_t *used);
/* Pid -> bytes this slice accounts for that process on the region device of uuid; 0 if not ours. */
int gs_mem_proc_usage(const char *uuid, uint32_t pid, uint64_t *bytes);
/* The slice's live processes holding memory or a context on uuid's device (pids as the region
 * records them, i.e. in the slice's own pid namespace). Returns how many were written. */
struct gs_slice_proc {
    uint32_t pid;
    uint64_t bytes;
};
int gs_mem_slice_procs(const char *uuid, struct gs_slice_proc *out, int max);

/* oom_policy=wait (src/accounting/oomwait.c): after the driver refused an allocation the slice had room
 * for (the device is full), sleep until the device's free memory could hold `bytes` (1: try again) or the
 * slice's oom_wait_ms passed (0: fail as before; also 0 at once under another policy). Call
 * gs_mem_wait_end once done, whatever the outcome. */
struct gs_oom_wait {
    int64_t deadline_ns, sleep_ns;
    uint64_t bytes;
    int slot, started;
};
#define GS_OOM_WAIT_INIT {0, 0, 0, -1, 0}
int gs_mem_device_full_wait(int ordinal, uint64_t bytes, struct gs_oom_wait *w);
void gs_mem_wait_end(struct gs_oom_wait *w);

/* Who can give memory back before a refusal is final: a refused reservation calls `fn(ordinal)`
 * (it returns the bytes that left the slice's books) and tries once more. The stream-ordered pools
 * (src/hooks/cuda_pool.c) register their trim when they first track a pool; accounting knows no
 * pool, so it never calls up into the hooks. */
void gs_mem_set_make_room(uint64_t (*fn)(int ordinal));
/* Format a CUuuid as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
void gs_format_uuid(const CUuuid *u, char out[64]);
#endif
