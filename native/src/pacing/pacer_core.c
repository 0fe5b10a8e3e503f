/* gpuslice pacer engine (see gpuslice/pacer_core.h, README-compute.md).
 *
 * Charging: a paced launch is charged to its slice's credit when it is made, at the learned cost of
 * its kernel shape (costmodel.h; the process's mean for a shape not seen yet). Launches that carry an
 * event pair (every one on the turns and priority paths, 1 in 16 per shape on the free path) are
 * corrected when the pair completes, to what the kernel cost alone (pairs.c):
 *   - a pair whose start event had already run when the launch call returned started on an empty
 *     queue: it also holds the time the kernel took to reach the GPU (the launch call, 3-10 us on a
 *     GPU; the sampled launch goes through the state lock first). For a launch-bound loop of 5-20 us
 *     kernels that was 1.3-2x the kernel (issue 12: ResNet-50 charged 1.6-1.8x its GPU time alone),
 *     so that time, from the start record to the launch's return, is taken off;
 *   - clean (no other process launched around it): charged as measured (less that gap);
 *   - otherwise charged the shape's learned cost, which ignores pairs inflated by a neighbour's time
 *     slice (a floor of the shape's recent samples: inflation only ever adds).
 * So overlapping contexts are charged what their own kernels cost, never the wall time they waited,
 * and most launch-bound launches cost one atomic subtraction.
 *
 * The credit is shared by the processes of a slice through the state file; launches subtract from it
 * without the lock (atomic), refills and corrections are compare-and-swap under it. Everything else
 * a launch changes is process-local and published by the poller (or the slow path) under the lock. */
#include "gpuslice/pacer_core.h"
#include <stdio.h>
#include <string.h>

#define GS_REAP_EVERY_NS 1000000000LL
/* an engine with nothing to harvest still refreshes its heartbeat this often (GS_DS_HEARTBEAT_NS is
 * the promise to other namespaces; beating 4x as often leaves room for a late poller) */
#define GS_ENG_BEAT_NS (GS_DS_HEARTBEAT_NS / 4)

static int64_t clamp_add_u64(uint64_t *x, int64_t d)
{
    if (d < 0 && (uint64_t)(-d) > *x) d = -(int64_t)*x;
    *x += (uint64_t)d;
    return d;
}

static int64_t take(int64_t *x) { return __atomic_exchange_n(x, 0, __ATOMIC_RELAXED); }
static void add(int64_t *x, int64_t d) { __atomic_fetch_add(x, d, __ATOMIC_RELAXED); }

int64_t *gs_eng_credit(struct gs_engine *e)
{
    return e->credit_home ? &e->credit_home[0] : &gs_ds_slice(e->ds, e->slice)->credit_ns;
}

int64_t *gs_eng_credit_last(struct gs_engine *e)
{
    return e->credit_home ? &e->credit_home[1] : &gs_ds_slice(e->ds, e->slice)->credit_last_ns;
}

struct gs_ctl_bucket gs_eng_bucket(struct gs_engine *e)
{
    struct gs_ctl_bucket b = {__atomic_load_n(gs_eng_credit(e), __ATOMIC_RELAXED), *gs_eng_credit_last(e)};
    return b;
}

/* credit -= ns, clamped (gs_ctl_charged), against concurrent lock-free launches */
static void credit_charge(int64_t *credit, int64_t ns)
{
    int64_t old = __atomic_load_n(credit, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(credit, &old, gs_ctl_charged(old, ns), 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void credit_refill(int64_t *credit, int64_t add_ns, int64_t cap_ns)
{
    int64_t old = __atomic_load_n(credit, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(credit, &old, gs_ctl_refilled(old, add_ns, cap_ns), 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
}

int gs_engine_set_credit_home(struct gs_engine *e, int64_t *home)
{
    if (gs_devstate_lock(e->ds) != 0) return -1;
    int others = 0;
    for (int i = 0; e->slice >= 0 && i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        others += i != e->proc && (p->flags & GS_DS_PROC_IN_USE) && gs_ds_proc_slice(i) == e->slice;
    }
    /* the slice starts here: no debt or clock left from an earlier life of its region. Not on a private copy,
     * which sees none of its slice-mates: each new process would wipe the slice's debt (review of issue 15) */
    if (!others && !(e->slice >= 0 && e->ds->slot[e->slice].private_copy)) {
        __atomic_store_n(&home[0], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&home[1], 0, __ATOMIC_RELAXED);
    }
    e->credit_home = home;
    gs_devstate_unlock(e->ds);
    return 0;
}

static void set_flag(struct gs_ds_proc *p, uint32_t f, int on)
{
    if (on) __atomic_fetch_or(&p->flags, f, __ATOMIC_RELAXED);
    else __atomic_fetch_and(&p->flags, ~f, __ATOMIC_RELAXED);
}

/* Under the lock: what the slice record says about co-location (join_locked does not know it). */
static void stamp_slice(struct gs_engine *e)
{
    struct gs_ds_slice *s = gs_ds_slice(e->ds, e->slice);
    s->colocation = (uint8_t)e->colocation;
    if (e->paced) s->paced = 1;
}

static void mark_identity(struct gs_engine *e, struct gs_ds_proc *me, int64_t now)
{
    me->last_seen_ns = now;
    me->heartbeat_ns = now;
    me->path = (uint8_t)e->path;
    me->offered_bp = e->offered_bp;
    set_flag(me, GS_DS_PROC_LIGHT, e->path == GS_DS_PATH_LIGHT);
    set_flag(me, GS_DS_PROC_TURNS, e->path == GS_DS_PATH_TURNS);
}

int gs_engine_init(struct gs_engine *e, struct gs_devstate *ds, const char *grant, uint32_t share_bp,
                   int mode, int weight, int priority, int32_t pid, uint32_t id,
                   const struct gs_gpu_ops *ops, void *ops_ctx, int64_t now)
{
    memset(e, 0, sizeof *e);
    e->poller_cold = 1; /* until the poller first says how long it sleeps: a wake too many is harmless */
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
    /* Unpaced processes need no measurement: neighbours only need "has it launched lately", which is
     * one store. This keeps the 0 and 100 % paths at a few ns per launch. */
    e->light_base = !paced;
    e->path = paced ? GS_DS_PATH_FREE : GS_DS_PATH_LIGHT;
    /* a low-priority process may take the yield path (preemptive, the default), which predicts its
     * queue from kernel costs: it learns them too */
    if ((paced || priority != 0) && gs_cost_init(&e->cm) != 0) e->cm.slot = NULL; /* no table: every shape at the mean */
    e->ol_start_ns = now;
    gs_eng_policy_refresh(e, now); /* before the first launch: neighbours' claims are not taken meanwhile */
    if (gs_devstate_lock(ds) != 0) {
        gs_cost_free(&e->cm);
        return -1;
    }
    int rc = gs_devstate_join_locked(ds, grant, share_bp, mode, weight, priority, paced, pid, id, &e->slice, &e->proc);
    if (rc == 0) {
        gs_ds_slice(ds, e->slice)->updated_ns = now;
        gs_eng_policy_locked(e, gs_ds_slice(ds, e->slice));
        e->joined_ns = gs_ds_proc(ds, e->proc)->joined_ns;
        mark_identity(e, gs_ds_proc(ds, e->proc), now);
    }
    gs_devstate_unlock(ds);
    if (rc != 0) gs_cost_free(&e->cm);
    e->last_reap_ns = now;
    e->beat_ns = now;
    return rc;
}

int gs_engine_set_colocation(struct gs_engine *e, int colocation, const struct gs_tidal *tidal, int base_pct)
{
    e->colocation = colocation;
    e->tidal_base_pct = base_pct;
    if (tidal) e->tidal = *tidal;
    int costs = 0;
    if (colocation == GS_COLOC_TIDAL && e->mode != GS_CTL_OFF && !e->paced) {
        /* a tidal slice is held at its tide, whatever its compute share */
        e->paced = 1;
        e->light_base = 0;
        e->path = GS_DS_PATH_FREE;
        costs = 1;
    }
    if (costs && !e->cm.slot && gs_cost_init(&e->cm) != 0) e->cm.slot = NULL; /* every shape at the mean */
    if (gs_devstate_lock(e->ds) != 0) return -1;
    if (e->slice >= 0 && e->proc >= 0) {
        stamp_slice(e);
        mark_identity(e, gs_ds_proc(e->ds, e->proc), e->beat_ns);
    }
    e->path_check_ns = 0; /* decide the path at the first launch */
    gs_devstate_unlock(e->ds);
    return 0;
}

/* Under the lock: is our process record still ours? A reaper in another PID namespace frees a
 * record whose heartbeat went stale (this process was stopped, or its poller starved for
 * GS_DS_STALE_NS); then join again rather than write into a record someone else may hold.
 * 0 = we hold a record; -1 = none could be had (the caller publishes nothing). */
static int own_locked(struct gs_engine *e, int64_t now)
{
    const struct gs_ds_proc *p = gs_ds_proc(e->ds, e->proc);
    if ((p->flags & GS_DS_PROC_IN_USE) && p->pid == e->pid && p->id == e->id && p->joined_ns == e->joined_ns &&
        p->pidns == gs_devstate_pidns())
        return 0;
    int s, q, old = e->slice;
    if (gs_devstate_join_locked(e->ds, e->grant, e->share_bp, e->mode, e->weight, e->priority, e->paced, e->pid, e->id,
                                &s, &q) != 0)
        return -1;
    gs_devstate_unpin_locked(e->ds, old); /* the join pinned the slot it used; the old pin goes (same slot: kept once) */
    struct gs_ds_proc *me = gs_ds_proc(e->ds, q);
    e->slice = s;
    e->proc = q;
    e->joined_ns = me->joined_ns;
    e->rejoins++;
    e->rate_at_ns = 0; /* recount neighbours and the allocation now */
    mark_identity(e, me, now);
    stamp_slice(e);
    return 0;
}

uint32_t gs_engine_rate(struct gs_engine *e, int64_t now)
{
    struct gs_ctl_slice in[GS_DS_MAX_SLICES];
    uint32_t out[GS_DS_MAX_SLICES];
    uint8_t use[GS_DS_MAX_SLICES] = {0};
    int64_t last[GS_DS_MAX_SLICES] = {0};
    int map = -1, n = 0;
    /* The records gs_eng_policy_locked packed just before, and no others: a record's flag and name are
     * read once, there. One entry per grant, however many records name it (enginepolicy.c canonical); a
     * grant is active when any of its records launched lately. A launch time ahead of now is forged (the
     * clock is the system's monotonic one in every process) and counts for nothing. */
    int nsl = gs_ds_nslices(e->ds);
    for (int i = 0; i < nsl; i++) {
        if (i != e->slice && !__atomic_load_n(&e->pol_pack[i], __ATOMIC_RELAXED)) continue;
        int c = i == e->slice ? i : e->pol_canon[i];
        if (c < 0 || c >= GS_DS_MAX_SLICES) continue;
        use[i] = c == i;
        int64_t la = __atomic_load_n(&gs_ds_slice(e->ds, i)->last_active_ns, __ATOMIC_RELAXED);
        if (la > now) la = 0;
        if (la > last[c]) last[c] = la;
    }
    for (int i = 0; i < nsl; i++) {
        if (!use[i]) continue;
        if (i == e->slice) map = n;
        struct gs_pol p; /* ours: the engine's own; another: its pack (non-zero, or the first loop skipped it) */
        if (i == e->slice) p = gs_eng_pol(e, i);
        else gs_pol_unpack(__atomic_load_n(&e->pol_pack[i], __ATOMIC_RELAXED), &p);
        in[n].share_bp = p.share_bp;
        in[n].mode = p.mode;
        in[n].weight = p.weight;
        in[n].priority = p.priority;
        in[n].active = i == e->slice || (last[i] && now - last[i] < GS_CTL_ACTIVE_NS);
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

/* Harvest completed pairs in launch order; stop at the first one still running. Each corrects its
 * launch's charge from the cost charged then to what it really cost. */
static void harvest(struct gs_engine *e)
{
    int64_t *credit = gs_eng_credit(e);
    struct gs_eng_others o = {0, 0, 0};
    while (e->outstanding > 0) {
        int i = e->tail;
        /* gs_engine_after flips RESERVED to RECORDED/VOID without the lock (release store) */
        uint8_t st = __atomic_load_n(&e->ring[i], __ATOMIC_ACQUIRE);
        if (st == GS_RING_RESERVED) break; /* its launch is in progress on another thread */
        if (st == GS_RING_RECORDED) {
            int q = e->ops->query_end(e->ops_ctx, i);
            if (q == 0) break;
            int64_t ns = q > 0 ? e->ops->elapsed(e->ops_ctx, i) : -1;
            int64_t cost;
            if (ns < 0) {
                /* an event failed: the charge made at launch stands */
                __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
                cost = e->ring_charged[i];
            } else {
                cost = gs_eng_account_pair(e, i, ns, &o);
            }
            int64_t d = cost - e->ring_charged[i];
            if (d) {
                credit_charge(credit, d);
                add(&e->pub_charged, d);
            }
        }
        e->ring[i] = GS_RING_FREE;
        e->tail = (i + 1) % GS_ENG_RING;
        e->outstanding--;
    }
}

/* Under the lock: what the launching threads summed since the last poll goes into the slice. */
static void publish(struct gs_engine *e, struct gs_ds_slice *s, struct gs_ds_proc *me, int64_t now)
{
    int64_t charged = take(&e->pub_charged), throttled = take(&e->pub_throttled);
    s->launches += (uint64_t)take(&e->pub_launches);
    if (throttled > 0) s->throttled_total_ns += (uint64_t)throttled;
    charged = clamp_add_u64(&s->busy_total_ns, charged);
    clamp_add_u64(&me->busy_total_ns, charged);
    window_add(s, now, charged, throttled);
}

/* Under the lock, every LOAD_WINDOW with at least LOAD_MIN_LAUNCHES launches (a throttled process
 * with long kernels launches rarely: its window grows, up to 10 x, rather than being dropped): the
 * offered load of the window, and whether to take turns. */
static void classify(struct gs_engine *e, struct gs_ds_proc *me, int64_t now)
{
    int64_t age = now - e->ol_start_ns;
    if (age < GS_CTL_LOAD_WINDOW_NS && age >= 0) return;
    int64_t n = __atomic_load_n(&e->ol_launches, __ATOMIC_RELAXED);
    if (n < GS_CTL_LOAD_MIN_LAUNCHES && age < 10 * GS_CTL_LOAD_WINDOW_NS && age >= 0) return;
    e->ol_start_ns = now;
    int64_t cost = take(&e->ol_cost), cpu = take(&e->ol_cpu);
    n = take(&e->ol_launches);
    if (n < 2) return; /* nothing to say: keep what we had */
    int64_t bp = cost * GS_BP_FULL / (cpu > 1000 ? cpu : 1000);
    e->offered_bp = (uint32_t)(bp > 100 * GS_BP_FULL ? 100 * GS_BP_FULL : bp < 0 ? 0 : bp);
    me->offered_bp = e->offered_bp;
    if (e->paced) __atomic_store_n(&e->turns, gs_ctl_takes_turns(e->turns, e->offered_bp), __ATOMIC_RELAXED);
}

static int poll_locked(struct gs_engine *e, int64_t now)
{
    if (own_locked(e, now) != 0) return -1;
    struct gs_ds_proc *me = gs_ds_proc(e->ds, e->proc);
    struct gs_ds_slice *s = gs_ds_slice(e->ds, e->slice);
    me->last_seen_ns = now;
    me->heartbeat_ns = now;
    e->beat_ns = now;
    harvest(e);
    if (e->outstanding > 0) {
        set_flag(me, GS_DS_PROC_BUSY, 1);
        int64_t pred = (int64_t)e->outstanding * (e->cost_ns + 2 * e->cost_dev_ns);
        if (!e->cost_ns) me->expect_idle_ns = 0;
        else if (me->expect_idle_ns == 0 || me->expect_idle_ns > now + pred) me->expect_idle_ns = now + pred;
    } else {
        set_flag(me, GS_DS_PROC_BUSY, 0);
        me->expect_idle_ns = 0;
    }
    publish(e, s, me, now);
    classify(e, me, now);
    gs_coloc_tidal_locked(e, s, now);
    /* the allocation changes only when slices come and go (ACTIVE = 100 ms): once a ms is enough */
    if (now - e->rate_at_ns >= 1000000 || now < e->rate_at_ns) {
        /* our share, mode and priority (a live resize comes through the roster) and everyone else's */
        gs_eng_policy_locked(e, s);
        e->rate_bp = gs_engine_rate(e, now);
        e->rate_at_ns = now;
        int n = 0;
        for (int i = 0; i < gs_ds_nprocs(e->ds); i++) n += i != e->proc && (gs_ds_proc(e->ds, i)->flags & GS_DS_PROC_IN_USE);
        e->others = n;
    }
    uint32_t rate = e->rate_bp;
    s->rate_bp = rate;
    /* is a process of this slice waiting for its turn? then its credit may grow past BURST (only
     * turn-taking processes wait for turns; alone, only our own want can count) */
    int wanting = 0;
    if (e->path == GS_DS_PATH_TURNS) {
        wanting = gs_eng_want_live(me, now);
        for (int i = 0; e->others && i < gs_ds_nprocs(e->ds) && !wanting; i++) {
            const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
            wanting = (p->flags & GS_DS_PROC_IN_USE) && gs_ds_proc_slice(i) == e->slice && gs_eng_want_live(p, now);
        }
    }
    int64_t *credit = gs_eng_credit(e);
    credit_refill(credit, gs_ctl_accrue(gs_eng_credit_last(e), now, rate), wanting ? GS_CTL_WANT_CAP_NS : GS_CTL_BURST_NS);
    if (rate >= GS_BP_FULL) {
        /* allowed the whole device (a soft slice alone): nothing is held back, and no debt may pile up
         * from costs charged a little above the wall time (two streams, a launch gap), or the slice
         * would be starved for seconds once a neighbour arrives and its rate drops */
        int64_t c = __atomic_load_n(credit, __ATOMIC_RELAXED);
        while (c < -GS_CTL_BURST_NS &&
               !__atomic_compare_exchange_n(credit, &c, -GS_CTL_BURST_NS, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
    }
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
    if (own_locked(e, now) == 0) gs_ds_proc(e->ds, e->proc)->heartbeat_ns = now;
    e->beat_ns = now;
    gs_devstate_unlock(e->ds);
}

void gs_engine_poll(struct gs_engine *e, int64_t now)
{
    gs_eng_policy_refresh(e, now);
    gs_coloc_drain_poll(e, now);
    gs_coloc_harvest(e, now);
    if (__atomic_load_n(&e->path, __ATOMIC_RELAXED) == GS_DS_PATH_LIGHT && e->outstanding == 0) {
        gs_eng_policy_forget(e); /* no recount keeps the packs fresh from here */
        beat(e, now);
        return;
    }
    if (gs_devstate_lock(e->ds) != 0) return;
    poll_locked(e, now);
    gs_devstate_unlock(e->ds);
}

static int64_t poll_delay(const struct gs_engine *e, int64_t now)
{
    int path = __atomic_load_n(&e->path, __ATOMIC_RELAXED);
    int64_t last = __atomic_load_n(&gs_ds_proc(e->ds, e->proc)->last_launch_ns, __ATOMIC_RELAXED);
    int active = last && now - last < GS_CTL_POLL_ACTIVE_NS;
    if (__atomic_load_n(&e->drain_pending, __ATOMIC_ACQUIRE)) return gs_coloc_drain_delay(e, now);
    /* hot: the next launch's drain record is looked at within a tick, without a wake. Light path only: a
     * free-path poll takes the device lock (it is woken instead), a turns engine records no drains. A launch
     * stamped after `now` (read before this poll) counts as just made */
    if (path == GS_DS_PATH_LIGHT && __atomic_load_n(&e->drain_wanted, __ATOMIC_RELAXED) && last > 0 && now > 0 &&
        now - last < GS_CTL_DRAIN_HOT_NS && last - now < GS_CTL_DRAIN_HOT_NS)
        return GS_CTL_DRAIN_SPIN_NS;
    /* the free path needs no fresh busy flag (nobody takes turns with it, and a stale flag only makes a
     * neighbour's pair count as not clean): its poller publishes, refills and harvests every ms */
    if (path == GS_DS_PATH_FREE) return e->outstanding > 0 || active ? GS_CTL_POLL_FREE_NS : GS_CTL_IDLE_POLL_NS;
    if (e->outstanding > 0 || __atomic_load_n(&e->mcount, __ATOMIC_RELAXED) > 0) return GS_CTL_POLL_NS;
    if (path != GS_DS_PATH_LIGHT && e->others > 0 && active) return GS_CTL_POLL_NS;
    return GS_CTL_IDLE_POLL_NS;
}

int64_t gs_engine_poll_delay(struct gs_engine *e, int64_t now)
{
    int64_t w = poll_delay(e, now);
    if (w <= GS_CTL_DRAIN_POLL_NS) {
        __atomic_store_n(&e->poller_cold, 0, __ATOMIC_SEQ_CST);
        return w;
    }
    /* a long sleep: say so, then look at drain_pending once more. A launch arms, then reads poller_cold
     * (gs_engine_after): of the two, at least one sees the other's store, so an armed record is either
     * looked at soon or wakes the poller */
    __atomic_store_n(&e->poller_cold, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&e->drain_pending, __ATOMIC_SEQ_CST)) return w;
    __atomic_store_n(&e->poller_cold, 0, __ATOMIC_SEQ_CST);
    return gs_coloc_drain_delay(e, now);
}

/* What a launch of `key` will be charged, and whether it carries an event pair. */
static int64_t price(struct gs_engine *e, uint64_t key, int *sample)
{
    struct gs_cost_entry *en = gs_cost_find(&e->cm, key);
    if (en) {
        *sample = gs_cost_should_sample(en);
        return __atomic_load_n(&en->mean_ns, __ATOMIC_RELAXED);
    }
    /* a new shape is learned (its first launches measured) while the table has room; beyond that, or
     * for a launch without a shape, 1 in 16 keeps the mean honest */
    int room = e->cm.slot && e->cm.used < GS_COST_SLOTS / 4 * 3 && key;
    *sample = room || __atomic_add_fetch(&e->unknown_seen, 1, __ATOMIC_RELAXED) % GS_COST_SAMPLE_EVERY == 0;
    return __atomic_load_n(&e->cost_avg_ns, __ATOMIC_RELAXED);
}

/* A launch goes: the launch-side sums (lock-free) and the offered load's CPU gap. */
static void count_launch(struct gs_engine *e, int64_t now, int64_t charge, struct gs_ticket *t)
{
    add(&e->pub_launches, 1);
    __atomic_add_fetch(&e->st_launches, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&e->st_launch_charged_ns, charge, __ATOMIC_RELAXED);
    add(&e->ol_launches, 1);
    add(&e->ol_cost, charge);
    int64_t prev = __atomic_exchange_n(&e->last_before_ns, now, __ATOMIC_RELAXED);
    int64_t after = __atomic_load_n(&e->last_after_ns, __ATOMIC_RELAXED);
    /* CPU between launches: from the end of the previous launch call (or its start when that is not
     * known) to this one, less our own sleeps; a synchronize or think time counts as GAP_CAP */
    int64_t from = after > prev ? after : prev;
    int64_t gap = prev ? now - from - t->slept_total : 0;
    gap = gap < 0 ? 0 : gap > GS_CTL_GAP_CAP_NS ? GS_CTL_GAP_CAP_NS : gap;
    int64_t call = after > prev && prev ? after - prev : 0; /* the previous call's own time */
    add(&e->ol_cpu, gap + (call > GS_CTL_CALL_CPU_NS ? GS_CTL_CALL_CPU_NS : call));
    t->charged = charge;
}

/* Launch now, under the state lock: charge it, and with `measure` reserve the next pair. */
static void launch_locked(struct gs_engine *e, struct gs_ds_slice *s, struct gs_ds_proc *me, int64_t now, uint64_t key,
                          int64_t charge, int measure, struct gs_ticket *t)
{
    me->want_since_ns = 0;
    credit_charge(gs_eng_credit(e), charge);
    add(&e->pub_charged, charge);
    count_launch(e, now, charge, t);
    if (measure && e->outstanding < GS_ENG_RING) {
        int i = e->head;
        e->ring[i] = GS_RING_RESERVED;
        e->ring_key[i] = key;
        e->ring_charged[i] = charge;
        e->ring_launch_ns[i] = now;
        e->ring_rs_ns[i] = now;
        e->ring_gap_ns[i] = 0;
        e->head = (i + 1) % GS_ENG_RING;
        e->outstanding++;
        t->slot = i;
        set_flag(me, GS_DS_PROC_BUSY, 1);
        if (e->cost_ns)
            me->expect_idle_ns = (me->expect_idle_ns > now ? me->expect_idle_ns : now) + e->cost_ns + 2 * e->cost_dev_ns;
    }
    __atomic_store_n(&me->last_launch_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
}

/* The free path without the lock: charge, and go if the credit covers it. 1 = launched. */
static int free_fast(struct gs_engine *e, int64_t now, int64_t charge, struct gs_ticket *t)
{
    struct gs_ds_slice *s = gs_ds_slice(e->ds, e->slice);
    /* the launch may go while the credit before it (everything queued already charged) plus
     * LOOKAHEAD is not negative: the same gate as gs_ctl_gate with nothing more needed */
    int64_t *credit = gs_eng_credit(e);
    int64_t c = __atomic_sub_fetch(credit, charge, __ATOMIC_RELAXED);
    if (c + charge + GS_CTL_LOOKAHEAD_NS < 0 && e->rate_bp < GS_BP_FULL) {
        __atomic_add_fetch(credit, charge, __ATOMIC_RELAXED); /* not ours to spend: the slow path decides */
        return 0;
    }
    add(&e->pub_charged, charge);
    count_launch(e, now, charge, t);
    __atomic_store_n(&gs_ds_proc(e->ds, e->proc)->last_launch_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
    return 1;
}

/* whether `stream` is being captured into a CUDA graph (ops without the question: never) */
static int capturing(struct gs_engine *e, void *stream)
{
    return e->ops->capturing && e->ops->capturing(e->ops_ctx, stream);
}

int64_t gs_engine_before(struct gs_engine *e, int64_t now, void *stream, uint64_t key, int64_t slept_ns,
                         struct gs_ticket *t)
{
    /* the sleep since the last call followed its wait: the yield gate's (the only one with a why) is counted by
     * why it held */
    if (slept_ns > 0 && t->yield_why > GS_YW_NONE && t->yield_why < GS_YW_N)
        add(&e->st_yield_ns[t->yield_why], slept_ns);
    t->slot = -1;
    t->charged = 0;
    t->yield = 0;
    t->yield_held = 0;
    t->yield_why = GS_YW_NONE;
    t->captured = -1;
    t->slept_total = slept_ns > 0 ? t->slept_total + slept_ns : 0;
    int path = gs_eng_path(e, now);
    if (path == GS_DS_PATH_LIGHT) {
        /* A process whose neighbours yield to it asks whether the stream is being captured: such a launch is
         * no queue to yield to (stamped, it held a yielding trainer through a whole capture phase, launch by
         * launch up to YIELD_GAP after each) and gets no drain record (gs_engine_after). Others stay a couple
         * of stores: two aligned ones that readers treat as hints */
        if (__atomic_load_n(&e->drain_wanted, __ATOMIC_RELAXED)) t->captured = capturing(e, stream);
        if (t->captured != 1) __atomic_store_n(&gs_ds_proc(e->ds, e->proc)->last_launch_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&gs_ds_slice(e->ds, e->slice)->last_active_ns, now, __ATOMIC_RELAXED);
        if (now - e->beat_ns >= GS_ENG_BEAT_NS) beat(e, now); /* also without a poller thread */
        return 0;
    }
    t->captured = capturing(e, stream);
    if (t->captured) return 0;
    if (slept_ns > 0) add(&e->pub_throttled, slept_ns);
    int yield = path == GS_DS_PATH_YIELD;
    if (yield) {
        /* lock-free: a preemptive high-priority neighbour queued, or our own queue at its bound */
        int why;
        int64_t w = gs_coloc_yield_gate(e, now, &why);
        if (w > 0) {
            __atomic_store_n(&gs_ds_slice(e->ds, e->slice)->last_active_ns, now, __ATOMIC_RELAXED); /* wanting is activity */
            t->yield_held = 1;
            t->yield_why = why;
            return w;
        }
    }
    /* the yield path predicts its queue from kernel costs, paced or not */
    int costs = e->paced || yield, sample = 1;
    int64_t charge = costs ? price(e, key, &sample) : 0;
    int first = costs && __atomic_load_n(&e->cost_avg_ns, __ATOMIC_RELAXED) == 0; /* nothing measured yet */
    /* held by its credit like a free one (an unpaced one is never refused there: rate = the device) */
    int credit_gate = path == GS_DS_PATH_FREE || yield;
    if (credit_gate && !sample && !first && free_fast(e, now, charge, t)) {
        if (yield) {
            gs_coloc_yield_commit(e, now, charge);
            t->yield = 1;
        }
        return 0;
    }
    if (gs_devstate_lock(e->ds) != 0) return 0; /* never block the program on our own failure */
    if (poll_locked(e, now) != 0) {
        gs_devstate_unlock(e->ds); /* no record to publish in (state file full): unpaced */
        return 0;
    }
    struct gs_ds_slice *s = gs_ds_slice(e->ds, e->slice); /* a re-join may have moved us */
    struct gs_ds_proc *me = gs_ds_proc(e->ds, e->proc);
    int measure = !credit_gate || sample || first;
    int64_t wait;
    if (credit_gate) {
        /* our own credit and rate, never what a neighbour may have written into our record */
        struct gs_ctl_bucket b = gs_eng_bucket(e);
        wait = first && e->outstanding > 0 ? GS_CTL_WAIT_MIN_NS : gs_ctl_gate(&b, e->rate_bp, 0);
    } else {
        wait = gs_eng_wait_locked(e, me, now);
    }
    if (wait == 0) {
        launch_locked(e, s, me, now, key, charge, measure, t);
        if (yield) {
            gs_coloc_yield_commit(e, now, charge);
            t->yield = 1;
        }
    } else {
        __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED); /* wanting to launch is activity */
    }
    gs_devstate_unlock(e->ds);
    /* Event records go outside the lock: a record can block while the launch queue is full, and a
     * neighbour must never wait on our queue for the lock. The reserved slot stops the harvest. */
    if (t->slot >= 0 && e->ops->record_start(e->ops_ctx, t->slot, stream) != 0) {
        __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ring[t->slot], GS_RING_VOID, __ATOMIC_RELEASE); /* as in gs_engine_after */
        t->slot = -1;
    }
    /* the slot is ours until gs_engine_after's release store: plain writes */
    if (t->slot >= 0) e->ring_rs_ns[t->slot] = e->ops->now ? e->ops->now(e->ops_ctx) : now;
    return wait;
}

void gs_engine_after(struct gs_engine *e, int64_t now, void *stream, const struct gs_ticket *t, int ok)
{
    int path = __atomic_load_n(&e->path, __ATOMIC_RELAXED);
    /* no drain record into a stream being captured into a CUDA graph (t->captured; asked here if gs_engine_before
     * did not, when drains became wanted in between): the record would be captured, and the poller's look at it
     * would then fail and invalidate the application's capture (pacer.c query_state); the launch runs only with
     * the graph, whose launch records one */
    if (t->slot < 0 && ok && (path == GS_DS_PATH_LIGHT || path == GS_DS_PATH_FREE) &&
        __atomic_load_n(&e->drain_wanted, __ATOMIC_RELAXED) && e->ops->record_drain &&
        !(t->captured < 0 ? capturing(e, stream) : t->captured)) {
        /* record, then bump the generation, then arm: see drain_poll for the other side */
        if (e->ops->record_drain(e->ops_ctx, stream) == 0) {
            __atomic_fetch_add(&e->drain_gen, 1, __ATOMIC_SEQ_CST);
#ifdef GS_DRAIN_NO_WAKE /* measurement switch: what the poller's wake per armed record costs */
            __atomic_store_n(&e->drain_pending, 1, __ATOMIC_RELEASE);
#else
            if (!__atomic_exchange_n(&e->drain_pending, 1, __ATOMIC_SEQ_CST) &&
                __atomic_load_n(&e->poller_cold, __ATOMIC_SEQ_CST) && e->ops->wake)
                e->ops->wake(e->ops_ctx);
#endif
        }
    }
    if (t->yield && ok) gs_coloc_after(e, stream);
    if (now > 0) __atomic_store_n(&e->last_after_ns, now, __ATOMIC_RELAXED);
    if (!ok && t->charged) {
        /* the driver refused the launch: nothing runs, nothing is owed */
        __atomic_add_fetch(gs_eng_credit(e), t->charged, __ATOMIC_RELAXED);
        add(&e->pub_charged, -t->charged);
        __atomic_sub_fetch(&e->st_launches, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&e->st_launch_charged_ns, t->charged, __ATOMIC_RELAXED);
    }
    if (t->slot < 0 || t->slot >= GS_ENG_RING) return;
    int slot = t->slot;
    /* Was the start event already done when the launch call returned? Then the GPU reached it with
     * nothing of ours queued, and waited (or ran a neighbour) until the kernel arrived: that time is
     * in the pair. Not done: the kernel was queued before the start ran, the pair holds no gap. */
    int64_t gap = 0;
    if (ok && now > 0 && e->ops->query_start && e->ops->query_start(e->ops_ctx, slot) == 1) gap = now - e->ring_rs_ns[slot];
    e->ring_gap_ns[slot] = gap < 0 ? 0 : gap > GS_ENG_GAP_MAX_NS ? GS_ENG_GAP_MAX_NS : gap;
    int rec = ok ? e->ops->record_end(e->ops_ctx, slot, stream) : -1;
    /* No lock: the slot is RESERVED, owned by this launch until this one store. The harvest stops at
     * a RESERVED slot and reads the state with an acquire load, so it sees the end event recorded
     * before it sees RECORDED. (This saved a lock round trip per measured launch; the lock's cache
     * line is shared with every process on the device.) */
    if (rec != 0 && ok) __atomic_fetch_add(&e->event_errors, 1, __ATOMIC_RELAXED);
    /* launch refused (or no end event): nothing to correct, the charge made at launch stands */
    __atomic_store_n(&e->ring[slot], rec == 0 ? GS_RING_RECORDED : GS_RING_VOID, __ATOMIC_RELEASE);
}

void gs_engine_fini(struct gs_engine *e)
{
    if (!e->ds) return;
    if (gs_devstate_lock(e->ds) == 0) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, e->proc);
        /* leave only a record that is still ours (a reaper may have given it to someone else) */
        if ((p->flags & GS_DS_PROC_IN_USE) && p->pid == e->pid && p->id == e->id && p->joined_ns == e->joined_ns)
            gs_devstate_leave_locked(e->ds, e->proc);
        else
            gs_devstate_unpin_locked(e->ds, e->slice); /* our record was taken: only our pin is left to give back */
        gs_devstate_unlock(e->ds);
    }
    gs_cost_free(&e->cm);
    e->ds = NULL;
}

int gs_engine_stats(const struct gs_engine *e, char *buf, size_t len)
{
#define LD(x) ((long long)__atomic_load_n(&e->x, __ATOMIC_RELAXED))
    /* the pair sums are written under the state lock by the poller; a reader without it may see one
     * pair half counted, which a rate read over seconds does not notice */
    return snprintf(buf, len,
                    "{\"launches\": %lld, \"launch_charged_ns\": %lld, \"measured\": %lld, \"gap_pairs\": %lld, "
                    "\"gap_ns\": %lld, \"clean\": %lld, \"clean_launch_ns\": %lld, \"clean_cost_ns\": %lld, "
                    "\"dirty\": %lld, \"dirty_launch_ns\": %lld, \"dirty_raw_ns\": %lld, \"dirty_cost_ns\": %lld, "
                    "\"dirty_keyless\": %lld, \"event_errors\": %lld, \"cost_avg_ns\": %lld, \"pair_bias_ns\": %lld, "
                    "\"path\": %d, \"yield_entries\": %lld, \"yield_busy_ns\": %lld, \"yield_backlog_ns\": %lld, "
                    "\"yield_late_ns\": %lld, \"yield_no_looks_ns\": %lld, \"yield_own_queue_ns\": %lld}",
                    LD(st_launches), LD(st_launch_charged_ns), LD(measured), LD(sampled_gap), LD(gap_total_ns),
                    LD(sampled_clean), LD(st_clean_launch_ns), LD(st_clean_cost_ns), LD(sampled_dirty),
                    LD(st_dirty_launch_ns), LD(st_dirty_raw_ns), LD(st_dirty_cost_ns), LD(st_dirty_keyless),
                    LD(event_errors), LD(cost_avg_ns), LD(pair_bias_ns), (int)__atomic_load_n(&e->path, __ATOMIC_RELAXED),
                    LD(yield_entries), LD(st_yield_ns[GS_YW_BUSY]), LD(st_yield_ns[GS_YW_BACKLOG]),
                    LD(st_yield_ns[GS_YW_LATE]), LD(st_yield_ns[GS_YW_NO_LOOKS]), LD(st_yield_ns[GS_YW_OWN_QUEUE]));
#undef LD
}
