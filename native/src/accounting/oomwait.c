/* oom_policy=wait: an allocation the slice has room for (its reservation passed the limit) that the
 * driver still refuses with CUDA_ERROR_OUT_OF_MEMORY -- the *device* is full: other slices' limits add up
 * to more than the card (memory_scaling > 1), or processes outside gpuslice hold memory -- waits for the
 * device to have room, up to the slice's oom_wait_ms, then fails as before. An allocation past the slice's
 * limit is refused at once whatever the policy (gs_mem_reserve).
 *
 * No busy loop: the waiting thread sleeps, 1 ms at first, doubling to 50 ms, and between sleeps asks the
 * driver only for the device's free memory (cuMemGetInfo of the current context); the allocation is tried
 * again once that could hold it. The slice keeps its reservation meanwhile (the bytes fit its limit).
 * The waiting is visible: each process record counts its allocations waiting now, the bytes they wait
 * for, every wait started and every wait that timed out (region.h: spare[0..3], written with atomic adds
 * outside the lock, like the pacer's counters) -- ps and the metrics sum them per slice.
 * What it is not: memory is never moved to the host (no oversubscription by spilling); a device that stays
 * full fails the allocation after the timeout, exactly as without the policy. */
#define _GNU_SOURCE
#include <time.h>

#include "gpuslice/clock.h"
#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/real.h"
#include "gpuslice/state.h"

#define FIRST_SLEEP_NS 1000000ll
#define MAX_SLEEP_NS 50000000ll

enum { W_NOW = 0, W_TOTAL = 1, W_TIMEOUTS = 2, W_BYTES = 3 }; /* gs_region_proc.spare[] */

static void count(struct gs_oom_wait *w, int field, int64_t delta)
{
    if (w->slot >= 0) __atomic_add_fetch(&gs_shared->procs[w->slot].spare[field], (uint64_t)delta, __ATOMIC_RELAXED);
}

/* The device's free memory as the driver sees it (the current context's device); UINT64_MAX if unknown. */
static uint64_t device_free(void)
{
    static CUresult (*info)(size_t *, size_t *);
    if (!info) info = (CUresult(*)(size_t *, size_t *))gs_real("cuMemGetInfo_v2");
    size_t f = 0, t = 0;
    return info && info(&f, &t) == CUDA_SUCCESS ? f : UINT64_MAX;
}

int gs_mem_device_full_wait(int ordinal, uint64_t bytes, struct gs_oom_wait *w)
{
    if (__atomic_load_n(&gs_cfg.oom_policy, __ATOMIC_RELAXED) != GS_OOM_WAIT) return 0;
    int64_t now = gs_mono_ns();
    if (!w->started) {
        w->started = 1;
        w->bytes = bytes;
        w->deadline_ns = now + (int64_t)__atomic_load_n(&gs_cfg.oom_wait_ms, __ATOMIC_RELAXED) * 1000000ll;
        w->sleep_ns = FIRST_SLEEP_NS;
        w->slot = gs_attach_slot();
        count(w, W_NOW, 1);
        count(w, W_TOTAL, 1);
        count(w, W_BYTES, (int64_t)bytes);
        GS_INFO("device %d is full (the slice has room for %llu bytes): oom_policy=wait, up to %d ms", ordinal,
                (unsigned long long)bytes, gs_cfg.oom_wait_ms);
    }
    for (;;) {
        if (now >= w->deadline_ns) {
            count(w, W_TIMEOUTS, 1);
            GS_WARN("device %d stayed full for %d ms: the allocation of %llu bytes fails (oom_policy=wait)", ordinal,
                    gs_cfg.oom_wait_ms, (unsigned long long)bytes);
            return 0;
        }
        int64_t nap = w->sleep_ns < w->deadline_ns - now ? w->sleep_ns : w->deadline_ns - now;
        struct timespec ts = {nap / 1000000000ll, nap % 1000000000ll};
        nanosleep(&ts, NULL);
        w->sleep_ns = w->sleep_ns * 2 < MAX_SLEEP_NS ? w->sleep_ns * 2 : MAX_SLEEP_NS;
        if (device_free() >= bytes) return 1; /* worth another try */
        now = gs_mono_ns();
    }
}

void gs_mem_wait_end(struct gs_oom_wait *w)
{
    if (!w->started) return;
    count(w, W_NOW, -1);
    count(w, W_BYTES, -(int64_t)w->bytes);
    w->started = 0;
}
