/* gpuslice pacer: who waits for whom (see gpuslice/pacer_core.h, README-compute.md "Paths", "Turns"
 * and "Priority"). The engine's own bookkeeping is in pacer_core.c; this file decides, from the
 * per-device state, which path an engine's launches take and how long a measured launch waits (the
 * yield path's own gate, and who yields to whom, are in coloc.c).
 *
 * Turns: a turn-taking process (paced, offered load above 1) starts new work only when no other
 * turn-taking process's queued work is predicted to run longer than TURN_EARLY, first come first
 * served; a holder stops adding work when one of them waited TURN_MAX or when it finds itself
 * overlapping another busy one. Two saturating contexts with work queued at once are time-sliced by
 * the GPU, which preempts a running kernel every hardware time slice; turns make the hand-over
 * happen at a kernel boundary, about ten times less often. Launch-bound processes (free path) and
 * unpaced ones (light path) never take part: their queues empty between launches, and the GPU
 * switches to a neighbour in those gaps for far less than a turn would leave it idle. */
#include "gpuslice/pacer_core.h"

#define GS_PATH_RECHECK_NS 10000000LL

/* A want counts only while its owner keeps asking: a thread waiting here re-asks at least every
 * WAIT_MAX, so a want not refreshed for 4 x WAIT_MAX belongs to a process that went elsewhere. */
int gs_eng_want_live(const struct gs_ds_proc *p, int64_t now)
{
    return p->want_since_ns && now - p->want_seen_ns <= 4 * GS_CTL_WAIT_MAX_NS;
}


static void publish_path(struct gs_engine *e, int path)
{
    struct gs_ds_proc *me = gs_ds_proc(e->ds, e->proc);
    __atomic_store_n(&me->path, (uint8_t)path, __ATOMIC_RELAXED);
    if (path == GS_DS_PATH_TURNS) __atomic_fetch_or(&me->flags, GS_DS_PROC_TURNS, __ATOMIC_RELAXED);
    else __atomic_fetch_and(&me->flags, ~GS_DS_PROC_TURNS, __ATOMIC_RELAXED);
    if (path == GS_DS_PATH_LIGHT) __atomic_fetch_or(&me->flags, GS_DS_PROC_LIGHT, __ATOMIC_RELAXED);
    else __atomic_fetch_and(&me->flags, ~GS_DS_PROC_LIGHT, __ATOMIC_RELAXED);
}

/* The path, re-decided every PATH_RECHECK by one launching thread (the others keep the current one):
 * mode off: light, whatever happens; a low-priority preemptive process beside a preemptive
 * high-priority one: yield (coloc.c); else an unpaced process: light; a paced one: turns while its
 * offered load says it saturates the device, else free. Only an explicit high-priority neighbour
 * ever makes an unpaced process wait. */
int gs_eng_path(struct gs_engine *e, int64_t now)
{
    int path = __atomic_load_n(&e->path, __ATOMIC_RELAXED);
    int64_t last = __atomic_load_n(&e->path_check_ns, __ATOMIC_RELAXED);
    if (now >= last && now - last < GS_PATH_RECHECK_NS) return path;
    if (!__atomic_compare_exchange_n(&e->path_check_ns, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return path;
    int yield = gs_coloc_recheck(e, now);
    int np;
    if (e->mode == GS_CTL_OFF) np = GS_DS_PATH_LIGHT;
    else if (yield) np = GS_DS_PATH_YIELD;
    else if (!e->light_base) np = __atomic_load_n(&e->turns, __ATOMIC_RELAXED) ? GS_DS_PATH_TURNS : GS_DS_PATH_FREE;
    else np = GS_DS_PATH_LIGHT;
    if (np != path) {
        __atomic_store_n(&e->path, np, __ATOMIC_RELAXED);
        publish_path(e, np);
    }
    return np;
}

/* Does process i take turns with us? A turn-taking process of the same or higher priority. */
static int rival(struct gs_engine *e, int i, int myprio)
{
    const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
    if (i == e->proc || !(p->flags & GS_DS_PROC_IN_USE) || !(p->flags & GS_DS_PROC_TURNS))
        return 0;
    return gs_eng_pol(e, gs_ds_proc_slice(i)).priority <= myprio; /* the roster's word, not the record's */
}

/* Is another turn-taking process busy or waiting for a turn (someone to switch with)? */
static int rivals_present(struct gs_engine *e, int64_t now)
{
    for (int i = 0; i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        if (i == e->proc || !(p->flags & GS_DS_PROC_IN_USE) || !(p->flags & GS_DS_PROC_TURNS)) continue;
        if ((p->flags & GS_DS_PROC_BUSY) || gs_eng_want_live(p, now)) return 1;
    }
    return 0;
}

/* How long to wait before starting new work while idle (0 = go). */
static int64_t turn_wait(struct gs_engine *e, int64_t now)
{
    int myprio = e->priority;
    int64_t w = 0;
    for (int i = 0; i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        if (!rival(e, i, myprio) || !(p->flags & GS_DS_PROC_BUSY)) continue;
        int64_t left = p->expect_idle_ns ? p->expect_idle_ns - now - GS_CTL_TURN_EARLY_NS : GS_CTL_WAIT_MIN_NS;
        /* a busy flag not refreshed for a while belongs to a process stuck outside the driver's
         * launch path (or dead): do not wait on it forever */
        if (now - p->last_seen_ns > GS_CTL_TURN_MAX_NS) continue;
        if (left > w) w = left;
    }
    /* first come, first served: a neighbour that has waited longer goes first */
    int64_t mine = gs_ds_proc(e->ds, e->proc)->want_since_ns;
    for (int i = 0; w == 0 && i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        if (!rival(e, i, myprio) || !gs_eng_want_live(p, now)) continue;
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
    int myprio = e->priority;
    for (int i = 0; i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        if (!rival(e, i, myprio) || now - p->last_seen_ns > GS_CTL_TURN_MAX_NS) continue;
        if ((p->flags & GS_DS_PROC_BUSY) && (p->expect_idle_ns == 0 || p->expect_idle_ns > now)) return 1;
        if (gs_eng_want_live(p, now) && now - p->want_since_ns > GS_CTL_TURN_MAX_NS) return 1;
    }
    return 0;
}

int64_t gs_eng_wait_locked(struct gs_engine *e, struct gs_ds_proc *me, int64_t now)
{
    int64_t wait = 0;
    int turns = e->path == GS_DS_PATH_TURNS;
    /* a process that joins is seen within a ms (the recount); until then its own first launches
     * find us through its scans, which is enough to start the turns */
    if (e->paced) { /* ours, not what the record says: any tenant can write that */
        int64_t need = 0;
        if (turns && e->outstanding == 0 && e->others && rivals_present(e, now)) need += GS_CTL_TURN_MIN_NS; /* worth a switch */
        /* until the first pair is measured the cost is unknown: one launch at a time */
        if (e->cost_avg_ns == 0 && e->outstanding > 0) {
            wait = GS_CTL_WAIT_MIN_NS;
        } else {
            struct gs_ctl_bucket b = gs_eng_bucket(e);
            wait = gs_ctl_gate(&b, e->rate_bp, need);
        }
        if (wait > 0) me->want_since_ns = 0; /* not ready: hold no place in the turn queue */
    }
    if (wait == 0 && turns && e->others) {
        int64_t t = e->outstanding > 0 ? (should_yield(e, now) ? GS_CTL_WAIT_MIN_NS : 0) : turn_wait(e, now);
        if (t > 0) {
            wait = t;
            if (e->outstanding == 0 && !me->want_since_ns) me->want_since_ns = now;
            me->want_seen_ns = now;
        }
    }
    if (wait == 0 && e->outstanding >= GS_ENG_RING) wait = GS_CTL_WAIT_MIN_NS; /* ring full */
    return wait;
}
