/* The plant: a simulated time-sliced GPU and the CPU sides of the processes that share it, driving the
 * real pacer engine (pacer_core.c, turns.c, coloc.c, controller.c, devstate.c on a real file). Shared by
 * test_controller.c (shares, turns, launch-bound services) and test_coloc.c (co-location).
 *
 * The GPU runs, per process (context), a FIFO of kernels and event markers; when several contexts have
 * work it time-slices between them round-robin (TIMESLICE, like the hardware scheduler without MPS),
 * paying CTX_SWITCH per switch. With ARRIVAL_PREEMPT a context whose queue was empty and gets work
 * preempts the running one after PREEMPT_LAT instead of waiting for its slice to end (what the H100
 * does beside a busy neighbour, see test_coloc.c). Each simulated process has a CPU side that
 * launches kernels through the real engine, sleeping when told, plus a poller that sleeps between
 * polls as pacer.c's does (gs_engine_poll_delay). Shares are judged on the plant's own ground truth
 * (time each context actually ran), never on the engine's estimate, in 1-s windows after a warm-up.
 * Everything is static and marked unused: each test uses part of it. */
#ifndef GS_TEST_PLANT_H
#define GS_TEST_PLANT_H
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/pacer_core.h"

#define PLANT static __attribute__((unused))
PLANT int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* ---------------- the plant ---------------- */
#define DT 5000LL               /* 5 us step */
#define QMAX 1024
#define MAXP 12

/* workloads: saturating loop; iterations of kper kernels + sync + think; on/off bursts; open-loop
 * requests every `period`; launch-bound loop of fixed shapes; W_SRV: a closed-loop server, requests of
 * ntok tokens of kper kernels of fixed shapes, a sync and tok_cpu of CPU after each token, think
 * (+- 1/8, seeded) between requests, latency from a request's start to its last sync */
enum { W_SAT, W_ITER, W_BURST, W_REQ, W_LB, W_SRV };
struct item { int64_t rem; int marker; uint64_t seq; };
struct simev { uint64_t latest, done_seq; int64_t t_done; };
struct sproc {
    /* configuration */
    const char *grant; uint32_t share_bp; int mode, weight, prio;
    int wl;                     /* workload kind */
    int64_t kmin, kmax;         /* kernel duration range */
    int kper;                   /* kernels per iteration/request */
    int nbig; int64_t kbig;     /* W_ITER: the first nbig kernels of an iteration last kbig (phases) */
    int64_t think, on, off, period, launch_cpu;
    int64_t delay;              /* first launch this long after the start */
    int raw;                    /* 1: no enforcer at all (the baseline: plain time-slicing) */
    int64_t iters;              /* iterations completed after the warm-up (W_ITER, W_LB) */
    int64_t slept_sum;          /* time the engine held its launches back */
    int64_t slept_why[GS_YW_N]; /* of which the yield gate's, by the reason its ticket gave (the rest: [0]) */
    int coloc;                  /* enum gs_colocation of its slice */
    struct gs_tidal tidal;      /* its schedule (tidal), and the hour the engine is told */
    int tidal_hour;
    int ntok; int64_t tok_cpu;  /* W_SRV */
    /* plant state */
    struct item q[QMAX + 64]; int qh, qn;
    struct simev ev[2 * GS_ENG_RING + 1 + GS_ENG_MARKS];   /* pairs, the drain event, the markers */
    uint64_t seq;
    int64_t busy_true;          /* ground truth GPU time */
    int64_t charged;            /* what the engine charged it over the run (its proc record) */
    int nker;                   /* kernels (not markers) in its queue */
    int64_t busy_at_warm;       /* busy_true when the warm-up ended */
    int64_t win_busy; double wins[64]; int nwin;
    /* cpu */
    int state; int64_t next_t, slept, iter_k, req_t, next_req, next_dur, tok;
    int64_t lat[8192]; int nlat;
    int64_t next_poll;
    int64_t last_ran, gap_max;  /* longest time without GPU time after the warm-up */
    struct gs_engine eng;
    struct gs_ticket tk;        /* one per launch, kept across its waits */
    unsigned rng;
    int started;
};
PLANT struct sproc P[MAXP];
PLANT int NP;
PLANT int64_t NOW;
PLANT const int64_t T0 = 1000000000LL; /* simulated start (the engine treats 0 as never) */

PLANT int cur = -1;
PLANT int64_t slice_left;
PLANT int64_t TIMESLICE = 2000000LL;
/* ARRIVAL_PREEMPT: a context whose queue held no kernel and gets one preempts the running context
 * after PREEMPT_LAT, and runs next, instead of waiting out the running one's slice (0 = round robin
 * at slice ends only, the pessimistic device) */
PLANT int ARRIVAL_PREEMPT = 0;
PLANT int64_t PREEMPT_LAT = 5000;
PLANT int prefer = -1;
PLANT int MARKERS_WAIT = 1; /* see gpu_step */
/* MARKER_PREEMPT (with ARRIVAL_PREEMPT): an event marker recorded into a context with nothing queued
 * while another context runs brings its context in like a kernel would (an event is a command in the
 * channel: the scheduler must load the context to process it). A pair's start event then runs ahead
 * of its kernel, the context drains while the launch call is still in flight and the GPU goes back
 * to a neighbour; the kernel waits for it. 0 (default): a marker waits for its context's turn. */
PLANT int MARKER_PREEMPT = 0;
PLANT int64_t GAP_FROM;    /* gaps are measured from here (the warm-up's end) */
PLANT int64_t CTX_SWITCH = 0, switch_left; /* GPU time lost per context switch: 0 = ideal plant; test_switch_cost sets 100 us */
/* A switch away from a context whose queue ran empty (no kernel to save) may cost less than one that
 * preempts a running kernel: < 0 = the same as CTX_SWITCH (see test_launch_bound) */
PLANT int64_t CTX_SWITCH_IDLE = -1;
PLANT int last_ctx = -1;
PLANT long n_switches, n_preempt; /* 100 us per context switch (see gpu_step) */
PLANT int sim_rec(struct sproc *p, int id)
{
    struct simev *e = &p->ev[id];
    e->latest = ++p->seq;
    /* an idle context's marker is processed at once, unless (realistic model) another context holds
     * the GPU: then it waits for this context's turn like any command in its channel */
    int other_running = cur >= 0 && &P[cur] != p && P[cur].qn > 0;
    if (p->qn == 0 && !(MARKERS_WAIT && other_running)) { e->done_seq = e->latest; e->t_done = NOW; return 0; }
    if (MARKER_PREEMPT && ARRIVAL_PREEMPT && p->qn == 0 && other_running && P[cur].nker > 0) {
        if (slice_left > PREEMPT_LAT) slice_left = PREEMPT_LAT;
        prefer = (int)(p - P);
    }
    struct item *it = &p->q[(p->qh + p->qn) % (QMAX + 64)];
    it->rem = 0; it->marker = id; it->seq = e->latest;
    p->qn++;
    return 0;
}
PLANT int op_start(void *c, int idx, void *s) { (void)s; return sim_rec(c, 2 * idx); }
PLANT int op_end(void *c, int idx, void *s) { (void)s; return sim_rec(c, 2 * idx + 1); }
PLANT int op_query(void *c, int idx) { struct simev *e = &((struct sproc *)c)->ev[2 * idx + 1]; return e->done_seq == e->latest; }
PLANT int64_t op_elapsed(void *c, int idx)
{
    struct sproc *p = c;
    struct simev *a = &p->ev[2 * idx], *b = &p->ev[2 * idx + 1];
    if (b->done_seq != b->latest || a->done_seq != a->latest) return -1;
    return b->t_done - a->t_done;
}
PLANT int op_record_drain(void *c, void *s) { (void)s; return sim_rec(c, 2 * GS_ENG_RING); }
PLANT int op_query_drain(void *c) { struct simev *e = &((struct sproc *)c)->ev[2 * GS_ENG_RING]; return e->done_seq == e->latest; }
PLANT int op_record_mark(void *c, int i, void *s) { (void)s; return sim_rec(c, 2 * GS_ENG_RING + 1 + i); }
PLANT int op_query_mark(void *c, int i) { struct simev *e = &((struct sproc *)c)->ev[2 * GS_ENG_RING + 1 + i]; return e->done_seq == e->latest; }
/* a woken poller thread runs POLL_WAKE_LAT later (a futex wake-up: ~5-20 us on a Linux host; 0 = at
 * the next step) */
PLANT int64_t POLL_WAKE_LAT = 0;
PLANT void op_wake(void *c)
{
    struct sproc *p = c;
    if (p->next_poll > NOW + POLL_WAKE_LAT) p->next_poll = NOW + POLL_WAKE_LAT;
}
PLANT int op_query_start(void *c, int idx) { struct simev *e = &((struct sproc *)c)->ev[2 * idx]; return e->done_seq == e->latest; }
PLANT int64_t op_now(void *c) { (void)c; return NOW; }
PLANT const struct gs_gpu_ops SIM_OPS = {op_start, op_end, op_query, op_elapsed, NULL, op_record_drain, op_query_drain,
                                         op_record_mark, op_query_mark, op_wake, op_query_start, op_now};
/* GAP_BLIND: the engines get ops without query_start, so they cannot tell a pair started on an empty
 * queue and charge the launch gap inside it (the pacer before issue 12's fix): pins the cause */
PLANT int GAP_BLIND = 0;
PLANT const struct gs_gpu_ops SIM_OPS_GAP_BLIND = {op_start, op_end, op_query, op_elapsed, NULL, op_record_drain,
                                                   op_query_drain, op_record_mark, op_query_mark, op_wake, NULL, NULL};

/* Where event markers complete. 1 (default, what a time-sliced GPU does: an event is a command in
 * the context's own channel, processed when that context is scheduled): a marker completes when its
 * context runs. 0 (pessimistic): markers complete as soon as they reach the head of their queue,
 * even while another context holds the GPU, so event intervals include waiting. */
PLANT void pop_markers(struct sproc *p, int64_t t)
{
    while (p->qn && p->q[p->qh].marker >= 0) {
        struct item *it = &p->q[p->qh];
        struct simev *e = &p->ev[it->marker];
        if (it->seq > e->done_seq) { e->done_seq = it->seq; e->t_done = t; }
        p->qh = (p->qh + 1) % (QMAX + 64); p->qn--;
    }
}
PLANT void gpu_step(void)
{
    if (!MARKERS_WAIT)
        for (int i = 0; i < NP; i++) pop_markers(&P[i], NOW);
    for (int round = 0; round < 2; round++) {
        int want = 0;
        for (int i = 0; i < NP; i++) want += P[i].qn > 0;
        if (!want) { cur = -1; return; }
        if (cur < 0 || P[cur].qn == 0 || (slice_left <= 0 && want > 1)) {
            int prev = cur;
            if (prefer >= 0 && P[prefer].qn && prefer != cur) cur = prefer;
            else
                for (int k = 1; k <= NP; k++) {
                    int c = ((cur < 0 ? 0 : cur) + k) % NP;
                    if (P[c].qn) { cur = c; break; }
                }
            prefer = -1;
            slice_left = TIMESLICE;
            /* a context switch costs the GPU CTX_SWITCH of nothing (measured on the H100: two
             * time-sliced matmul loops reach 92.5 % of one) */
            if (prev >= 0 && P[prev].qn > 0) n_preempt++;
            if (last_ctx >= 0 && last_ctx != cur) { /* resuming the same context is free */
                int preempt = prev >= 0 && P[prev].qn > 0;
                switch_left = preempt || CTX_SWITCH_IDLE < 0 ? CTX_SWITCH : CTX_SWITCH_IDLE;
                n_switches++;
            }
            last_ctx = cur;
        }
        if (switch_left > 0) break;  /* the context is still being loaded: its commands wait */
        pop_markers(&P[cur], NOW);
        if (P[cur].qn) break;  /* a kernel to run; else the context only had markers: pick again */
    }
    struct sproc *p = &P[cur];
    if (!p->qn) return;
    if (switch_left > 0) {
        switch_left -= DT;
        if (switch_left <= 0) pop_markers(p, NOW + DT); /* loaded: its pending markers run now */
        return;
    }
    struct item *it = &p->q[p->qh];
    it->rem -= DT;
    slice_left -= DT;
    p->busy_true += DT;
    p->win_busy += DT;
    if (p->last_ran && NOW >= GAP_FROM && NOW - p->last_ran > p->gap_max) p->gap_max = NOW - p->last_ran;
    p->last_ran = NOW;
    if (it->rem <= 0) { p->qh = (p->qh + 1) % (QMAX + 64); p->qn--; p->nker--; pop_markers(p, NOW + DT); /* the kernel ended at the end of this step */ }
}

PLANT unsigned rnd(unsigned *s) { *s = *s * 1103515245u + 12345u; return (*s >> 8) & 0xffffff; }
/* W_LB: kernel k of an iteration always has the same shape (its duration from a fixed pattern
 * over [kmin, kmax], +-2 % jitter), as in an inference loop */
PLANT int64_t lb_dur(struct sproc *p, int64_t k)
{
    int64_t base = p->kmin + (p->kmax - p->kmin) * ((k * 7919 + 13) % 17) / 16;
    return base + ((int64_t)(rnd(&p->rng) % 41) - 20) * base / 1000;
}
PLANT int64_t kdur(struct sproc *p) { if (p->wl == W_LB || p->wl == W_SRV) return lb_dur(p, p->iter_k); if (p->iter_k < p->nbig) return p->kbig; return p->kmin + (p->kmax > p->kmin ? (int64_t)(rnd(&p->rng) % (unsigned)(p->kmax - p->kmin)) : 0); }

enum { S_LAUNCH, S_SYNC, S_THINK, S_IDLE, S_PUSH };
/* The driver's launch call takes time: the kernel reaches the GPU LAUNCH_GAP after the start event
 * recorded before it. Meanwhile the context's queue may be empty with its start marker already
 * done: the pair then holds the gap too, and the GPU may switch to a neighbour, whose run then lands
 * inside the pair (on a GPU the gap is the 2-5 us of cuLaunchKernel). 0 (the accuracy tests: they
 * pin the controller against an ideal device) = the kernel goes with its start event; the
 * launch-bound and overlap tests set DT, and test_launch_gap shows what it costs a lone slice. */
PLANT int64_t LAUNCH_GAP = 0;
/* A thread the engine told to sleep runs again WAKE_LAT after the sleep ends (a timer wake-up and
 * the scheduler: ~5-50 us on a Linux host; 0 = exact, the accuracy tests) */
PLANT int64_t WAKE_LAT = 0;
/* CPU_JITTER: a launch-bound loop's CPU time between launches varies by up to +-launch_cpu x this
 * (0 = exact; Python and the driver vary by tens of percent). Exact loops phase-lock with their
 * neighbours, so a kernel may land beside the same neighbour's kernel on every one of its sampled
 * launches, which no real pair of loops keeps up for long. */
PLANT double CPU_JITTER = 0;
PLANT void cpu_step(struct sproc *p)
{
    /* the poller thread of pacer.c: poll, then sleep as long as the engine says (250 us while work
     * is queued or just launched beside neighbours, 5 ms otherwise); a launch does not wake it */
    if (!p->raw && NOW >= p->next_poll) { gs_engine_poll(&p->eng, NOW); p->next_poll = NOW + gs_engine_poll_delay(&p->eng, NOW); }
    if (p->wl == W_REQ && p->state == S_IDLE && NOW >= p->next_req) {
        p->state = S_LAUNCH; p->req_t = p->next_req; p->next_req += p->period; p->iter_k = 0;
    }
    if (p->wl == W_SRV && p->state == S_IDLE && NOW >= p->next_req) {
        p->state = S_LAUNCH; p->req_t = NOW; p->iter_k = 0; p->tok = 0; p->next_t = NOW;
    }
    if (p->wl == W_BURST && p->state == S_LAUNCH) {
        int64_t ph = (NOW - T0) % (p->on + p->off);
        if (ph >= p->on) { p->state = S_THINK; p->next_t = NOW - ph + p->on + p->off; }
    }
    if (NOW < p->next_t) return;
    switch (p->state) {
    case S_THINK: p->state = S_LAUNCH; /* fallthrough */
    case S_LAUNCH: {
        if (p->qn >= QMAX) { p->next_t = NOW + DT; return; }
        /* the kernel's shape decides its cost, as on a GPU: its key is its duration (to the step) */
        if (!p->slept) p->next_dur = kdur(p);
        uint64_t key = 1 + (uint64_t)(p->next_dur / DT);
        int64_t w = p->raw ? 0 : gs_engine_before(&p->eng, NOW, NULL, key, p->slept, &p->tk);
        if (w > 0) {
            p->slept = w + WAKE_LAT;
            p->slept_sum += w + WAKE_LAT;
            p->slept_why[p->tk.yield_why] += w + WAKE_LAT; /* GS_YW_NONE: not the yield gate's wait */
            p->next_t = NOW + w + WAKE_LAT;
            return;
        }
        p->slept = 0;
        if (LAUNCH_GAP > 0) { p->state = S_PUSH; p->next_t = NOW + LAUNCH_GAP; return; }
    } /* fallthrough */
    case S_PUSH: {
        p->state = S_LAUNCH;
        struct item *it = &p->q[(p->qh + p->qn) % (QMAX + 64)];
        it->rem = p->next_dur; it->marker = -1; it->seq = 0; p->qn++;
        int me = (int)(p - P);
        if (ARRIVAL_PREEMPT && p->nker == 0 && cur >= 0 && cur != me && P[cur].nker > 0) {
            if (slice_left > PREEMPT_LAT) slice_left = PREEMPT_LAT;
            prefer = me;
        }
        p->nker++;
        if (!p->raw) gs_engine_after(&p->eng, NOW, NULL, &p->tk, 1);
        p->next_t = NOW + p->launch_cpu;
        if (CPU_JITTER > 0 && p->launch_cpu > 0)
            p->next_t += (int64_t)(((double)(rnd(&p->rng) % 2001) / 1000.0 - 1.0) * CPU_JITTER * (double)p->launch_cpu);
        if (p->kper && ++p->iter_k >= p->kper) { p->state = S_SYNC; p->iter_k = 0; }
        return;
    }
    case S_SYNC:
        if (p->qn) { p->next_t = NOW + DT; return; }
        if (p->wl == W_REQ) {
            if (p->nlat < 8192) p->lat[p->nlat++] = NOW - p->req_t;
            p->state = S_IDLE;
            return;
        }
        if (p->wl == W_SRV) {
            if (++p->tok < p->ntok) { p->state = S_THINK; p->next_t = NOW + p->tok_cpu; return; }
            if (NOW >= GAP_FROM && p->nlat < 8192) p->lat[p->nlat++] = NOW - p->req_t;
            if (NOW >= GAP_FROM) p->iters++;
            p->state = S_IDLE;
            p->next_req = NOW + p->think + ((int64_t)(rnd(&p->rng) % 1001) - 500) * p->think / 4000;
            return;
        }
        if (NOW >= GAP_FROM) p->iters++;
        p->state = S_THINK; p->next_t = NOW + p->think;
        return;
    case S_IDLE: return;
    }
}

PLANT struct gs_devstate DS;
PLANT char DIR_[256];
PLANT void (*SIM_HOOK)(void); /* called every step (a test that pokes the shared state) */

PLANT void sim_reset(void)
{
    memset(P, 0, sizeof P); NP = 0; cur = -1; slice_left = 0; switch_left = 0; last_ctx = -1; prefer = -1;
}
PLANT struct sproc *add(const char *grant, double share, int mode, int weight, int prio, int wl, int64_t kmin, int64_t kmax)
{
    struct sproc *p = &P[NP++];
    p->grant = grant; p->share_bp = (uint32_t)lround(share * 100); p->mode = mode; p->weight = weight; p->prio = prio;
    p->wl = wl; p->kmin = kmin; p->kmax = kmax; p->launch_cpu = 5000; p->rng = 12345u + (unsigned)NP * 77u;
    p->kper = wl == W_ITER ? 50 : 0;
    
    return p;
}

/* run for `secs` simulated seconds; 1-s windows after `warm` seconds go to wins[] */
PLANT void sim_run(double secs, double warm)
{
    char err[256];
    static int opened;
    if (!opened) {
        snprintf(DIR_, sizeof DIR_, "/tmp/gs-test-controller-%d", (int)getpid());
        if (gs_devstate_open(&DS, DIR_, "GPU-sim", err, sizeof err) != 0) { printf("FAIL devstate: %s\n", err); exit(1); }
        opened = 1;
    }
    NOW = T0;
    for (int i = 0; i < NP; i++) {
        struct sproc *p = &P[i];
        if (!p->raw && gs_engine_init(&p->eng, &DS, p->grant, p->share_bp, p->mode, p->weight, p->prio, getpid(), (uint32_t)i, GAP_BLIND ? &SIM_OPS_GAP_BLIND : &SIM_OPS, p, NOW) != 0) {
            printf("FAIL engine init\n"); exit(1);
        }
        if (!p->raw) {
            gs_engine_set_colocation(&p->eng, p->coloc, &p->tidal, (int)(p->share_bp / 100));
            p->eng.tidal_hour = p->tidal_hour;
        }
        p->next_poll = NOW; p->next_req = NOW + 1000000 + i * 333000 + p->delay;
        p->state = p->wl == W_REQ || p->wl == W_SRV ? S_IDLE : S_LAUNCH;
        p->next_t = NOW + p->delay;
    }
    int64_t end = NOW + (int64_t)(secs * 1e9), w0 = NOW + (int64_t)(warm * 1e9), wstart = w0;
    GAP_FROM = w0;
    for (; NOW < end; NOW += DT) {
        if (SIM_HOOK) SIM_HOOK();
        for (int i = 0; i < NP; i++) cpu_step(&P[i]);
        gpu_step();
        if (NOW == w0) for (int i = 0; i < NP; i++) { P[i].win_busy = 0; P[i].busy_at_warm = P[i].busy_true; }
        if (NOW > w0 && NOW - wstart >= 1000000000LL) {
            for (int i = 0; i < NP; i++) { if (P[i].nwin < 64) P[i].wins[P[i].nwin++] = P[i].win_busy / 1e7; P[i].win_busy = 0; }
            wstart = NOW;
        }
    }
    if (getenv("GS_SIM_DEBUG"))
        for (int i = 0; i < NP; i++)
            if (!P[i].raw)
                printf("    [%s] path %d offered %.2f measured %llu clean %llu dirty %llu gap %llu (%.3f s) cost_avg %lld us, charged %.3f s, "
                       "true %.3f s; yield entries %llu, marks late %llu early %llu, slept %.3f s\n", P[i].grant,
                       P[i].eng.path, P[i].eng.offered_bp / 1e4, (unsigned long long)P[i].eng.measured,
                       (unsigned long long)P[i].eng.sampled_clean, (unsigned long long)P[i].eng.sampled_dirty,
                       (unsigned long long)P[i].eng.sampled_gap, P[i].eng.gap_total_ns / 1e9, (long long)(P[i].eng.cost_avg_ns / 1000), gs_ds_proc(&DS, P[i].eng.proc)->busy_total_ns / 1e9,
                       P[i].busy_true / 1e9, (unsigned long long)P[i].eng.yield_entries,
                       (unsigned long long)P[i].eng.marks_late, (unsigned long long)P[i].eng.marks_early,
                       P[i].slept_sum / 1e9);
    for (int i = 0; i < NP; i++) if (!P[i].raw) P[i].charged = (int64_t)gs_ds_proc(&DS, P[i].eng.proc)->busy_total_ns;
    if (!getenv("GS_KEEP")) for (int i = 0; i < NP; i++) if (!P[i].raw) gs_engine_fini(&P[i].eng);
}
PLANT void win_stats(const struct sproc *p, double *mean, double *lo, double *hi)
{
    double s = 0; *lo = 1e9; *hi = -1e9;
    for (int i = 0; i < p->nwin; i++) { s += p->wins[i]; if (p->wins[i] < *lo) *lo = p->wins[i]; if (p->wins[i] > *hi) *hi = p->wins[i]; }
    *mean = p->nwin ? s / p->nwin : 0;
}
PLANT void expect_share(const struct sproc *p, double target, double tol, const char *what)
{
    double m, lo, hi;
    win_stats(p, &m, &lo, &hi);
    CHECK(p->nwin >= 3, "%s: only %d windows", what, p->nwin);
    CHECK(fabs(m - target) <= tol && lo >= target - tol - 1 && hi <= target + tol + 1,
          "%s [%s]: target %.1f achieved mean %.2f min %.2f max %.2f", what, p->grant, target, m, lo, hi);
    printf("  %-36s %-6s set %5.1f -> mean %6.2f  [%6.2f, %6.2f]\n", what, p->grant, target, m, lo, hi);
}


PLANT int cmp64(const void *a, const void *b) { int64_t x = *(const int64_t *)a, y = *(const int64_t *)b; return x < y ? -1 : x > y; }
PLANT int64_t pct(struct sproc *p, double f) { qsort(p->lat, (size_t)p->nlat, sizeof p->lat[0], cmp64); return p->nlat ? p->lat[(int)(f * (p->nlat - 1))] : -1; }
#endif
