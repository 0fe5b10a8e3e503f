/* Enforcer start-up: decided once, on the first hooked call (never in a constructor, so that a
 * process that never touches CUDA pays nothing, also under /etc/ld.so.preload). Also this process's
 * record in the region (attach, exit detach) and the one list of fork-child handlers (fork.h).
 *
 * Start-up calls down only -- config, region, pacer, log -- never the accounting or the hooks,
 * which call it (gs_state_now, gs_attach_slot). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuslice/fork.h"
#include "gpuslice/log.h"
#include "gpuslice/mps.h"
#include "gpuslice/pacer.h"
#include "gpuslice/state.h"

struct gs_config gs_cfg;
struct gs_region *gs_shared;
int32_t gs_self_pid;
int gs_self_slot = -1;
static int g_state = GS_STATE_UNINIT;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;

/* The entries every module put in the fork-child list (fork.h), laid out by the linker. */
extern const gs_fork_child_fn __start_gs_fork_child[] __attribute__((visibility("hidden")));
extern const gs_fork_child_fn __stop_gs_fork_child[] __attribute__((visibility("hidden")));

static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_attach_lock = fresh;
    gs_self_slot = -1; /* the child attaches its own process record on its first accounted call */
    for (const gs_fork_child_fn *f = __start_gs_fork_child; f < __stop_gs_fork_child; f++) (*f)();
}

static void own_failure(const char *what)
{
    if (gs_cfg.fail_open) {
        GS_ERROR("%s; fail_open=1: GPU calls pass through unlimited", what);
        g_state = GS_STATE_PASSTHROUGH;
    } else {
        GS_ERROR("%s; refusing GPU work (set fail_open=1 in the slice to run unlimited instead)", what);
        g_state = GS_STATE_BROKEN;
    }
}

static void do_init(void)
{
    char err[600];
    if (gs_config_load(&gs_cfg, err, sizeof err)) {
        /* Nothing of a configuration we cannot read is trusted, fail_open included: refuse. Only a
         * slice file that parses can say fail_open=1 (env may only tighten, never open). */
        gs_cfg.fail_open = 0;
        own_failure(err);
        return;
    }
    gs_log_set_level(gs_cfg.log_level);
    if (gs_cfg.warning[0]) GS_WARN("%s", gs_cfg.warning);
    if (gs_cfg.source == GS_SRC_NONE) {
        g_state = GS_STATE_PASSTHROUGH; /* not in a slice */
        return;
    }
    gs_mps_apply(&gs_cfg); /* before the real cuInit, which reads the MPS variables; spatial only */
    gs_shared = gs_region_open(gs_cfg.region, err, sizeof err);
    if (!gs_shared) {
        own_failure(err);
        return;
    }
    /* Spatial slices are not paced to a share (MPS runs their kernels at once on their share of the SMs);
     * a preemptive one that asks takes part in the yield (mps.h gs_mps_yield_paced) */
    int pace = gs_cfg.engine != GS_ENGINE_SPATIAL || gs_mps_yield_paced(&gs_cfg);
    if (pace && gs_pacer_init(&gs_cfg) != 0) {
        if (gs_cfg.engine == GS_ENGINE_SPATIAL) {
            /* the gate was asked for, it holds no limit: without it the slice runs as spatial slices always did */
            GS_WARN("spatial slice: the yield gate (GPUSLICE_SPATIAL_YIELD=1) could not start; running without it");
        } else if (!gs_cfg.fail_open) {
            own_failure("compute pacer failed to start");
            return;
        } else {
            /* fail_open covers only what failed: memory limits still hold, compute is unpaced */
            GS_ERROR("compute pacer failed to start; fail_open=1: memory limits hold, compute is not paced");
        }
    }
    pthread_atfork(NULL, NULL, after_fork_child); /* the one handler: it runs the whole list */
    g_state = GS_STATE_ACTIVE;
    GS_INFO("enforcing slice %s: %d device(s), region %s", gs_cfg.grant[0] ? gs_cfg.grant : "(no grant id)",
            gs_cfg.device_count, gs_cfg.region[0] ? gs_cfg.region : "(private)");
}

int gs_init(void)
{
    pthread_once(&g_once, do_init);
    return g_state;
}

int gs_state_now(void)
{
    int s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    return s != GS_STATE_UNINIT ? s : gs_init();
}

static int g_exiting;

/* Normal exit: the driver frees the process's memory, so give the record back now rather than
 * waiting for the next reclaim. (SIGKILL and _exit skip this; reclaim covers them.) */
__attribute__((destructor)) static void gs_fini(void)
{
    if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != GS_STATE_ACTIVE) return;
    pthread_mutex_lock(&g_attach_lock);
    g_exiting = 1;
    if (gs_self_slot >= 0 && gs_self_pid == (int32_t)getpid() && gs_region_lock(gs_shared) == 0) {
        gs_region_proc_detach(gs_shared, gs_self_slot);
        gs_region_unlock(gs_shared);
    }
    gs_self_slot = -1;
    pthread_mutex_unlock(&g_attach_lock);
    gs_pacer_shutdown();
}

int gs_attach_slot(void)
{
    int32_t pid = (int32_t)getpid();
    if (gs_self_slot >= 0 && gs_self_pid == pid) return gs_self_slot;
    pthread_mutex_lock(&g_attach_lock);
    if (g_exiting) {
        pthread_mutex_unlock(&g_attach_lock);
        return -1; /* frees during exit teardown: the record is already gone */
    }
    if (!(gs_self_slot >= 0 && gs_self_pid == pid)) {
        int slot = -1;
        if (gs_region_lock(gs_shared) == 0) {
            gs_region_reclaim_dead(gs_shared);
            slot = gs_region_proc_attach(gs_shared, pid, gs_proc_start_time(pid));
            gs_region_unlock(gs_shared);
        }
        if (slot < 0) GS_ERROR("region %s: no free process record (max %d processes per slice)", gs_cfg.region, GS_REGION_MAX_PROCS);
        gs_self_pid = pid;
        gs_self_slot = slot;
    }
    int s = gs_self_slot;
    pthread_mutex_unlock(&g_attach_lock);
    return s;
}
