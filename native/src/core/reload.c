/* Live resize: a running process follows its slice file. The node side (agent, device plugin, DRA
 * driver) rewrites the file atomically (temporary file + rename in the same root-owned folder) with a
 * higher generation=; here the accounting paths ask, at most every GS_RELOAD_EVERY_NS, whether the
 * file changed (one stat), and if it did, read it again through gs_config_load -- the same loader,
 * pinned-file rule and env lowering as at start-up -- and take over what a resize may change: memory
 * limits and oom_policy. Devices, region and engine never change under a running process (a resize
 * that tried would be refused by the node side; here it is ignored with a warning). The compute
 * share, mode, weight and priority are kept in gs_cfg for the record but the pacer keeps the values it
 * started with (its per-device engines are set up once; see native/README.md, Live resize).
 *
 * The accounting keeps the epoch it last applied and re-applies limits when gs_reload_poll returns a
 * newer one. Calls down only: config, log. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gpuslice/fork.h"
#include "gpuslice/log.h"
#include "gpuslice/reload.h"
#include "gpuslice/state.h"

/* 100 ms between stats: a resize reaches a process that allocates within 0.1 s (the issue asks for
 * 1 s), and one stat per 100 ms is nothing next to an allocation (a stat of a local file ~1 us). */
#define GS_RELOAD_EVERY_NS 100000000ll

static int64_t g_next_ns;
static unsigned g_epoch;
static struct {
    int known;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim, ctim;
} g_seen;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_lock = fresh;
}
GS_ON_FORK_CHILD(after_fork_child);

static int64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int same_stat(const struct stat *st)
{
    return g_seen.known && g_seen.dev == st->st_dev && g_seen.ino == st->st_ino && g_seen.size == st->st_size &&
           g_seen.mtim.tv_sec == st->st_mtim.tv_sec && g_seen.mtim.tv_nsec == st->st_mtim.tv_nsec &&
           g_seen.ctim.tv_sec == st->st_ctim.tv_sec && g_seen.ctim.tv_nsec == st->st_ctim.tv_nsec;
}

static void remember(const struct stat *st)
{
    g_seen.known = 1;
    g_seen.dev = st->st_dev;
    g_seen.ino = st->st_ino;
    g_seen.size = st->st_size;
    g_seen.mtim = st->st_mtim;
    g_seen.ctim = st->st_ctim;
}

/* What may not change under a running process; "" when nothing of it did. */
static const char *fixed_part_changed(const struct gs_config *fresh)
{
    if (fresh->device_count != gs_cfg.device_count) return "devices";
    for (int i = 0; i < fresh->device_count; i++)
        if (strcmp(fresh->devices[i], gs_cfg.devices[i])) return "devices";
    if (strcmp(fresh->region, gs_cfg.region)) return "region";
    if (fresh->engine != gs_cfg.engine) return "engine";
    return "";
}

/* Take over the resizable part of fresh (under g_lock). Stores are atomic: other threads read these
 * fields without a lock (8-byte aligned, never torn). */
static void take_over(const struct gs_config *fresh)
{
    for (int i = 0; i < GS_MAX_DEVICES; i++) __atomic_store_n(&gs_cfg.device_limit[i], fresh->device_limit[i], __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.memory_limit, fresh->memory_limit, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.process_limit, fresh->process_limit, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.oom_policy, fresh->oom_policy, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.oom_wait_ms, fresh->oom_wait_ms, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.compute, fresh->compute, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.mode, fresh->mode, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.weight, fresh->weight, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.priority, fresh->priority, __ATOMIC_RELAXED);
    __atomic_store_n(&gs_cfg.generation, fresh->generation, __ATOMIC_RELEASE);
    __atomic_add_fetch(&g_epoch, 1, __ATOMIC_RELEASE);
}

static void reload_locked(const struct stat *st)
{
    struct gs_config fresh;
    char err[600];
    remember(st);
    if (gs_config_load(&fresh, err, sizeof err)) {
        /* A half-written file cannot be seen (the node renames a complete one into place); a broken
         * one keeps the limits we run with, which were valid. */
        GS_WARN("slice file changed but cannot be read (%s); keeping the current limits", err);
        return;
    }
    const char *fixed = fixed_part_changed(&fresh);
    if (*fixed) {
        GS_WARN("slice file %s: %s changed under a running process; ignored (a resize changes sizes only)",
                gs_cfg.slice_path, fixed);
        return;
    }
    if (fresh.generation < gs_cfg.generation) {
        GS_WARN("slice file %s: generation %u is older than the %u this process runs with; ignored",
                gs_cfg.slice_path, fresh.generation, gs_cfg.generation);
        return;
    }
    take_over(&fresh);
    GS_INFO("slice file %s: generation %u taken over (memory_limit %llu, compute %d)", gs_cfg.slice_path,
            fresh.generation, (unsigned long long)fresh.memory_limit, fresh.compute);
}

unsigned gs_reload_poll(void)
{
    unsigned epoch = __atomic_load_n(&g_epoch, __ATOMIC_ACQUIRE);
    if (gs_cfg.source != GS_SRC_SLICE_FILE || !gs_cfg.slice_path[0]) return epoch;
    int64_t now = coarse_ns(), next = __atomic_load_n(&g_next_ns, __ATOMIC_RELAXED);
    if (now < next) return epoch;
    /* one thread looks; the others go on with what they have */
    if (!__atomic_compare_exchange_n(&g_next_ns, &next, now + GS_RELOAD_EVERY_NS, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return epoch;
    struct stat st;
    if (stat(gs_cfg.slice_path, &st) != 0) return epoch; /* gone: the grant is ending; keep the limits */
    pthread_mutex_lock(&g_lock);
    if (!same_stat(&st)) reload_locked(&st);
    pthread_mutex_unlock(&g_lock);
    return __atomic_load_n(&g_epoch, __ATOMIC_ACQUIRE);
}

void gs_reload_now(void)
{
    __atomic_store_n(&g_next_ns, 0, __ATOMIC_RELAXED);
}
