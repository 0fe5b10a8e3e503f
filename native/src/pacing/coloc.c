/* gpuslice co-location (README-compute.md, "Co-location"): how slices of the two priorities share a
 * device, per slice's `colocation`.
 *
 * preemptive (the default): a low-priority preemptive process beside a preemptive high-priority one
 *   takes the yield path. It holds back while that one is queued (launched within YIELD_GAP, or its
 *   drain event seen pending, or measured work outstanding), and otherwise keeps at most YIELD_QUEUE
 *   of predicted GPU work in flight, so a request arriving at any time waits behind at most that, the
 *   low-priority kernel last launched, and a context switch. Whenever the high-priority process has
 *   nothing queued, the low-priority one runs at full speed (work-conserving): the bound costs it only
 *   the queue depth, which is kept well above its relaunch latency. Its queue is predicted from the
 *   kernel costs the cost model learns (costmodel.h) and re-anchored by completion markers: a marker
 *   still pending after its predicted end moves the prediction later, one done before it earlier.
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
        return 1;
    int64_t l = __atomic_load_n(&p->last_launch_ns, __ATOMIC_RELAXED);
    if (l && now - l < GS_CTL_YIELD_GAP_NS) return 1;
    int64_t d = __atomic_load_n(&p->drain_seen_ns, __ATOMIC_RELAXED);
    return d && now - d < GS_CTL_DRAIN_FRESH_NS;
}

int gs_coloc_recheck(struct gs_engine *e, int64_t now)
{
    (void)now;
    const struct gs_ds_slice *mine = &e->ds->slices[e->slice];
    int me_high = mine->priority == 0, me_pre = e->colocation == GS_COLOC_PREEMPTIVE;
    int n = 0, pre_followers = 0, tidal_followers = 0;
    for (int i = 0; i < GS_DS_MAX_PROCS && mine->mode != GS_CTL_OFF; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (i == e->proc || !(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & GS_DS_PROC_IN_USE) || !valid_slice(p->slice))
            continue;
        const struct gs_ds_slice *s = &e->ds->slices[p->slice];
        if (s->mode == GS_CTL_OFF) continue;
        /* a preemptive or tidal low-priority process yields to the preemptive high-priority ones */
        int watch = !me_high && (me_pre || e->colocation == GS_COLOC_TIDAL) && s->priority == 0 &&
                    s->colocation == GS_COLOC_PREEMPTIVE;
        if (watch && n < GS_ENG_WATCH) __atomic_store_n(&e->watch[n++], i, __ATOMIC_RELAXED);
        if (me_high && s->priority != 0) {
            pre_followers |= s->colocation == GS_COLOC_PREEMPTIVE;
            tidal_followers |= s->colocation == GS_COLOC_TIDAL;
        }
    }
    __atomic_store_n(&e->nwatch, n, __ATOMIC_RELEASE);
    /* a high-priority process tells its queue's drain to whoever yields to it or follows its idle time */
    int drain = me_high && mine->mode != GS_CTL_OFF && ((me_pre && pre_followers) || tidal_followers);
    __atomic_store_n(&e->drain_wanted, drain, __ATOMIC_RELAXED);
    return n > 0;
}

/* A drain record out (a high-priority process beside low-priority preemptive or tidal neighbours):
 * while it has not completed, publish when it was seen pending (drain_seen_ns: neighbours treat the
 * process as queued for DRAIN_FRESH after it, coloc.c), so they wait for as long as the queue runs (a
 * CUDA graph, a batch of long kernels), not only YIELD_GAP after the last launch. Cleared only if no
 * launch armed a newer record meanwhile (the generation is read before the query and again after the
 * clear). */
void gs_coloc_drain_poll(struct gs_engine *e, int64_t now)
{
    if (!__atomic_load_n(&e->drain_pending, __ATOMIC_ACQUIRE)) return;
    uint32_t g0 = __atomic_load_n(&e->drain_gen, __ATOMIC_ACQUIRE);
    int q = e->ops->query_drain ? e->ops->query_drain(e->ops_ctx) : -1;
    if (q == 0) {
        __atomic_store_n(&e->ds->procs[e->proc].drain_seen_ns, now, __ATOMIC_RELAXED);
        __atomic_store_n(&e->ds->slices[e->slice].last_active_ns, now, __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(&e->drain_pending, 0, __ATOMIC_RELEASE);
    if (__atomic_load_n(&e->drain_gen, __ATOMIC_ACQUIRE) != g0) __atomic_store_n(&e->drain_pending, 1, __ATOMIC_RELEASE);
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

int64_t gs_coloc_yield_gate(struct gs_engine *e, int64_t now)
{
    int n = __atomic_load_n(&e->nwatch, __ATOMIC_ACQUIRE);
    int64_t wait = 0;
    for (int k = 0; k < n; k++) {
        const struct gs_ds_proc *p = &e->ds->procs[__atomic_load_n(&e->watch[k], __ATOMIC_RELAXED)];
        int sl = p->slice;
        if (!valid_slice(sl) || e->ds->slices[sl].priority != 0 || !gs_eng_high_queued(p, now)) continue;
        /* wait out the gap after its last launch, or one drain poll */
        int64_t l = __atomic_load_n(&p->last_launch_ns, __ATOMIC_RELAXED);
        int64_t w = l && now - l < GS_CTL_YIELD_GAP_NS ? GS_CTL_YIELD_GAP_NS - (now - l) : GS_CTL_DRAIN_POLL_NS;
        if (w > wait) wait = w;
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
        return w < MIN_WAIT_NS ? MIN_WAIT_NS : w > GS_CTL_WAIT_MAX_NS ? GS_CTL_WAIT_MAX_NS : w;
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
    for (int i = 0; i < GS_DS_MAX_PROCS && !queued; i++) {
        const struct gs_ds_proc *p = &e->ds->procs[i];
        if (i == e->proc || !valid_slice(p->slice)) continue;
        const struct gs_ds_slice *hs = &e->ds->slices[p->slice];
        queued = hs->priority == 0 && hs->mode != GS_CTL_OFF && gs_eng_high_queued(p, now);
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
