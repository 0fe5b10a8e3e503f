/* gpuslice compute pacer: the glue between the launch hooks (src/hooks/launch.c), the CUDA driver
 * (events, through gs_real) and the pacer engine (pacer_core.c: measurement, turns, priority) driven
 * by the controller (controller.c). Design and constants: native/README-compute.md. Started by
 * start-up (gs_pacer_init), called by the launch hooks; calls only down (base, config).
 *
 * Per device ordinal, lazily on the first launch: open the device's folder
 * <device_state_dir>/<GPU-uuid>.slices (devstate.h), create GS_ENG_RING event pairs in the current
 * context, join the slice (its own file there). A background poller harvests completed events every GS_CTL_POLL_NS while work is
 * outstanding, so neighbours see an accurate "busy" flag even while this program sits in a
 * synchronize. Launch hooks sleep here (nanosleep) when the engine says wait. */
#define _GNU_SOURCE
#include "gpuslice/clock.h"
#include "gpuslice/pacer.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "gpuslice/config.h"
#include "gpuslice/cuda_types.h"
#include "gpuslice/fork.h"
#include "gpuslice/hook.h"
#include "gpuslice/log.h"
#include "gpuslice/memory.h"
#include "gpuslice/pacer_core.h"
#include "gpuslice/capture.h"
#include "gpuslice/pairbias.h"
#include "gpuslice/real.h"
#include "gpuslice/region.h"
#include "gpuslice/state.h"

#define GS_DEFAULT_DEVSTATE_DIR "/tmp/gpuslice-devstate"
#define CU_OK 0
#define CU_EVENT_DEFAULT 0
#define CU_EVENT_DISABLE_TIMING 2

typedef void *CUev;
typedef CUresult (*fn_ctx_get_current)(CUcontext *);
typedef CUresult (*fn_ctx_set_current)(CUcontext);
typedef CUresult (*fn_dev_uuid)(CUuuid *, CUdevice);
typedef CUresult (*fn_ev_create)(CUev *, unsigned);
typedef CUresult (*fn_ev_record)(CUev, CUstream);
typedef CUresult (*fn_ev_query)(CUev);
typedef CUresult (*fn_ev_elapsed)(float *, CUev, CUev);

static struct {
    fn_ctx_get_current ctx_get;
    fn_ctx_set_current ctx_set;
    fn_dev_uuid uuid;
    fn_ev_create ev_create;
    fn_ev_record ev_record;
    fn_ev_query ev_query;
    fn_ev_elapsed ev_elapsed;
} cu;

struct gs_pdev {
    int state;            /* 0 not yet, 1 ready, -1 not paced (failed or not in the slice) */
    CUcontext ctx, events_ctx;
    CUev start[GS_ENG_RING], end[GS_ENG_RING];
    CUev drain;           /* re-recorded after each launch of a light high-priority process */
    CUev mark[GS_ENG_MARKS]; /* completion markers of the yield path */
    struct gs_devstate ds;
    struct gs_engine eng;
};

static struct {
    int enabled;
    pid_t pid;
    int mode, weight, priority, fail_open, colocation;
    int region;           /* the slice has a region of its own (not private to this process): its credit lives there */
    struct gs_tidal tidal;
    int share_pct[GS_MAX_DEVICES];
    char grant[128];
    char dir[GS_PATH_LEN];
    pthread_mutex_t mu;   /* device set-up */
    pthread_t poller;
    int poller_running, stop;
    uint32_t wake_seq;  /* futex word: a launch bumps it to cut the poller's idle sleep short */
    struct gs_pdev dev[GS_MAX_DEVICES];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct gs_ticket tl_ticket = {.slot = -1, .captured = -1};

/* The current UTC hour, for tidal schedules (README-compute.md: hours are UTC on every node). */
static int utc_hour(void)
{
    time_t t = time(NULL);
    struct tm tm;
    return gmtime_r(&t, &tm) ? tm.tm_hour : 0;
}

static _Thread_local int tl_slack_set;

/* Linux oversleeps by the timer slack (50 us by default) - as long as our shortest wait. Only
 * threads that actually wait here (and the poller) get 1 us slack, so a hand-over does not idle the GPU. */
static void tight_slack(void)
{
    if (!tl_slack_set) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
        tl_slack_set = 1;
    }
}

static void sleep_ns(int64_t ns)
{
    tight_slack();
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The poller's sleep, cut short when a launch bumps wake_seq (op_wake): a high-priority request that
 * starts after idle time arms its drain record while the poller may be in a 5-ms idle sleep; its
 * low-priority neighbours must see the queue within DRAIN_POLL, not IDLE_POLL. A futex, not a
 * condition variable: the waker is a launch thread and must not take a lock. */
static void poller_sleep(int64_t ns, uint32_t seq)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    syscall(SYS_futex, &g.wake_seq, FUTEX_WAIT_PRIVATE, seq, &ts, NULL, 0); /* EINTR/EAGAIN: poll now */
}

static void op_wake(void *c)
{
    (void)c;
    __atomic_add_fetch(&g.wake_seq, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &g.wake_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- the engine's GPU operations, on CUDA events ---- */
/* The stream a launch names is handed through as is. A _ptsz launch on stream 0 means the calling
 * thread's per-thread default stream: launch.c passes CU_STREAM_PER_THREAD for it (pacer.h), so the
 * events and the capture check below name that stream too, not the legacy one (an event on the
 * legacy stream would wait for every blocking stream, and a capture on the per-thread stream would
 * go unseen and be invalidated by our record on the legacy stream). */
static int op_record_start(void *c, int i, void *stream)
{
    struct gs_pdev *d = c;
    return cu.ev_record(d->start[i], (CUstream)stream) == CU_OK ? 0 : -1;
}
static int op_record_end(void *c, int i, void *stream)
{
    struct gs_pdev *d = c;
    return cu.ev_record(d->end[i], (CUstream)stream) == CU_OK ? 0 : -1;
}
/* Every look at an event goes through here, in the calling thread's relaxed capture mode (gpuslice/capture.h): a
 * CUDA graph being captured in the default (global) mode makes cuEventQuery and cuEventElapsedTime forbidden calls
 * for every thread of the process, and one made by our poller, or by a launching thread of the application that
 * harvests, failed and invalidated the application's capture (PyTorch's torch.cuda.graph captures in that mode
 * unless told otherwise; PyTorch's own NCCL watchdog, which only queries events too, sets its thread's mode for
 * the same reason). Relaxed, the look is allowed; it is never of an event recorded inside a capture (the paced
 * paths and the drain record skip a capturing stream: pacer_core.c), the one look relaxed mode still forbids. */
static int query_state(CUev e)
{
    struct gs_capture_mode m = gs_capture_relax();
    CUresult r = cu.ev_query(e);
    gs_capture_restore(&m);
    return r == CU_OK ? 1 : (r == CUDA_ERROR_NOT_READY ? 0 : -1);
}
static int op_query_end(void *c, int i)
{
    struct gs_pdev *d = c;
    return query_state(d->end[i]);
}
static int64_t op_elapsed(void *c, int i)
{
    struct gs_pdev *d = c;
    float ms = 0;
    struct gs_capture_mode m = gs_capture_relax();
    CUresult r = cu.ev_elapsed(&ms, d->start[i], d->end[i]);
    gs_capture_restore(&m);
    if (r != CU_OK || ms < 0) return -1;
    return (int64_t)((double)ms * 1e6);
}
static int op_query_start(void *c, int i)
{
    struct gs_pdev *d = c;
    return query_state(d->start[i]);
}
static int64_t op_now(void *c)
{
    (void)c;
    return gs_mono_ns();
}
static int op_capturing(void *c, void *stream)
{
    (void)c;
    return gs_capture_status((CUstream)stream) != 0; /* an error counts as capturing: nothing recorded into it */
}
static int op_record_drain(void *c, void *stream)
{
    struct gs_pdev *d = c;
    return cu.ev_record(d->drain, (CUstream)stream) == CU_OK ? 0 : -1;
}
static int op_query_drain(void *c)
{
    struct gs_pdev *d = c;
    return query_state(d->drain);
}
static int op_record_mark(void *c, int i, void *stream)
{
    struct gs_pdev *d = c;
    return cu.ev_record(d->mark[i], (CUstream)stream) == CU_OK ? 0 : -1;
}
static int op_query_mark(void *c, int i)
{
    struct gs_pdev *d = c;
    return query_state(d->mark[i]);
}
static const struct gs_gpu_ops CUDA_OPS = {op_record_start, op_record_end, op_query_end, op_elapsed, op_capturing,
                                           op_record_drain, op_query_drain, op_record_mark, op_query_mark, op_wake,
                                           op_query_start, op_now};

static int load_driver(void)
{
    cu.ctx_get = (fn_ctx_get_current)gs_real("cuCtxGetCurrent");
    cu.ctx_set = (fn_ctx_set_current)gs_real("cuCtxSetCurrent");
    cu.uuid = (fn_dev_uuid)gs_real("cuDeviceGetUuid_v2");
    if (!cu.uuid) cu.uuid = (fn_dev_uuid)gs_real("cuDeviceGetUuid");
    cu.ev_create = (fn_ev_create)gs_real("cuEventCreate");
    cu.ev_record = (fn_ev_record)gs_real("cuEventRecord");
    cu.ev_query = (fn_ev_query)gs_real("cuEventQuery");
    cu.ev_elapsed = (fn_ev_elapsed)gs_real("cuEventElapsedTime");
    return cu.ctx_get && cu.ctx_set && cu.uuid && cu.ev_create && cu.ev_record && cu.ev_query && cu.ev_elapsed ? 0 : -1;
}

static void format_uuid(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void *poller_main(void *arg)
{
    (void)arg;
    gs_capture_relax_for_good(); /* our own thread (query_state) */
    gs_devstate_thread_ready(); /* it reads neighbours' files: a truncated one's SIGBUS must reach the guard */
    int64_t hour_at = 0;
    while (!__atomic_load_n(&g.stop, __ATOMIC_ACQUIRE)) {
        int64_t next = GS_CTL_IDLE_POLL_NS;
        uint32_t seq = __atomic_load_n(&g.wake_seq, __ATOMIC_ACQUIRE); /* a wake after this cuts the sleep */
        int64_t t0 = gs_mono_ns();
        int hour = -1;
        if (t0 - hour_at > 1000000000LL) { /* a tidal schedule's hour, looked up once a second */
            hour = utc_hour();
            hour_at = t0;
        }
        for (int i = 0; i < GS_MAX_DEVICES; i++) {
            struct gs_pdev *d = &g.dev[i];
            if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) != 1) continue;
            /* events belong to the application's context; make it current in this thread (a light
             * engine with nothing outstanding only refreshes its heartbeat: no CUDA call) */
            if (__atomic_load_n(&d->eng.path, __ATOMIC_RELAXED) != GS_DS_PATH_LIGHT || d->eng.outstanding > 0 ||
                __atomic_load_n(&d->eng.drain_pending, __ATOMIC_ACQUIRE) || __atomic_load_n(&d->eng.mcount, __ATOMIC_RELAXED))
                cu.ctx_set(d->ctx);
            if (hour >= 0) d->eng.tidal_hour = hour;
            int64_t now = gs_mono_ns();
            gs_engine_poll(&d->eng, now);
            /* fast while work is queued or was just launched beside neighbours (their hand-overs
             * and priority read our busy flag, which only a poll clears), slow otherwise */
            int64_t w = gs_engine_poll_delay(&d->eng, now);
            if (w < next) next = w;
        }
        tight_slack();
        poller_sleep(next, seq);
    }
    return NULL;
}

static void stop_poller(void)
{
    if (!g.poller_running || g.pid != getpid()) return;
    __atomic_store_n(&g.stop, 1, __ATOMIC_RELEASE);
    pthread_join(g.poller, NULL);
    g.poller_running = 0;
}

/* In the fork-child list (fork.h): it runs in the child of every active enforcer, paced or not (for
 * a pacer never enabled it only resets what is already unset). */
static void after_fork_child(void)
{
    /* The child has no poller and its CUDA state is not the parent's: forget the devices without
     * touching the parent's records; they are set up again on the child's first launch. */
    pthread_mutex_init(&g.mu, NULL);
    g.poller_running = 0;
    g.stop = 0;
    g.pid = getpid();
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        g.dev[i].state = 0;
        gs_devstate_after_fork(&g.dev[i].ds); /* the parent's descriptors closed: the child joins anew */
    }
}
GS_ON_FORK_CHILD(after_fork_child);

int gs_pacer_init(const struct gs_config *cfg)
{
    if (g.enabled) gs_pacer_shutdown(); /* a second init (tests, re-exec) starts clean */
    g.enabled = 0;
    g.pid = getpid();
    for (int i = 0; i < GS_MAX_DEVICES; i++) g.dev[i].state = 0; /* set up again on first launch */
    if (!cfg) return -1;
    g.mode = cfg->mode == GS_MODE_SOFT ? GS_CTL_SOFT : cfg->mode == GS_MODE_OFF ? GS_CTL_OFF : GS_CTL_HARD;
    g.weight = cfg->weight < 1 ? 1 : cfg->weight > 16 ? 16 : cfg->weight;
    g.priority = cfg->priority ? 1 : 0;
    g.colocation = cfg->colocation;
    g.tidal = cfg->tidal;
    g.fail_open = cfg->fail_open;
    g.region = cfg->region[0] != '\0';
    int any = 0;
    /* a spatial slice's share is its MPS active-thread percentage: here it is paced to none, it only takes
     * part in the yield (mps.h gs_mps_yield_paced: started only when it asked) */
    int spatial = cfg->engine == GS_ENGINE_SPATIAL;
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        int pct = spatial ? 0 : cfg->compute_per_ordinal[i] >= 0 ? cfg->compute_per_ordinal[i] : cfg->compute;
        g.share_pct[i] = pct < 0 ? 0 : pct > 100 ? 100 : pct;
        any |= g.share_pct[i] > 0 && g.share_pct[i] < 100;
    }
    if (cfg->grant[0]) snprintf(g.grant, sizeof g.grant, "%s", cfg->grant);
    else snprintf(g.grant, sizeof g.grant, "pid-%d", (int)g.pid); /* no grant: a slice of its own */
    snprintf(g.dir, sizeof g.dir, "%s", cfg->device_state_dir[0] ? cfg->device_state_dir : GS_DEFAULT_DEVSTATE_DIR);
    if (g.mode == GS_CTL_OFF) return 0; /* compute not enforced at all */
    /* Low priority and shares need neighbours to coordinate with; a slice at 100 % and high
     * priority still takes part (it publishes activity for low-priority neighbours). */
    if (load_driver() != 0) {
        GS_ERROR("compute: the driver lacks the event functions the pacer needs");
        return any ? -1 : 0;
    }
    /* Refuse at start, not at the first launch, when the coordination directory is unusable. */
    if (mkdir(g.dir, 01777) == 0) chmod(g.dir, 01777);
    /* The folder must be searchable; it need not be writable: a slice writes only its own file in its
     * device's folder (devstate.h), which the node's manager makes (Kubernetes mounts the folder read-only
     * and the file read-write on top: a pod must write no host folder, whose bytes no ephemeral-storage
     * limit counts). A device whose file is missing and cannot be made fails at that device, said then. */
    if (access(g.dir, X_OK) != 0) {
        GS_ERROR("compute: device_state_dir %s cannot be searched: %s", g.dir, strerror(errno));
        return -1;
    }
    g.enabled = 1;
    return 0;
}

/* What the timing events add to each pair on this device (pairbias.h), measured once per context
 * unless paced launches are never measured (unpaced light path). A build with GS_PAIR_BIAS_OFF keeps
 * raw pairs (the packing benchmark's A/B of the change). */
static void set_pair_bias(int dev, struct gs_pdev *d)
{
#ifdef GS_PAIR_BIAS_OFF
    (void)dev;
    (void)d;
#else
    if (d->eng.light_base) return; /* measures no pairs (set by gs_engine_set_colocation) */
    char why[160] = "";
    int64_t b = gs_pair_bias_measure(why, sizeof why);
    if (b < 0) {
        GS_INFO("compute: device %d: timing pairs charged raw (their own cost not measured: %s)", dev, why);
        return;
    }
    __atomic_store_n(&d->eng.pair_bias_ns, b, __ATOMIC_RELAXED); /* the poller's harvest reads it */
    GS_INFO("compute: device %d: a timing pair adds %lld ns to its kernel; taken off each pair", dev, (long long)b);
#endif
}

/* Set up device `dev` (under g.mu). */
static void setup_device(int dev, struct gs_pdev *d)
{
    char err[256], uuid[64];
    CUuuid u;
    d->state = -1;
    if (cu.ctx_get(&d->ctx) != CU_OK || !d->ctx) return; /* no context: nothing can launch */
    if (cu.uuid(&u, (CUdevice)dev) != CU_OK) {
        GS_ERROR("compute: cannot read the uuid of device %d; not paced", dev);
        return;
    }
    format_uuid(&u, uuid, sizeof uuid);
    /* events of an earlier set-up in the same context are reused (they are never destroyed: at
     * exit the driver may already be going away) */
    if (d->events_ctx != d->ctx) {
        for (int i = 0; i < GS_ENG_RING; i++)
            if (cu.ev_create(&d->start[i], CU_EVENT_DEFAULT) != CU_OK || cu.ev_create(&d->end[i], CU_EVENT_DEFAULT) != CU_OK) {
                GS_ERROR("compute: cannot create timing events on device %d; not paced", dev);
                return;
            }
        /* no timing needed: drain and marker records only say "done or not" (cheaper to record) */
        int ok = cu.ev_create(&d->drain, CU_EVENT_DISABLE_TIMING) == CU_OK;
        for (int i = 0; ok && i < GS_ENG_MARKS; i++) ok = cu.ev_create(&d->mark[i], CU_EVENT_DISABLE_TIMING) == CU_OK;
        if (!ok) {
            GS_ERROR("compute: cannot create an event on device %d; not paced", dev);
            return;
        }
        d->events_ctx = d->ctx;
    }
    if (gs_devstate_open(&d->ds, g.dir, uuid, err, sizeof err) != 0) {
        GS_ERROR("compute: %s; device %d not paced", err, dev);
        return;
    }
    int pct = g.share_pct[dev];
    if (gs_engine_init(&d->eng, &d->ds, g.grant, (uint32_t)pct * 100u, g.mode, g.weight, g.priority, (int32_t)getpid(),
                       (uint32_t)dev, &CUDA_OPS, d, gs_mono_ns()) != 0) {
        GS_ERROR("compute: device state %s/%s%s: %s; device %d not paced", g.dir, uuid, GS_DS_FOLDER_SUFFIX,
                 d->ds.why[0] ? d->ds.why : "locked", dev);
        gs_devstate_close(&d->ds);
        return;
    }
    if (d->ds.why[0]) GS_WARN("compute: device %d: %s", dev, d->ds.why); /* a private copy: paced, not seen */
    /* The slice's credit goes into its own region (two of the device record's compute_spare words), which
     * only the slice's processes can write: in the pacing file any tenant on the device could keep it at
     * maximum debt (issue 15). A slice without a region of its own keeps it in its record, as before. */
    int ridx = g.region && gs_shared ? gs_mem_dev_index(dev) : -1;
    if (ridx >= 0 && gs_engine_set_credit_home(&d->eng, (int64_t *)gs_shared->devices[ridx].compute_spare) != 0)
        GS_WARN("compute: device %d: the slice's credit stays in the device state (lock failed)", dev);
    d->eng.tidal_hour = utc_hour();
    if (gs_engine_set_colocation(&d->eng, g.colocation, &g.tidal, pct) != 0)
        GS_WARN("compute: device %d: could not record colocation=%s in the device state", dev, gs_coloc_name(g.colocation));
    GS_INFO("compute: device %d (%s) share %d%% mode %s weight %d priority %d colocation %s, state %s/%s" GS_DS_FOLDER_SUFFIX, dev,
            uuid, pct, g.mode == GS_CTL_SOFT ? "soft" : "hard", g.weight, g.priority, gs_coloc_name(g.colocation),
            g.dir, uuid);
    if (!g.poller_running) {
        g.stop = 0;
        if (pthread_create(&g.poller, NULL, poller_main, NULL) == 0) g.poller_running = 1;
        else GS_WARN("compute: no poller thread; events are harvested at launches only");
    }
    __atomic_store_n(&d->state, 1, __ATOMIC_RELEASE);
}

static struct gs_pdev *device(int dev)
{
    if (dev < 0 || dev >= GS_MAX_DEVICES) return NULL;
    struct gs_pdev *d = &g.dev[dev];
    int st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (st == 0) {
        int mine = 0;
        pthread_mutex_lock(&g.mu);
        if (d->state == 0) {
            setup_device(dev, d);
            mine = 1;
        }
        pthread_mutex_unlock(&g.mu);
        st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
        /* measured after the device is published, outside g.mu: the other threads' launches are paced (their
         * pairs charged raw) meanwhile, and no first launch on another device waits for it; only this
         * thread's own first launch does, for at most ~0.2 s (pairbias.c) */
        if (mine && st == 1) set_pair_bias(dev, d);
    }
    return st == 1 ? d : NULL;
}

/* The longest a paced launch may be held by its credit, from this slice's own configuration (its
 * root-written slice file), never from the shared state a neighbour can write: the slice's credit cannot
 * legitimately owe more than DEBT_MAX of GPU time (controller.c clamps every charge), refilled at no less
 * than its share while the node's shares fit the device, plus LOOKAHEAD, plus a second for a loaded
 * machine: 50 % -> 5.0 s, 10 % -> 21 s, 1 % -> 201 s. Past it the state file says something this slice's
 * configuration cannot produce (a neighbour rewrote our credit, share or rate: README-compute.md "Hostile
 * neighbours"): the launch goes. 0 = no cap (an unpaced process waits only on the yield gate, which has
 * its own: GS_CTL_YIELD_HOLD_MAX, since what it waits for, a high-priority neighbour's queue, is read from
 * records any tenant on the device can forge). */
static int64_t hold_cap_ns(int dev)
{
    int pct = g.share_pct[dev];
    if (g.mode == GS_CTL_OFF || pct <= 0 || pct >= 100) return 0;
    return (GS_CTL_DEBT_MAX_NS + GS_CTL_LOOKAHEAD_NS) * 100 / pct + 1000000000LL;
}

static uint64_t held_too_long; /* launches let go at a cap, this process */

static void hold_capped(int dev, int64_t held, int yield)
{
    if (__atomic_fetch_add(&held_too_long, 1, __ATOMIC_RELAXED) != 0) return;
    if (yield)
        GS_WARN("compute: a launch on device %d waited %.1f s for high-priority neighbours' queues; a real backlog "
                "that long is rare and a forged one holds nobody: the launch goes (counted, this is said once)",
                dev, (double)held / 1e9);
    else
        GS_WARN("compute: a launch on device %d was held %.1f s, longer than a %d%% share can owe; the device state "
                "file looks rewritten by another process; the launch goes (counted, this is said once)",
                dev, (double)held / 1e9, g.share_pct[dev]);
}

uint64_t gs_pacer_held_too_long(void) { return __atomic_load_n(&held_too_long, __ATOMIC_RELAXED); }

void gs_pacer_before_launch(int dev, void *stream, uint64_t key)
{
    tl_ticket.slot = -1;
    tl_ticket.charged = 0;
    tl_ticket.yield = 0;
    tl_ticket.captured = -1;
    if (!g.enabled) return;
    gs_devstate_thread_ready(); /* before device(): its set-up already reads neighbours' files */
    struct gs_pdev *d = device(dev);
    if (!d) return;
    /* the credit's waits and the yield gate's are bounded apart: each by what could legitimately cause it */
    int64_t slept = 0, held = 0, held_yield = 0, cap = hold_cap_ns(dev);
    for (;;) {
        int64_t t0 = gs_mono_ns();
        int64_t w = gs_engine_before(&d->eng, t0, stream, key, slept, &tl_ticket);
        if (w <= 0) return;
        int gate = tl_ticket.yield_held;
        if (gate ? held_yield >= GS_CTL_YIELD_HOLD_MAX_NS : cap > 0 && held >= cap) {
            hold_capped(dev, gate ? held_yield : held, gate);
            return;
        }
        sleep_ns(w);
        slept = gs_mono_ns() - t0;
        if (gate) held_yield += slept;
        else held += slept;
    }
}

void gs_pacer_after_launch(int dev, void *stream, int cu_result)
{
    struct gs_ticket t = tl_ticket;
    tl_ticket.slot = -1;
    tl_ticket.charged = 0;
    tl_ticket.yield = 0;
    tl_ticket.captured = -1;
    if (!g.enabled || dev < 0 || dev >= GS_MAX_DEVICES) return;  /* slot < 0: the engine may record a drain */
    struct gs_pdev *d = &g.dev[dev];
    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) != 1) return;
    /* a paced engine leaves the time blocked in the driver's launch call out of its offered load;
     * the light path reads no clock after the launch */
    gs_engine_after(&d->eng, d->eng.paced ? gs_mono_ns() : 0, stream, &t, cu_result == CU_OK);
}

/* A benchmark's (or a debugger's) look at where this process's charge on device `dev` came from: one
 * JSON object of counters since the process started (gs_engine_stats; README-compute.md "Charge
 * counters"), found by name in the preloaded library (ctypes.CDLL(None)). Returns its length, or -1 when
 * this process paces nothing on that device. Read-only: it changes nothing the pacer decides. */
GS_EXPORT int gpuslice_pacer_stats(int dev, char *buf, size_t len)
{
    if (!buf || !len || !g.enabled || dev < 0 || dev >= GS_MAX_DEVICES) return -1;
    struct gs_pdev *d = &g.dev[dev];
    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) != 1) return -1;
    return gs_engine_stats(&d->eng, buf, len);
}

void gs_pacer_shutdown(void)
{
    if (!g.enabled) return;
    stop_poller();
    if (g.pid != getpid()) return;
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        struct gs_pdev *d = &g.dev[i];
        if (d->state != 1) continue;
        d->state = -1;
        /* give the records back now; the events die with the context (the driver may already be
         * tearing down at exit, so they are not destroyed here) */
        gs_engine_fini(&d->eng);
        gs_devstate_close(&d->ds);
    }
    g.enabled = 0;
}
