/* gpuslice pacer engine (see gpuslice/pacer_core.h, README-compute.md).
 *
 * Measuring: every paced launch is bracketed by an event pair on its stream. An event is a command in
 * the context's own channel; on a time-sliced GPU the channel is processed only while its context is
 * scheduled, so start..end is the time this kernel (or graph) held the device, not the time it
 * waited behind another process. Pairs are harvested in launch order when their end completes and
 * the exact elapsed time is charged to the slice's credit. Work launched but not yet harvested is
 * predicted (count x mean cost) and held against the credit before the next launch (the P term).
 *
 * Turns: a process starts new work only when no other process on the device has queued work
 * predicted to run longer than TURN_EARLY, first come first served; a holder stops adding work when
 * a neighbour waited TURN_MAX or when it finds itself overlapping another busy process. Two contexts
 * with work queued at once get time-sliced by the GPU, which stretches the kernel that gets
 * preempted; turns keep that rare, and they make the hand-over cost about one launch latency. */
#include "gpuslice/pacer_core.h"
#include <stdio.h>
#include <string.h>

#define GS_REAP_EVERY_NS 1000000000LL
#define GS_PRIO_POLL_NS 200000LL
/* an engine with nothing to harvest still refreshes its heartbeat this often (GS_DS_HEARTBEAT_NS is
 * the promise to other namespaces; beating 4x as often leaves room for a late poller) */
#define GS_ENG_BEAT_NS (GS_DS_HEARTBEAT_NS / 4)

static int64_t clamp_add_u64(uint64_t *x, int64_t d)
{
    if (d < 0 && (uint64_t)(-d) > *x) d = -(int64_t)*x;
    *x += (uint64_t)d;
    return d;
}

int gs_engine_init(struct gs_engine *e, struct gs_devstate *ds, const char *grant, uint32_t share_bp,
                   int mode, int weight, int priority, int32_t pid, uint32_t id,
                   const struct gs_gpu_ops *ops, void *ops_ctx, int64_t now)
{
    memset(e, 0, sizeof *e);
    e->ds = ds;
    e->ops = ops;
    e->ops_ctx = ops_ctx;
    if (share_bp > GS_BP_FULL) share_bp = GS_BP_FULL;
    int paced = mode != GS_CTL_OFF && share_bp > 0 && share_bp < GS_BP_FULL;
    snprintf(e->grant, sizeof e->grant, "%s", grant);
    e->share_bp = share_bp;
    e->mode = mode;
    e->weight = weight;
    e->priority = priority;
    e->paced = paced;
    e->pid = pid;
    e->id = id;
    /* Unpaced high-priority processes need no measurement: neighbours only need "has it launched
     * lately", which is one store. This keeps the 100 % path at a few ns per launch. */
    e->light_base = !paced;
    e->light = e->light_base;
    if (gs_devstate_lock(ds) != 0) return -1;
    int rc = gs_devstate_join_locked(ds, grant, share_bp, mode, weight, priority, paced, pid, id, &e->slice, &e->proc);
    if (rc == 0) {
        ds->slices[e->slice].updated_ns = now;
        ds->procs[e->proc].last_seen_ns = now;
        ds->procs[e->proc].heartbeat_ns = now;
        e->joined_ns = ds->procs[e->proc].joined_ns;
        if (e->light_base) ds->procs[e->proc].flags |= GS_DS_PROC_LIGHT;
        else ds->procs[e->proc].flags &= ~GS_DS_PROC_LIGHT;
    }
    gs_devstate_unlock(ds);
    e->last_reap_ns = now;
    e->beat_ns = now;
    return rc;
}

/* Under the lock: is our process record still ours? A reaper in another PID namespace frees a
 * record whose heartbeat went stale (this process was stopped, or its poller starved for
 * GS_DS_STALE_NS); then join again rather than write into a record someone else may hold.
 * 0 = we hold a record; -1 = none could be had (the caller publishes nothing). */
static int own_locked(struct gs_engine *e, int64_t now)
{
    const struct gs_ds_proc *p = &e->ds->procs[e->proc];
    if ((p->flags & GS_DS_PROC_IN_USE) && p->pid == e->pid && p->id == e->id && p->joined_ns == e->joined_ns) return 0;
    int s, q;
    if (gs_devstate_join_locked(e->ds, e->grant, e->share_bp, e->mode, e->weight, e->priority, e->paced, e->pid, e->id,
                                &s, &q) != 0)
        return -1;
    struct gs_ds_proc *me = &e->ds->procs[q];
    e->slice = s;
    e->proc = q;
    e->joined_ns = me->joined_ns;
    e->rejoins++;
    e->rate_at_ns = 0; /* recount neighbours and the allocation now */
    me->last_seen_ns = now;
    me->heartbeat_ns = now;
    if (e->light_base) me->flags |= GS_DS_PROC_LIGHT;
    return 0;
}

static int proc_busy(const struct gs_ds_proc *p, int64_t now)
{
    if (!(p->flags & GS_DS_PROC_IN_USE)) return 0;
    if (p->flags & GS_DS_PROC_BUSY) return 1;
    int held = GS_CTL_PRIO_HOLD_MEASURED || (p->flags & GS_DS_PROC_LIGHT);
    return held && p->last_launch_ns && now - p->last_launch_ns < GS_CTL_PRIO_HOLD_NS;
}

static int valid_slice(int s) { return s >= 0 && s < GS_DS_MAX_SLICES; }

/* A want counts only while its owner keeps asking: a thread waiting here re-asks at least every
 * WAIT_MAX, so a want not refreshed for 4 x WAIT_MAX belongs to a process that went elsewhere. */
static int want_live(const struct gs_ds_proc *p, int64_t now)
{
    return p->want_since_ns && now - p->want_seen_ns <= 4 * GS_CTL_WAIT_MAX_NS;
}


uint32_t gs_engine_rate(struct gs_engine *e, int64_t now)
{
    struct gs_ctl_slice in[GS_DS_MAX_SLICES];
    uint32_t out[GS_DS_MAX_SLICES];
    int map = -1, n = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        const struct gs_ds_slice *s = &e->ds->slices[i];
        if (!(s->flags & GS_DS_SLICE_IN_USE)) continue;
        if (i == e->slice) map = n;
        in[n].share_bp = s->share_bp;
        in[n].mode = s->mode;
        in[n].weight = s->weight;
        in[n].priority = s->priority;
        in[n].active = i == e->slice || (s->last_active_ns && now - s->last_active_ns < GS_CTL_ACTIVE_NS);
        n++;
    }
    if (map < 0) return GS_BP_FULL;
    gs_ctl_allocate(in, n, out);
    return out[map];
}

static void window_add(struct gs_ds_slice *s, int64_t now, int64_t busy, int64_t throttled)
{
    struct gs_ctl_window w = {s->win_start_ns, s->win_busy_ns, s->win_throttled_ns, s->achieved_bp, s->throttled_bp};
    gs_ctl_window_add(&w, now, busy, throttled);
    s->win_start_ns = w.start_ns;
    s->win_busy_ns = w.busy_ns;
    s->win_throttled_ns = w.throttled_ns;
    s->achieved_bp = w.achieved_bp;
    s->throttled_bp = w.throttled_bp;
}

static void charge(struct gs_engine *e, int64_t now, int64_t ns)
{
    struct gs_ds_slice *s = &e->ds->slices[e->slice];
    struct gs_ctl_bucket b = {s->credit_ns, s->credit_last_ns};
    gs_ctl_charge(&b, ns);
    s->credit_ns = b.credit_ns;
    ns = clamp_add_u64(&s->busy_total_ns, ns);
    clamp_add_u64(&e->ds->procs[e->proc].busy_total_ns, ns);
    window_add(s, now, ns, 0);
}

/* Harvest completed pairs in launch order; stop at the first one still running. */
static void harvest(struct gs_engine *e, int64_t now)
{
    while (e->outstanding > 0) {
        int i = e->tail;
        /* gs_engine_after flips RESERVED to RECORDED/VOID without the lock (release store) */
        uint8_t st = __atomic_load_n(&e->ring[i], __ATOMIC_ACQUIRE);
        if (st == GS_RING_RESERVED) break; /* its launch is in progress on another thread */
        if (st == GS_RING_RECORDED) {
            int q = e->ops->query_end(e->ops_ctx, i);
            if (q == 0) break;
            int64_t ns = q > 0 ? e->ops->elapsed(e->ops_ctx, i) : -1;
            if (ns < 0) {
                /* an event failed: charge the mean so the slice is not let free */
                __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
                ns = e->cost_ns;
            } else {
                e->measured++;
                e->cost_avg_ns = e->cost_avg_ns ? e->cost_avg_ns + (ns - e->cost_avg_ns) / 64 : (ns > 0 ? ns : 1);
                /* EWMA 1/8: follows a change of workload within ~20 launches, smooths mixed kernels */
                if (e->cost_ns) {
                    int64_t d = ns - e->cost_ns;
                    e->cost_ns += d / 8;
                    e->cost_dev_ns += ((d < 0 ? -d : d) - e->cost_dev_ns) / 8;
                } else {
                    e->cost_ns = ns > 0 ? ns : 1;
                }
            }
            charge(e, now, ns);
        }
        e->ring[i] = GS_RING_FREE;
        e->tail = (i + 1) % GS_ENG_RING;
        e->outstanding--;
    }
}

static int poll_locked(struct gs_engine *e, int64_t now)
{
    if (own_locked(e, now) != 0) return -1;
    struct gs_ds_proc *me = &e->ds->procs[e->proc];
    struct gs_ds_slice *s = &e->ds->slices[e->slice];
    me->last_seen_ns = now;
    me->heartbeat_ns = now;
    e->beat_ns = now;
    e->share_bp = s->share_bp; /* a live change (set_share) survives a re-join */
    harvest(e, now);
    if (e->outstanding > 0) {
        me->flags |= GS_DS_PROC_BUSY;
        int64_t pred = (int64_t)e->outstanding * (e->cost_ns + 2 * e->cost_dev_ns);
        if (!e->cost_ns) me->expect_idle_ns = 0;
        else if (me->expect_idle_ns == 0 || me->expect_idle_ns > now + pred) me->expect_idle_ns = now + pred;
    } else {
        me->flags &= ~GS_DS_PROC_BUSY;
        me->expect_idle_ns = 0;
    }
    struct gs_ctl_bucket b = {s->credit_ns, s->credit_last_ns};
    /* the allocation changes only when slices come and go (ACTIVE = 100 ms): once a ms is enough,
     * and it keeps the per-launch cost of a paced process down */
    if (now - e->rate_at_ns >= 1000000 || now < e->rate_at_ns) {
        e->rate_bp = gs_engine_rate(e, now);
        e->rate_at_ns = now;
        int n = 0;
        for (int i = 0; i < GS_DS_MAX_PROCS; i++) n += i != e->proc && (e->ds->procs[i].flags & GS_DS_PROC_IN_USE);
        e->others = n;
    }
    uint32_t rate = e->rate_bp;
    s->rate_bp = rate;
    /* is any process of this slice waiting for its turn? then its credit may grow past BURST
     * (alone on the device, only our own want can count: skip the scan on this per-launch path) */
    int wanting = e->others ? 0 : want_live(me, now);
    for (int i = 0; e->others && i < GS_DS_MAX_PROCS && !wanting; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        wanting = (p->flags & GS_DS_PROC_IN_USE) && p->slice == e->slice && want_live(p, now);
    }
    gs_ctl_refill(&b, now, rate, wanting ? GS_CTL_WANT_CAP_NS : GS_CTL_BURST_NS);
    s->credit_ns = b.credit_ns;
    s->credit_last_ns = b.last_ns;
    s->updated_ns = now;
    if (now - e->last_reap_ns > GS_REAP_EVERY_NS) {
        e->last_reap_ns = now;
        gs_devstate_reap_locked(e->ds, NULL);
    }
    return 0;
}

/* Light engine with nothing to harvest: only the heartbeat, every GS_ENG_BEAT_NS. */
static void beat(struct gs_engine *e, int64_t now)
{
    if (now - e->beat_ns < GS_ENG_BEAT_NS && now >= e->beat_ns) return;
    if (gs_devstate_lock(e->ds) != 0) return;
    if (own_locked(e, now) == 0) e->ds->procs[e->proc].heartbeat_ns = now;
    e->beat_ns = now;
    gs_devstate_unlock(e->ds);
}

/* Light engine with a drain record out: while it has not completed, refresh the launch time that
 * low-priority neighbours read (proc_busy: launched within PRIO_HOLD), so they keep waiting for as
 * long as the queue runs, not only PRIO_HOLD after the last launch. Cleared only if no launch armed
 * a newer record meanwhile (the generation is read before the query and again after the clear). */
static void drain_poll(struct gs_engine *e, int64_t now)
{
    if (!__atomic_load_n(&e->drain_pending, __ATOMIC_ACQUIRE)) return;
    uint32_t g0 = __atomic_load_n(&e->drain_gen, __ATOMIC_ACQUIRE);
    int q = e->ops->query_drain ? e->ops->query_drain(e->ops_ctx) : -1;
    if (q == 0) {
        __atomic_store_n(&e->ds->procs[e->proc].last_launch_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ds->slices[e->slice].last_active_ns, now, __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(&e->drain_pending, 0, __ATOMIC_RELEASE);
    if (__atomic_load_n(&e->drain_gen, __ATOMIC_ACQUIRE) != g0) __atomic_store_n(&e->drain_pending, 1, __ATOMIC_RELEASE);
}

void gs_engine_poll(struct gs_engine *e, int64_t now)
{
    if (e->light && e->outstanding == 0) {
        drain_poll(e, now);
        beat(e, now);
        return;
    }
    if (gs_devstate_lock(e->ds) != 0) return;
    poll_locked(e, now);
    gs_devstate_unlock(e->ds);
}

int64_t gs_engine_poll_delay(const struct gs_engine *e, int64_t now)
{
    if (e->outstanding > 0 || __atomic_load_n(&e->drain_pending, __ATOMIC_ACQUIRE)) return GS_CTL_POLL_NS;
    if (!e->light && e->others > 0) {
        int64_t last = __atomic_load_n(&e->ds->procs[e->proc].last_launch_ns, __ATOMIC_RELAXED);
        if (last && now - last < GS_CTL_POLL_ACTIVE_NS) return GS_CTL_POLL_NS;
    }
    return GS_CTL_IDLE_POLL_NS;
}

/* Is a high-priority slice on this device queued (work outstanding, or launched within HOLD)?
 * Returns 2 = queued now, 1 = active within PRIO_SERIAL, 0 = neither. */
static int high_priority_state(struct gs_engine *e, int64_t now)
{
    int st = 0;
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (i == e->proc || !(p->flags & GS_DS_PROC_IN_USE) || !valid_slice(p->slice)) continue;
        const struct gs_ds_slice *s = &e->ds->slices[p->slice];
        if (s->priority != 0 || s->mode == GS_CTL_OFF) continue;
        if (proc_busy(p, now)) return 2;
        if (p->last_launch_ns && now - p->last_launch_ns < GS_CTL_PRIO_SERIAL_NS) st = 1;
    }
    return st;
}

/* Does process p take part in turns with us? Same or higher priority, measured (not light). */
static int rival(struct gs_engine *e, int i, int myprio)
{
    const struct gs_ds_proc *p = &e->ds->procs[i];
    if (i == e->proc || !(p->flags & GS_DS_PROC_IN_USE) || !valid_slice(p->slice)) return 0;
    return e->ds->slices[p->slice].priority <= myprio;
}

/* Is another measured process on the device busy or waiting for a turn (someone to switch with)? */
static int rivals_present(struct gs_engine *e, int64_t now)
{
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (i == e->proc || !(p->flags & GS_DS_PROC_IN_USE)) continue;
        if ((p->flags & GS_DS_PROC_BUSY) || want_live(p, now)) return 1;
    }
    return 0;
}

/* How long to wait before starting new work while idle (0 = go). */
static int64_t turn_wait(struct gs_engine *e, int64_t now)
{
    int myprio = e->ds->slices[e->slice].priority;
    int64_t w = 0;
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (!rival(e, i, myprio) || !(p->flags & GS_DS_PROC_BUSY)) continue;
        int64_t left = p->expect_idle_ns ? p->expect_idle_ns - now - GS_CTL_TURN_EARLY_NS : GS_CTL_WAIT_MIN_NS;
        /* a busy flag not refreshed for a while belongs to a process stuck outside the driver's
         * launch path (or dead): do not wait on it forever */
        if (now - p->last_seen_ns > GS_CTL_TURN_MAX_NS) continue;
        if (left > w) w = left;
    }
    /* first come, first served: a neighbour that has waited longer goes first */
    int64_t mine = e->ds->procs[e->proc].want_since_ns;
    for (int i = 0; w == 0 && i < GS_DS_MAX_PROCS; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (!rival(e, i, myprio) || !want_live(p, now)) continue;
        if (!mine || p->want_since_ns < mine || (p->want_since_ns == mine && i < e->proc)) w = GS_CTL_WAIT_MIN_NS;
    }
    if (w == 0) return 0;
    return w < GS_CTL_WAIT_MIN_NS ? GS_CTL_WAIT_MIN_NS : (w > GS_CTL_WAIT_MAX_NS ? GS_CTL_WAIT_MAX_NS : w);
}

/* While we hold work on the device: stop adding when a rival waited TURN_MAX, or is busy too and
 * its work is predicted to go on. A rival whose predicted end has passed is finishing the work it
 * started at a hand-over (its prediction has no room for the context switch in front of it): it
 * sees our queue, predicted to go on, and stops adding itself. Yielding to it as well made two
 * slices with equal kernels hand the device over after every kernel when a switch costs about a
 * kernel (simulation: 50/50 with 200 us kernels and 200 us switches reached 56 %, not 96 %). */
static int should_yield(struct gs_engine *e, int64_t now)
{
    int myprio = e->ds->slices[e->slice].priority;
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (!rival(e, i, myprio) || now - p->last_seen_ns > GS_CTL_TURN_MAX_NS) continue;
        if ((p->flags & GS_DS_PROC_BUSY) && (p->expect_idle_ns == 0 || p->expect_idle_ns > now)) return 1;
        if (want_live(p, now) && now - p->want_since_ns > GS_CTL_TURN_MAX_NS) return 1;
    }
    return 0;
}

/* For an unpaced process (share 0/100 % or mode off): measure with events only while a neighbour
 * needs to know when our queue is really empty: a high-priority process only for active
 * low-priority slices (they yield to it), a low-priority one for any other active slice (it yields
 * and takes turns). Alone, one store per launch is enough: this is the 100 % path whose overhead
 * the benchmark measures. Mode off never measures. Re-decided every LIGHT_RECHECK. Returns whether
 * to take the light path. */
#define GS_LIGHT_RECHECK_NS 10000000LL
static int mode_recheck(struct gs_engine *e, int64_t now)
{
    const struct gs_ds_slice *mine = &e->ds->slices[e->slice];
    if (mine->mode == GS_CTL_OFF) return 1;
    if (now - e->light_check_ns < GS_LIGHT_RECHECK_NS) return e->light;
    e->light_check_ns = now;
    int need = 0, low_active = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES && !need; i++) {
        if (i == e->slice) continue;
        const struct gs_ds_slice *s = &e->ds->slices[i];
        int64_t la = __atomic_load_n(&s->last_active_ns, __ATOMIC_RELAXED);
        if (!(s->flags & GS_DS_SLICE_IN_USE) || s->mode == GS_CTL_OFF || !la || now - la >= GS_CTL_ACTIVE_NS) continue;
        need = mine->priority != 0 || (!GS_CTL_PRIO_HIGH_LIGHT && s->priority != 0);
        low_active |= s->priority != 0;
    }
    __atomic_store_n(&e->drain_wanted, GS_CTL_PRIO_HIGH_LIGHT && mine->priority == 0 && low_active, __ATOMIC_RELAXED);
    /* leave the measured mode only with nothing outstanding, so our busy flag is cleared first */
    e->light = !need && e->outstanding == 0;
    return e->light;
}

/* How long a launch must wait now (0: go), under the state lock: a low-priority process yields to
 * high-priority work, a paced one to its credit, and every process takes its turn. */
static int64_t wait_locked(struct gs_engine *e, struct gs_ds_slice *s, struct gs_ds_proc *me, int64_t now)
{
    int64_t wait = 0;
    /* a process that joins is seen within a ms (the recount); until then its own first launches
     * find us through its scans, which is enough to start the turns */
    if (s->priority != 0 && e->others) {
        int hp = high_priority_state(e, now);
        if (hp == 2) wait = GS_PRIO_POLL_NS;                                /* yield while high is queued */
        else if (hp == 1 && e->outstanding > 0 &&
                 (e->cost_ns == 0 || (int64_t)(e->outstanding + 1) * e->cost_ns > GS_CTL_PRIO_QUEUE_NS))
            wait = GS_CTL_WAIT_MIN_NS; /* little low-priority work in flight */
    }
    if (wait == 0 && s->paced) {
        struct gs_ctl_bucket b = {s->credit_ns, s->credit_last_ns};
        /* P term: the queue predicted at the long-run mean cost (see cost_avg_ns); until the first
         * pair is measured the cost is unknown: one launch at a time */
        int64_t need = (int64_t)e->outstanding * e->cost_avg_ns;
        if (e->outstanding == 0 && e->others && rivals_present(e, now)) need += GS_CTL_TURN_MIN_NS; /* worth a switch */
        if (e->cost_ns == 0 && e->outstanding > 0) wait = GS_CTL_WAIT_MIN_NS;
        else wait = gs_ctl_gate(&b, s->rate_bp, need);
        if (wait > 0) me->want_since_ns = 0; /* not ready: hold no place in the turn queue */
    }
    if (wait == 0) {
        int64_t t = !e->others ? 0
                    : e->outstanding > 0 ? (should_yield(e, now) ? GS_CTL_WAIT_MIN_NS : 0)
                                         : turn_wait(e, now);
        if (t > 0) {
            wait = t;
            if (e->outstanding == 0 && !me->want_since_ns) me->want_since_ns = now;
            me->want_seen_ns = now;
        }
    }
    if (wait == 0 && e->outstanding >= GS_ENG_RING) wait = GS_CTL_WAIT_MIN_NS; /* ring full */
    return wait;
}

/* Launch now, under the state lock: reserve the next ring slot and publish that we are busy. */
static void launch_locked(struct gs_engine *e, struct gs_ds_slice *s, struct gs_ds_proc *me, int64_t now, int *slot)
{
    me->want_since_ns = 0;
    int i = e->head;
    e->ring[i] = GS_RING_RESERVED;
    e->head = (i + 1) % GS_ENG_RING;
    e->outstanding++;
    *slot = i;
    me->flags |= GS_DS_PROC_BUSY;
    if (e->cost_ns)
        me->expect_idle_ns = (me->expect_idle_ns > now ? me->expect_idle_ns : now) + e->cost_ns + 2 * e->cost_dev_ns;
    me->last_launch_ns = now;
    s->last_active_ns = now;
    s->launches++;
}

int64_t gs_engine_before(struct gs_engine *e, int64_t now, void *stream, int64_t slept_ns, int *slot)
{
    struct gs_ds_slice *s = &e->ds->slices[e->slice];
    struct gs_ds_proc *me = &e->ds->procs[e->proc];
    *slot = -1;
    if (e->light_base && mode_recheck(e, now)) {
        /* no lock: two aligned stores that readers treat as hints */
        __atomic_store_n(&me->last_launch_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
        if (now - e->beat_ns >= GS_ENG_BEAT_NS) beat(e, now); /* also without a poller thread */
        return 0;
    }
    /* checked only here, on the measured path: the light path must stay a couple of stores */
    if (e->ops->capturing && e->ops->capturing(e->ops_ctx, stream)) return 0;
    if (gs_devstate_lock(e->ds) != 0) return 0; /* never block the program on our own failure */
    if (poll_locked(e, now) != 0) {
        gs_devstate_unlock(e->ds); /* no record to publish in (state file full): unpaced */
        return 0;
    }
    s = &e->ds->slices[e->slice]; /* a re-join may have moved us */
    me = &e->ds->procs[e->proc];
    if (slept_ns > 0) {
        s->throttled_total_ns += (uint64_t)slept_ns;
        window_add(s, now, 0, slept_ns);
    }
    int64_t wait = wait_locked(e, s, me, now);
    if (wait == 0) {
        launch_locked(e, s, me, now, slot);
    } else {
        /* wanting to launch is activity: a throttled slice keeps its claim on capacity */
        s->last_active_ns = now;
    }
    gs_devstate_unlock(e->ds);
    /* Event records go outside the lock: a record can block while the launch queue is full, and a
     * neighbour must never wait on our queue for the lock. The reserved slot stops the harvest. */
    if (*slot >= 0 && e->ops->record_start(e->ops_ctx, *slot, stream) != 0) {
        __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ring[*slot], GS_RING_VOID, __ATOMIC_RELEASE); /* as in gs_engine_after */
        *slot = -1;
    }
    return wait;
}

void gs_engine_after(struct gs_engine *e, void *stream, int slot, int ok)
{
    if (slot < 0 && ok && e->light && __atomic_load_n(&e->drain_wanted, __ATOMIC_RELAXED) && e->ops->record_drain) {
        /* record, then bump the generation, then arm: see gs_engine_poll for the other side */
        if (e->ops->record_drain(e->ops_ctx, stream) == 0) {
            __atomic_fetch_add(&e->drain_gen, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&e->drain_pending, 1, __ATOMIC_RELEASE);
        }
        return;
    }
    if (slot < 0 || slot >= GS_ENG_RING) return;
    int rec = ok ? e->ops->record_end(e->ops_ctx, slot, stream) : -1;
    /* No lock: the slot is RESERVED, owned by this launch until this one store. The harvest stops at
     * a RESERVED slot and reads the state with an acquire load, so it sees the end event recorded
     * before it sees RECORDED. (This saved a lock round trip per measured launch; the lock's cache
     * line is shared with every process on the device.) */
    if (rec != 0 && ok) __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
    /* launch refused (or no end event): nothing ran */
    __atomic_store_n(&e->ring[slot], rec == 0 ? GS_RING_RECORDED : GS_RING_VOID, __ATOMIC_RELEASE);
}

void gs_engine_fini(struct gs_engine *e)
{
    if (!e->ds) return;
    if (gs_devstate_lock(e->ds) == 0) {
        const struct gs_ds_proc *p = &e->ds->procs[e->proc];
        /* leave only a record that is still ours (a reaper may have given it to someone else) */
        if ((p->flags & GS_DS_PROC_IN_USE) && p->pid == e->pid && p->id == e->id && p->joined_ns == e->joined_ns)
            gs_devstate_leave_locked(e->ds, e->proc);
        gs_devstate_unlock(e->ds);
    }
    e->ds = NULL;
}
