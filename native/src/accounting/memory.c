/* Memory accounting against the slice's region: the device index of a CUDA ordinal, reserve and
 * release against the limit, and the queries that show the slice.
 *
 * Reserve-then-allocate: the bytes are added to the region under its lock *before* the driver is
 * asked, and given back if the driver fails. Two threads or processes can therefore never both pass
 * the check for the last free bytes, which is what makes "0 bytes over the limit" hold.
 *
 * Limits: the region's device record holds the SLICE's limit (from the slice file, or HAMi's env),
 * shared by every process of the slice and read under the lock at every reservation. A process's
 * GPUSLICE_MEMORY_LIMIT only lowers what that process may bring the slice to (gs_cfg.process_limit);
 * it never reaches the region. A slice file can lower an existing region's limit (a shrunk slice
 * takes effect for all its processes at their next allocation); it raises it only with a higher
 * generation= than the region records (a live resize, src/core/reload.c): a process started from an
 * older, larger file can never undo a shrink.
 *
 * Calls down only (start-up's state, region, config, the real driver): a refusal asks the
 * registered make-room callback (the pools' trim) rather than any hook file by name. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuslice/fork.h"
#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/real.h"
#include "gpuslice/reload.h"
#include "gpuslice/state.h"

#define MAX_ORD 64

/* Bytes the driver takes per CUDA context on top of the program's allocations, used when the slice
 * does not set context_overhead and until the card's own cost is measured (src/accounting/ctxcost.c).
 * Measured on an H100 80GB, driver 580.159, CUDA 13 (lazy module
 * loading): a bare driver context 518 MiB; PyTorch 2.11 after its first matmul 676 MiB beyond what
 * its allocator holds; real minus accounted in the fill tests up to 512 + 168 MiB (cudaMallocAsync).
 * 680 MiB covers every case measured (bench/results/2026-11-22-h100-memory.txt). Programs that
 * load much more kernel code should set context_overhead= in the slice. */
#define GS_DEFAULT_CONTEXT_OVERHEAD (680ull << 20)

/* Region device index of each CUDA ordinal, kept + 2 so that the zero every process starts with
 * means "not looked up yet" (1: outside the slice). It needs no set-up, so start-up never calls in
 * here. */
static int g_devidx[MAX_ORD];
#define DEVIDX_UNKNOWN 0
#define DEVIDX_KEEP(idx) ((idx) + 2)
#define DEVIDX_OF(kept) ((kept) - 2)
static pthread_mutex_t g_devidx_lock = PTHREAD_MUTEX_INITIALIZER;

/* What this process knows without trusting the region. The region is writable by every process of
 * the slice (in Kubernetes: by the container; the slice file is mounted read-only), so a program
 * could rewrite its limit or zero its usage. Each process therefore also holds itself to the slice
 * file's limit (g_file_limit, remembered when it first uses the device) and counts its own bytes
 * (g_own): rewriting the region can hide other processes' usage, never let one process pass the
 * limit the slice file sets. */
static uint64_t g_file_limit[GS_REGION_MAX_DEVICES];
static int g_file_limit_known[GS_REGION_MAX_DEVICES];
static uint64_t g_own[GS_REGION_MAX_DEVICES];

/* ------------------------------------------------------------------ devices */
void gs_format_uuid(const CUuuid *u, char out[64])
{
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    memcpy(p, "GPU-", 4);
    p += 4;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        *p++ = hex[(unsigned char)u->bytes[i] >> 4];
        *p++ = hex[(unsigned char)u->bytes[i] & 15];
    }
    *p = 0;
}

int gs_current_ordinal(void)
{
    static CUresult (*get)(CUdevice *);
    if (!get) get = (CUresult(*)(CUdevice *))gs_real("cuCtxGetDevice");
    CUdevice d = -1;
    if (!get || get(&d) != CUDA_SUCCESS) return -1;
    return d;
}

static uint64_t context_overhead(void)
{
    return gs_cfg.context_overhead == GS_UNLIMITED ? GS_DEFAULT_CONTEXT_OVERHEAD : gs_cfg.context_overhead;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The slice file's limit for region device idx (GS_UNLIMITED when this process has not used it and
 * the file does not name it). */
static uint64_t file_limit(int idx)
{
    if (__atomic_load_n(&g_file_limit_known[idx], __ATOMIC_ACQUIRE)) return g_file_limit[idx];
    int found = 0;
    uint64_t l = gs_cfg.device_count ? gs_config_limit_for_uuid(&gs_cfg, gs_shared->devices[idx].uuid, &found) : 0;
    return found ? l : GS_UNLIMITED;
}

/* The limit this process holds the slice to on region device idx (caller may hold the lock). */
static uint64_t effective_limit(int idx)
{
    uint64_t region = __atomic_load_n(&gs_shared->devices[idx].limit, __ATOMIC_RELAXED);
    return min_u64(min_u64(region, file_limit(idx)), gs_cfg.process_limit);
}

/* The name, slice limit and compute share of a CUDA ordinal from the configuration; 0, or -1 when
 * the slice lists devices and this is not one of them. */
static int configured_device(int ordinal, char name[64], uint64_t *limit, uint32_t *compute)
{
    CUuuid u;
    CUresult (*getuuid)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))gs_real("cuDeviceGetUuid_v2");
    if (!getuuid) getuuid = (CUresult(*)(CUuuid *, CUdevice))gs_real("cuDeviceGetUuid");
    if (getuuid && getuuid(&u, ordinal) == CUDA_SUCCESS) gs_format_uuid(&u, name);
    else snprintf(name, 64, "#%d", ordinal);
    *compute = (uint32_t)gs_cfg.compute;
    if (gs_cfg.device_count > 0) {
        /* By hex part: CUDA prints a MIG instance as GPU-<hex>, the slice lists it as MIG-<hex>. The
         * region keeps the slice's spelling, the one the node and NVML use. */
        int i = gs_config_device_index(&gs_cfg, name);
        if (i < 0) {
            GS_ERROR("device %d (%s) is not in this slice (devices=%s...); its allocations are refused",
                     ordinal, name, gs_cfg.devices[0]);
            return -1;
        }
        snprintf(name, 64, "%s", gs_cfg.devices[i]);
        *limit = gs_cfg.device_limit[i];
        return 0;
    }
    *limit = ordinal < GS_MAX_DEVICES ? gs_cfg.device_limit[ordinal] : gs_cfg.memory_limit;
    if (ordinal < GS_MAX_DEVICES && gs_cfg.compute_per_ordinal[ordinal] >= 0)
        *compute = (uint32_t)gs_cfg.compute_per_ordinal[ordinal];
    return 0;
}

int gs_mem_dev_index(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_ORD) return -1;
    int kept = __atomic_load_n(&g_devidx[ordinal], __ATOMIC_ACQUIRE);
    if (kept != DEVIDX_UNKNOWN) return DEVIDX_OF(kept);
    pthread_mutex_lock(&g_devidx_lock);
    kept = g_devidx[ordinal];
    if (kept != DEVIDX_UNKNOWN) {
        pthread_mutex_unlock(&g_devidx_lock);
        return DEVIDX_OF(kept);
    }
    char name[64];
    uint64_t limit;
    uint32_t compute;
    if (configured_device(ordinal, name, &limit, &compute)) {
        __atomic_store_n(&g_devidx[ordinal], DEVIDX_KEEP(-1), __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_devidx_lock);
        return -1;
    }
    if (gs_region_lock(gs_shared)) {
        /* Our own failure, not the slice's answer: nothing is cached (the next call tries again) and
         * the caller applies fail_open. gs_region_lock has logged the reason. */
        pthread_mutex_unlock(&g_devidx_lock);
        return GS_DEV_UNAVAILABLE;
    }
    uint64_t before = 0;
    int idx = gs_region_device_index(gs_shared, name, limit, context_overhead(), compute, &before);
    if (idx >= 0 && gs_region_set_limit(gs_shared, idx, limit, __atomic_load_n(&gs_cfg.generation, __ATOMIC_ACQUIRE)))
        GS_INFO("device %s: slice file generation %u sets the slice's limit to %llu bytes", name, gs_cfg.generation,
                (unsigned long long)limit);
    gs_region_unlock(gs_shared);
    if (idx < 0) GS_ERROR("region %s: no room for device %s (max %d devices)", gs_cfg.region, name, GS_REGION_MAX_DEVICES);
    else if (before)
        GS_INFO("device %s: this slice file lowers the slice's limit from %llu to %llu bytes", name,
                (unsigned long long)before, (unsigned long long)limit);
    else if (gs_shared->devices[idx].limit < limit)
        GS_INFO("device %s: the region holds the slice to %llu bytes, below this slice file's %llu (a larger "
                "limit needs a newer generation= or a fresh region)", name, (unsigned long long)gs_shared->devices[idx].limit,
                (unsigned long long)limit);
    if (idx >= 0) {
        g_file_limit[idx] = limit;
        __atomic_store_n(&g_file_limit_known[idx], 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&g_devidx[ordinal], DEVIDX_KEEP(idx), __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_devidx_lock);
    return idx;
}

/* ------------------------------------------------------------------ live resize */
/* The slice file's limit for region device idx of CUDA ordinal ord, from gs_cfg as it is now. */
static uint64_t configured_limit(int ord, int idx)
{
    if (gs_cfg.device_count > 0) {
        int i = gs_config_device_index(&gs_cfg, gs_shared->devices[idx].uuid);
        return i >= 0 ? __atomic_load_n(&gs_cfg.device_limit[i], __ATOMIC_RELAXED) : 0;
    }
    return ord < GS_MAX_DEVICES ? __atomic_load_n(&gs_cfg.device_limit[ord], __ATOMIC_RELAXED)
                                : __atomic_load_n(&gs_cfg.memory_limit, __ATOMIC_RELAXED);
}

static unsigned g_applied_epoch;

/* Follow the slice file (src/core/reload.c): when it was taken over anew, hold this process to its
 * limits and set them in the region (raised only by a newer generation: gs_region_set_limit). */
static void follow_slice_file(void)
{
    unsigned epoch = gs_reload_poll();
    if (epoch == __atomic_load_n(&g_applied_epoch, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&g_devidx_lock);
    int locked = gs_region_lock(gs_shared) == 0;
    uint32_t gen = __atomic_load_n(&gs_cfg.generation, __ATOMIC_ACQUIRE);
    for (int ord = 0; ord < MAX_ORD; ord++) {
        int kept = g_devidx[ord];
        if (kept == DEVIDX_UNKNOWN || DEVIDX_OF(kept) < 0) continue;
        int idx = DEVIDX_OF(kept);
        uint64_t limit = configured_limit(ord, idx);
        __atomic_store_n(&g_file_limit[idx], limit, __ATOMIC_RELEASE);
        if (locked && gs_region_set_limit(gs_shared, idx, limit, gen))
            GS_INFO("device %s: resized to %llu bytes (slice file generation %u)", gs_shared->devices[idx].uuid,
                    (unsigned long long)limit, gen);
    }
    if (locked) {
        gs_region_unlock(gs_shared);
        __atomic_store_n(&g_applied_epoch, epoch, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_devidx_lock);
}

/* ------------------------------------------------------------------ accounting */
static CUresult refuse_own_failure(const char *what, const char *why)
{
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        GS_ERROR("%s: accounting unavailable (%s)%s", what, why,
                 gs_cfg.fail_open ? "; fail_open=1: letting calls through unlimited" : "; refusing");
    return gs_cfg.fail_open ? GS_PASS_UNCOUNTED : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Frameworks retry and probe on OOM: log the first refusals, then only every power of two, so an
 * application hammering the limit cannot flood its own stderr. Counts in *counter; *n = this one. */
static int worth_logging(unsigned long *counter, unsigned long *n)
{
    *n = __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    return *n <= 4 || (*n & (*n - 1)) == 0;
}

CUresult gs_mem_refused(int ordinal, uint64_t bytes, const char *what)
{
    int idx = gs_mem_dev_index(ordinal);
    uint64_t used = 0, limit = 0;
    const char *uuid = "?";
    int slot = gs_attach_slot();
    if (idx >= 0 && slot >= 0 && gs_region_lock(gs_shared) == 0) {
        struct gs_region *r = gs_shared;
        gs_region_write_begin(r);
        r->devices[idx].oom_refusals++;
        r->procs[slot].oom_refusals++;
        gs_region_write_end(r);
        used = r->devices[idx].used;
        limit = effective_limit(idx);
        uuid = r->devices[idx].uuid;
        gs_region_unlock(r);
    }
    static unsigned long refusals;
    unsigned long n;
    if (worth_logging(&refusals, &n))
        GS_WARN("%s of %llu bytes on device %d (%s) refused: the slice uses %llu of its %llu-byte limit "
                "(refusal %lu in this process)", what, (unsigned long long)bytes, ordinal, uuid,
                (unsigned long long)used, (unsigned long long)limit, n);
    if (gs_cfg.oom_policy == GS_OOM_KILL) {
        GS_ERROR("oom_policy=kill: killing process %d after a refused allocation", (int)getpid());
        kill(getpid(), SIGKILL);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Add bytes to this process and device under the lock (caller holds it). */
static void add_locked(struct gs_region *r, int slot, int idx, uint64_t bytes, int ctx_delta)
{
    struct gs_region_device *d = &r->devices[idx];
    struct gs_region_proc *p = &r->procs[slot];
    g_own[idx] += bytes; /* under the region lock, like every other change of it */
    gs_region_write_begin(r);
    p->used[idx] += bytes;
    if (p->used[idx] > p->peak[idx]) p->peak[idx] = p->used[idx];
    if (ctx_delta) p->contexts[idx] += (uint32_t)ctx_delta;
    d->used += bytes;
    if (d->used > d->peak) d->peak = d->used;
    gs_region_write_end(r);
}

enum { RES_TRY = 1, RES_FORCE = 2 };

/* Memory the driver took before anyone could ask (graph memory backed at a graph's upload or first run) took the
 * slice past its limit: the books say so and its later allocations are refused; the node agent's backstop reports
 * a slice that stays over its limit in NVML's count, and ends it under its kill policy. Said in the log,
 * rate-limited. */
static void forced_past_limit(int ordinal, uint64_t used, uint64_t limit, const char *what)
{
    static unsigned long times;
    unsigned long n;
    if (worth_logging(&times, &n))
        GS_WARN("%s: the driver already holds memory that takes device %d past the slice's limit (%llu MiB of %llu "
                "MiB); further allocations are refused (%lu times in this process)",
                what, ordinal, (unsigned long long)(used >> 20), (unsigned long long)(limit >> 20), n);
}

/* Reserve bytes on region device idx. RES_TRY: a refusal is only an answer (no count, no log, no
 * kill: the caller can make room and come back). RES_FORCE: count them even past the limit (the
 * driver already holds them; the books must say so). */
static CUresult reserve_idx(int ordinal, int idx, uint64_t bytes, int ctx_delta, int flags, const char *what)
{
    int slot = gs_attach_slot();
    if (slot < 0) return refuse_own_failure(what, "no process record in the region");
    struct gs_region *r = gs_shared;
    if (gs_region_lock(r)) return refuse_own_failure(what, "region lock failed");
    uint64_t limit = effective_limit(idx);
    for (int attempt = 0; attempt < 2; attempt++) {
        /* the slice's usage as the region says, but never less than this process's own */
        uint64_t used = r->devices[idx].used > g_own[idx] ? r->devices[idx].used : g_own[idx];
        if ((flags & RES_FORCE) || (bytes <= limit && used <= limit - bytes)) {
            int over = (flags & RES_FORCE) && (bytes > limit || used > limit - bytes);
            add_locked(r, slot, idx, bytes, ctx_delta);
            gs_region_unlock(r);
            if (over) forced_past_limit(ordinal, used + bytes, limit, what);
            return CUDA_SUCCESS;
        }
        /* Before refusing, give back what dead processes of the slice still hold. */
        if (attempt == 0 && gs_region_reclaim_dead(r) == 0) break;
    }
    gs_region_unlock(r);
    return (flags & RES_TRY) ? CUDA_ERROR_OUT_OF_MEMORY : gs_mem_refused(ordinal, bytes, what);
}

static CUresult outside_slice(int ordinal, const char *what)
{
    static unsigned long refusals; /* frameworks probe every device */
    unsigned long n;
    if (worth_logging(&refusals, &n))
        GS_WARN("%s on device %d refused: that device is not part of this slice (refusal %lu in this process)", what,
                ordinal, n);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static uint64_t (*g_make_room)(int ordinal); /* gs_mem_set_make_room; NULL: nothing to trim */

void gs_mem_set_make_room(uint64_t (*fn)(int ordinal))
{
    __atomic_store_n(&g_make_room, fn, __ATOMIC_RELEASE);
}

static CUresult reserve(int ordinal, uint64_t bytes, int ctx, int flags, const char *what)
{
    follow_slice_file();
    int idx = gs_mem_dev_index(ordinal);
    if (idx == GS_DEV_UNAVAILABLE) return refuse_own_failure(what, "region lock failed");
    if (idx < 0) return outside_slice(ordinal, what);
    if (flags & (RES_TRY | RES_FORCE)) return reserve_idx(ordinal, idx, bytes, ctx, flags, what);
    /* A refusal is final only after this process's stream-ordered pools have given their cache back
     * (their cached memory is counted, and is real, but nobody uses it). */
    CUresult r = reserve_idx(ordinal, idx, bytes, ctx, RES_TRY, what);
    if (r != CUDA_ERROR_OUT_OF_MEMORY) return r;
    uint64_t (*make_room)(int) = __atomic_load_n(&g_make_room, __ATOMIC_ACQUIRE);
    if (make_room) make_room(ordinal);
    return reserve_idx(ordinal, idx, bytes, ctx, 0, what);
}

CUresult gs_mem_reserve(int ordinal, uint64_t bytes, const char *what)
{
    return reserve(ordinal, bytes, 0, 0, what);
}

CUresult gs_mem_try_reserve(int ordinal, uint64_t bytes, const char *what)
{
    return reserve(ordinal, bytes, 0, RES_TRY, what);
}

void gs_mem_charge(int ordinal, uint64_t bytes)
{
    if (bytes) reserve(ordinal, bytes, 0, RES_FORCE, "accounting");
}

static void release_idx(int idx, uint64_t bytes, int ctx_delta)
{
    int slot = gs_attach_slot();
    if (slot < 0 || gs_region_lock(gs_shared)) return;
    struct gs_region *r = gs_shared;
    struct gs_region_proc *p = &r->procs[slot];
    struct gs_region_device *d = &r->devices[idx];
    gs_region_write_begin(r);
    uint64_t b = bytes <= p->used[idx] ? bytes : p->used[idx];
    g_own[idx] -= bytes <= g_own[idx] ? bytes : g_own[idx];
    p->used[idx] -= b;
    d->used = d->used >= b ? d->used - b : 0;
    if (ctx_delta && p->contexts[idx]) p->contexts[idx]--;
    gs_region_write_end(r);
    gs_region_unlock(r);
}

void gs_mem_release(int ordinal, uint64_t bytes)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx >= 0 && bytes) release_idx(idx, bytes, 0);
}

CUresult gs_mem_ctx_add(int ordinal, uint64_t *charged)
{
    int idx = gs_mem_dev_index(ordinal);
    uint64_t bytes = idx >= 0 ? __atomic_load_n(&gs_shared->devices[idx].context_overhead, __ATOMIC_RELAXED) : 0;
    CUresult r = reserve(ordinal, bytes, 1, 0, "context creation");
    *charged = r == CUDA_SUCCESS ? bytes : 0;
    return r;
}

void gs_mem_ctx_remove(int ordinal, uint64_t charged)
{
    int idx = gs_mem_dev_index(ordinal);
    if (idx >= 0) release_idx(idx, charged, 1);
}

/* ------------------------------------------------------------------ queries */
int gs_mem_query(int ordinal, uint64_t *limit, uint64_t *used)
{
    follow_slice_file();
    int idx = gs_mem_dev_index(ordinal);
    if (idx < 0) return -1;
    *limit = effective_limit(idx);
    *used = __atomic_load_n(&gs_shared->devices[idx].used, __ATOMIC_RELAXED);
    return 0;
}

/* Region device record of uuid (by hex part: NVML says MIG-..., CUDA GPU-...), or -1. */
static int region_index_of(const char *uuid)
{
    struct gs_region *r = gs_shared;
    uint32_t n = __atomic_load_n(&r->device_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_MAX_DEVICES; i++)
        if (gs_uuid_same(r->devices[i].uuid, uuid)) return (int)i;
    return -1;
}

int gs_mem_query_uuid(const char *uuid, uint64_t *limit, uint64_t *used)
{
    follow_slice_file();
    int i = region_index_of(uuid);
    if (i >= 0) {
        *limit = effective_limit(i);
        *used = __atomic_load_n(&gs_shared->devices[i].used, __ATOMIC_RELAXED);
        return 0;
    }
    /* Not yet in the region (no process of the slice touched it): still show the slice's limit. */
    int found = 0;
    uint64_t lim = gs_cfg.device_count ? gs_config_limit_for_uuid(&gs_cfg, uuid, &found) : GS_UNLIMITED;
    if (!found) return -1;
    *limit = min_u64(lim, gs_cfg.process_limit);
    *used = 0;
    return 0;
}

int gs_mem_proc_usage(const char *uuid, uint32_t pid, uint64_t *bytes)
{
    struct gs_region *r = gs_shared;
    int i = region_index_of(uuid);
    if (i < 0) return 0;
    for (int p = 0; p < GS_REGION_MAX_PROCS; p++)
        if (r->procs[p].state == 1 && (uint32_t)r->procs[p].pid == pid) {
            *bytes = r->procs[p].used[i];
            return 1;
        }
    return 0;
}

int gs_mem_slice_procs(const char *uuid, struct gs_slice_proc *out, int max)
{
    struct gs_region *r = gs_shared;
    int i = region_index_of(uuid), n = 0;
    if (i < 0) return 0;
    for (int p = 0; p < GS_REGION_MAX_PROCS && n < max; p++) {
        const struct gs_region_proc *pr = &r->procs[p];
        if (pr->state != 1 || pr->pid <= 0 || (!pr->used[i] && !pr->contexts[i])) continue;
        out[n].pid = (uint32_t)pr->pid;
        out[n].bytes = pr->used[i];
        n++;
    }
    return n;
}

/* The child of a fork: re-create the lock in case another thread of the parent held it; the child
 * is a new process record holding nothing yet. (The cached device indices stay valid: same region.) */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_devidx_lock = fresh;
    memset(g_own, 0, sizeof g_own);
}
GS_ON_FORK_CHILD(after_fork_child);
