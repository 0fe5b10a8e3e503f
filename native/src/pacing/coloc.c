/* gpuslice co-location (README-compute.md, "Co-location"): how slices of the two priorities share a
 * device, per slice's `colocation`.
 *
 * preemptive (the default): a low-priority preemptive process beside a preemptive high-priority one
 *   takes the yield path. It holds back only while that one has a backlog on the GPU: its poller's
 *   latest look at its drain event saw it pending for DRAIN_SHORT or behind a second launch
 *   (GS_DS_PROC_DRAINS; an older enforcer: launched within YIELD_GAP), or measured work outstanding.
 *   Otherwise, also inside a request (CPU gaps, a decoder's sampling: issue 13 item 1), it keeps at most
 *   YIELD_QUEUE of predicted GPU work in flight, so a high-priority kernel waits behind at most that,
 *   the low-priority kernel last launched and a context switch, per gap it entered. Its queue is
 *   predicted from the kernel costs the cost model learns (costmodel.h) and re-anchored by completion
 *   markers: a marker still pending after its predicted end moves the prediction later, one done
 *   before it earlier.
 * shared: nobody yields; priorities only order the shares' guarantees (controller.c).
 * tidal (low priority): the slice is paced at a share that follows its schedule (UTC hours), or
 *   without one the fraction of time no high-priority process on the device is queued (EWMA over
 *   TIDAL_TAU), never below its floor.
 *
 * Lock-free on the launch path: the watch list is rebuilt at each path recheck (10 ms), the gate reads
 * a few fields of the watched process records, the queue end is one atomic. */
#include "gpuslice/pacer_core.h"

#define MIN_WAIT_NS 20000LL

static int valid_slice(int s) { return s >= 0 && s < GS_DS_MAX_SLICES; }

int gs_eng_high_queued(const struct gs_ds_proc *p, int64_t now)
{
    uint32_t f = __atomic_load_n(&p->flags, __ATOMIC_RELAXED);
    if (!(f & GS_DS_PROC_IN_USE)) return 0;
    /* measured work outstanding: believed only while its poller is alive */
    if ((f & GS_DS_PROC_BUSY) && now - __atomic_load_n(&p->last_seen_ns, __ATOMIC_RELAXED) < GS_CTL_BUSY_STALE_NS)
        return GS_YW_BUSY;
    int64_t l = __atomic_load_n(&p->last_launch_ns, __ATOMIC_RELAXED);
    int64_t seen = __atomic_load_n(&p->drain_seen_ns, __ATOMIC_RELAXED);
    if (!(f & GS_DS_PROC_DRAINS)) {
        /* no observations published (an enforcer before issue 13's item 1, no drain events) */
        if (l && now - l < GS_CTL_YIELD_GAP_NS) return GS_YW_NO_LOOKS;
        return seen && now - seen < GS_CTL_DRAIN_FRESH_NS ? GS_YW_NO_LOOKS : GS_YW_NONE;
    }
    int64_t done = __atomic_load_n(&p->drain_done_ns, __ATOMIC_RELAXED);
    int64_t backlog = __atomic_load_n(&p->drain_backlog_ns, __ATOMIC_RELAXED);
    /* a backlog: its latest look saw the drain pending, behind a queue (pending DRAIN_SHORT, or 2+ launches
     * since it was last seen drained: a batched request, a CUDA graph, a decoder's burst of tokens' kernels).
     * Believed for BUSY_STALE if its poller stops. One short kernel pending (a launch-bound request's
     * 3-20 us) is not a backlog: holding for it leaves the trainer only the time between requests, since
     * a held thread wakes ~20-40 us later, about the CPU gap after the kernel (plant, a ResNet-50-b1-like
     * server: 0.49 of the idle bound, 0.80 without) */
    if (seen > done && backlog) return now - seen < GS_CTL_BUSY_STALE_NS ? GS_YW_BACKLOG : GS_YW_NONE;
    /* not seen drained after its last launch, and its poller's latest look DRAIN_LATE old or older: the
     * first launch after a quiet spell (a request's start: queued until the look it woke, ~10-50 us, so
     * the trainer does not top its queue up in front of a batch; plant GPU-bound p50 1.025x with this,
     * 1.028x without), a stalled poller, a launch that recorded no drain event. Up to YIELD_GAP after
     * the launch. Within a launch-bound request the looks are ~35 us apart: not held */
    int64_t look = seen > done ? seen : done;
    return l > done && now - look >= GS_CTL_DRAIN_LATE_NS && now - l < GS_CTL_YIELD_GAP_NS ? GS_YW_LATE : GS_YW_NONE;
}

int gs_coloc_recheck(struct gs_engine *e, int64_t now)
{
    (void)now;
    /* our own policy and every neighbour's as the roster says (enginepolicy.c), never as a record claims */
    int me_high = e->priority == 0, me_pre = e->colocation == GS_COLOC_PREEMPTIVE, me_off = e->mode == GS_CTL_OFF;
    int n = 0, pre_followers = 0, tidal_followers = 0;
    for (int i = 0; i < gs_ds_nprocs(e->ds) && !me_off; i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        int sl = gs_ds_proc_slice(i); /* the slot it is in: what a record says of its slice is its writer's */
        if (i == e->proc || !(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & GS_DS_PROC_IN_USE) || !valid_slice(sl))
            continue;
        struct gs_pol s = gs_eng_pol(e, sl);
        if (s.mode == GS_CTL_OFF) continue;
        /* a preemptive or tidal low-priority process yields to the preemptive high-priority ones */
        int watch = !me_high && (me_pre || e->colocation == GS_COLOC_TIDAL) && s.priority == 0 &&
                    s.colocation == GS_COLOC_PREEMPTIVE;
        if (watch && n < GS_ENG_WATCH) __atomic_store_n(&e->watch[n++], i, __ATOMIC_RELAXED);
        if (me_high && s.priority != 0) {
            pre_followers |= s.colocation == GS_COLOC_PREEMPTIVE;
            tidal_followers |= s.colocation == GS_COLOC_TIDAL;
        }
    }
    __atomic_store_n(&e->nwatch, n, __ATOMIC_RELEASE);
    /* a high-priority process tells its queue's drain to whoever yields to it or follows its idle time */
    int drain = me_high && !me_off && ((me_pre && pre_followers) || tidal_followers);
#ifdef GS_DRAIN_OFF /* measurement switch (bench/gpu/coloc.sh GS_COLOC_VARIANT_CFLAGS): what the drain records cost */
    drain = 0;
#endif
    __atomic_store_n(&e->drain_wanted, drain, __ATOMIC_RELAXED);
    /* and says so in its record: neighbours then read its queue from what its poller observes */
    uint32_t *fl = &gs_ds_proc(e->ds, e->proc)->flags;
    if (drain && e->ops->record_drain && e->ops->query_drain) __atomic_fetch_or(fl, GS_DS_PROC_DRAINS, __ATOMIC_RELAXED);
    else __atomic_fetch_and(fl, ~GS_DS_PROC_DRAINS, __ATOMIC_RELAXED);
    return n > 0;
}

/* how long until the latest launch's record is DRAIN_AGE old (0: it is, or no clock to judge by). A launch
 * stamped after our clock reading (another thread's later read) is young; one stamped more than DRAIN_AGE
 * ahead is no launch time at all (the record is in the slice's own file): looked at as old */
static int64_t record_young(const struct gs_engine *e, int64_t now)
{
    int64_t l = __atomic_load_n(&gs_ds_proc(e->ds, e->proc)->last_launch_ns, __ATOMIC_RELAXED);
    if (l <= 0 || now <= 0 || l - now > GS_CTL_DRAIN_AGE_NS) return 0;
    if (l >= now) return GS_CTL_DRAIN_AGE_NS;
    return now - l < GS_CTL_DRAIN_AGE_NS ? GS_CTL_DRAIN_AGE_NS - (now - l) : 0;
}

/* A drain record out (a high-priority process beside low-priority preemptive or tidal neighbours):
 * publish what the poll sees. Pending: drain_seen_ns = now, and drain_backlog_ns once it is a backlog
 * (pending DRAIN_SHORT, or 2+ launches since the last "drained" look; neighbours hold while both are
 * newer than drain_done_ns). Complete with no newer record armed meanwhile: drain_done_ns = now, the
 * queue was empty then. The generation is read before the query and again
 * after the clear: a record armed meanwhile keeps the drain pending (and is looked at soon, see
 * gs_coloc_drain_delay) without claiming "drained" for it. */
void gs_coloc_drain_poll(struct gs_engine *e, int64_t now)
{
    if (!__atomic_load_n(&e->drain_pending, __ATOMIC_ACQUIRE)) return;
    /* a record younger than DRAIN_AGE is not looked at (controller.h). Launches closer together than that
     * are not looked at until they pause; neighbours count such a stream queued (gs_eng_high_queued:
     * DRAIN_LATE) */
    if (record_young(e, now)) return;
    uint32_t g0 = __atomic_load_n(&e->drain_gen, __ATOMIC_ACQUIRE);
    int q = e->ops->query_drain ? e->ops->query_drain(e->ops_ctx) : -1;
    struct gs_ds_proc *me = gs_ds_proc(e->ds, e->proc);
    if (q == 0) {
        if (!e->drain_since_ns) e->drain_since_ns = now;
        __atomic_store_n(&me->drain_seen_ns, now, __ATOMIC_RELAXED);
        if (!e->drain_backlog && (now - e->drain_since_ns >= GS_CTL_DRAIN_SHORT_NS || g0 - e->drain_done_gen >= GS_CTL_DRAIN_BACKLOG_LAUNCHES)) {
            e->drain_backlog = 1;
            __atomic_store_n(&me->drain_backlog_ns, now, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&gs_ds_slice(e->ds, e->slice)->last_active_ns, now, __ATOMIC_RELAXED);
        return;
    }
    /* everything recorded up to g0 has run: the backlog, if any, is over */
    e->drain_since_ns = 0;
    e->drain_done_gen = g0;
    e->drain_backlog = 0;
    __atomic_store_n(&me->drain_backlog_ns, 0, __ATOMIC_RELAXED);
    /* seq_cst store, then load: a launch bumps the generation, then swaps drain_pending (gs_engine_after);
     * with release/acquire alone our clear could land after its swap read 1 (no wake) while our load missed
     * its bump, and the armed record was dropped (a helper's two-thread harness: ~1 % of rounds) */
    __atomic_store_n(&e->drain_pending, 0, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->drain_gen, __ATOMIC_SEQ_CST) != g0) {
        __atomic_store_n(&e->drain_pending, 1, __ATOMIC_RELEASE);
        return;
    }
    __atomic_store_n(&me->drain_done_ns, now > __atomic_load_n(&me->drain_seen_ns, __ATOMIC_RELAXED) ? now : now + 1,
                     __ATOMIC_RELAXED);
}

int64_t gs_coloc_drain_delay(const struct gs_engine *e, int64_t now)
{
    int64_t since = e->drain_since_ns, d = since ? (now - since) / 2 : 0, young = record_young(e, now);
    d = d < GS_CTL_DRAIN_SPIN_NS ? GS_CTL_DRAIN_SPIN_NS : d > GS_CTL_DRAIN_POLL_NS ? GS_CTL_DRAIN_POLL_NS : d;
    return young > d ? young : d;
}

/* spin flag of the marker ring (launch threads and the poller; held for a few event calls) */
static int mark_trylock(struct gs_engine *e) { return !__atomic_test_and_set(&e->mark_busy, __ATOMIC_ACQUIRE); }
static void mark_unlock(struct gs_engine *e) { __atomic_clear(&e->mark_busy, __ATOMIC_RELEASE); }

/* every pending marker's predicted end, and the queue's, moves by d (under the marker flag) */
static void shift_marks(struct gs_engine *e, int64_t d)
{
    for (int k = 0; k < e->mcount; k++) e->mark_end[(e->mhead - 1 - k + GS_ENG_MARKS) % GS_ENG_MARKS] += d;
    e->mark_last_end += d;
    __atomic_add_fetch(&e->yq_end, d, __ATOMIC_RELAXED);
}

void gs_coloc_harvest(struct gs_engine *e, int64_t now)
{
    if (!e->ops->query_mark || !__atomic_load_n(&e->mcount, __ATOMIC_RELAXED) || !mark_trylock(e)) return;
    while (e->mcount > 0) {
        int i = (e->mhead - e->mcount + GS_ENG_MARKS) % GS_ENG_MARKS;
        int q = e->ops->query_mark(e->ops_ctx, i);
        if (q == 0) {
            /* still running after its predicted end: the queue is at least this late */
            if (now > e->mark_end[i]) {
                shift_marks(e, now - e->mark_end[i]);
                e->marks_late++;
            }
            break;
        }
        /* done (an error counts as done: the prediction alone goes on) before its predicted end: the
         * work behind it starts earlier too (the queue runs back to back) */
        if (q > 0 && e->mark_end[i] > now) {
            int64_t early = e->mark_end[i] - now;
            __atomic_sub_fetch(&e->mcount, 1, __ATOMIC_RELAXED);
            shift_marks(e, -early);
            e->marks_early++;
            continue;
        }
        __atomic_sub_fetch(&e->mcount, 1, __ATOMIC_RELAXED);
    }
    mark_unlock(e);
}

int64_t gs_coloc_yield_gate(struct gs_engine *e, int64_t now, int *why)
{
    int n = __atomic_load_n(&e->nwatch, __ATOMIC_ACQUIRE);
    int64_t wait = 0;
    *why = GS_YW_NONE;
    for (int k = 0; k < n; k++) {
        int w_i = __atomic_load_n(&e->watch[k], __ATOMIC_RELAXED);
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, w_i);
        int sl = gs_ds_proc_slice(w_i);
        int q = valid_slice(sl) && gs_eng_pol(e, sl).priority == 0 ? gs_eng_high_queued(p, now) : GS_YW_NONE;
        if (q == GS_YW_NONE) continue;
        int64_t l = __atomic_load_n(&p->last_launch_ns, __ATOMIC_RELAXED), w;
        if (__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & GS_DS_PROC_DRAINS) {
            /* until its poller's next look: soon while it launches (short kernels), its DRAIN_POLL
             * cadence behind a long queue */
            w = (now - l) / 2; /* <= 0 when it launched at our clock reading or after it: held all the same */
            w = w > GS_CTL_DRAIN_POLL_NS ? GS_CTL_DRAIN_POLL_NS : w < MIN_WAIT_NS ? MIN_WAIT_NS : w;
        } else {
            /* wait out the gap after its last launch, or one drain poll */
            w = l && now - l < GS_CTL_YIELD_GAP_NS ? GS_CTL_YIELD_GAP_NS - (now - l) : GS_CTL_DRAIN_POLL_NS;
        }
        if (w > wait) {
            wait = w;
            *why = q;
        }
    }
    if (wait > 0) {
        __atomic_store_n(&e->yield_held, 1, __ATOMIC_RELAXED);
        return wait < MIN_WAIT_NS ? MIN_WAIT_NS : wait > GS_CTL_WAIT_MAX_NS ? GS_CTL_WAIT_MAX_NS : wait;
    }
    int64_t pending = __atomic_load_n(&e->yq_end, __ATOMIC_RELAXED) - now;
    if (pending > GS_CTL_YIELD_QUEUE_NS) {
        gs_coloc_harvest(e, now);
        pending = __atomic_load_n(&e->yq_end, __ATOMIC_RELAXED) - now;
    }
    if (pending > GS_CTL_YIELD_QUEUE_NS) {
        int64_t w = pending - GS_CTL_YIELD_QUEUE_NS;
        *why = GS_YW_OWN_QUEUE;
        /* at most one marker's spacing: a marker that completed early (the prediction was moved late while
         * a high-priority kernel ran in front of ours, and that kernel was short) is seen within one, not
         * after WAIT_MAX with the device idle (plant, ResNet-50-b1-like server: 117 -> 70 ms idle in 5 s) */
        return w < MIN_WAIT_NS ? MIN_WAIT_NS : w > GS_CTL_YIELD_MARK_NS ? GS_CTL_YIELD_MARK_NS : w;
    }
    if (__atomic_exchange_n(&e->yield_held, 0, __ATOMIC_RELAXED)) __atomic_add_fetch(&e->yield_entries, 1, __ATOMIC_RELAXED);
    return 0;
}

void gs_coloc_yield_commit(struct gs_engine *e, int64_t now, int64_t charge_ns)
{
    int64_t c = charge_ns > 0 ? charge_ns : GS_CTL_YIELD_UNKNOWN_NS;
    int64_t old = __atomic_load_n(&e->yq_end, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&e->yq_end, &old, (old > now ? old : now) + c, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
}

void gs_coloc_after(struct gs_engine *e, void *stream)
{
    if (!e->ops->record_mark || !mark_trylock(e)) return; /* another thread is recording one */
    int64_t end = __atomic_load_n(&e->yq_end, __ATOMIC_RELAXED);
    if (e->mcount < GS_ENG_MARKS && (e->mcount == 0 || end - e->mark_last_end >= GS_CTL_YIELD_MARK_NS)) {
        int i = e->mhead;
        if (e->ops->record_mark(e->ops_ctx, i, stream) == 0) {
            e->mark_end[i] = end;
            e->mark_last_end = end;
            e->mhead = (i + 1) % GS_ENG_MARKS;
            __atomic_add_fetch(&e->mcount, 1, __ATOMIC_RELAXED);
        }
    }
    mark_unlock(e);
}

void gs_coloc_tidal_locked(struct gs_engine *e, struct gs_ds_slice *s, int64_t now)
{
    if (e->colocation != GS_COLOC_TIDAL) return;
    int queued = 0;
    for (int i = 0; i < gs_ds_nprocs(e->ds) && !queued; i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        if (i == e->proc || !(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & GS_DS_PROC_IN_USE)) continue;
        struct gs_pol hs = gs_eng_pol(e, gs_ds_proc_slice(i));
        queued = hs.priority == 0 && hs.mode != GS_CTL_OFF && gs_eng_high_queued(p, now);
    }
    if (e->tidal_seen_ns) e->tidal_busy_ppm = gs_ctl_tidal_ewma(e->tidal_busy_ppm, queued, now - e->tidal_seen_ns);
    e->tidal_seen_ns = now;
    if (e->tidal_set_ns && now - e->tidal_set_ns < GS_CTL_TIDAL_EVERY_NS && now >= e->tidal_set_ns) return;
    e->tidal_set_ns = now;
    int base = e->tidal_base_pct;
    int sched = e->tidal.n ? gs_tidal_pct_at(&e->tidal, e->tidal_hour, base > 0 && base < 100 ? base : 100) : 0;
    uint32_t floor = base > 0 && base < 100 ? (uint32_t)base * 100u : GS_CTL_TIDAL_FLOOR_BP;
    uint32_t share = gs_ctl_tidal_share(sched, e->tidal_busy_ppm, floor);
    if (share != s->share_bp) {
        s->share_bp = share;
        e->share_bp = share;
        e->rate_at_ns = 0; /* the allocation again at once */
    }
}
