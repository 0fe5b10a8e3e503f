/* Controller and pacer engine against a simulated device (no GPU).
 *
 * The plant: one GPU that runs, per process (context), a FIFO of kernels and event markers; when
 * several contexts have work it time-slices between them round-robin (TIMESLICE, like the hardware
 * scheduler without MPS). Each simulated process has a CPU side that launches kernels through the
 * real engine (pacer_core.c + controller.c + devstate.c on a real file), sleeping when told, plus a
 * poller that sleeps between polls as pacer.c's does (gs_engine_poll_delay: 250 us while work is
 * queued, 5 ms when idle). Shares are judged on the plant's own ground truth (time each
 * context actually ran), never on the engine's estimate, in 1-s windows after a warm-up. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/pacer_core.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* ---------------- allocation (pure) ---------------- */
static void test_allocate(void)
{
    uint32_t r[8];
    struct gs_ctl_slice a[] = {{3000, GS_CTL_HARD, 1, 0, 1}, {7000, GS_CTL_HARD, 1, 0, 1}};
    gs_ctl_allocate(a, 2, r);
    CHECK(r[0] == 3000 && r[1] == 7000, "30/70 hard fits: %u %u", r[0], r[1]);
    struct gs_ctl_slice b[] = {{8000, GS_CTL_HARD, 1, 0, 1}, {8000, GS_CTL_HARD, 3, 0, 1}};
    gs_ctl_allocate(b, 2, r);
    CHECK(r[0] == 2500 && r[1] == 7500, "oversubscribed, weights 1:3 -> 25/75: %u %u", r[0], r[1]);
    struct gs_ctl_slice c[] = {{3000, GS_CTL_SOFT, 1, 0, 1}};
    gs_ctl_allocate(c, 1, r);
    CHECK(r[0] == 10000, "soft alone takes the device: %u", r[0]);
    struct gs_ctl_slice d[] = {{3000, GS_CTL_SOFT, 1, 0, 1}, {5000, GS_CTL_HARD, 1, 0, 1}};
    gs_ctl_allocate(d, 2, r);
    CHECK(r[0] == 5000 && r[1] == 5000, "soft 30 + hard 50 -> 50/50: %u %u", r[0], r[1]);
    struct gs_ctl_slice e[] = {{3000, GS_CTL_SOFT, 1, 0, 1}, {7000, GS_CTL_HARD, 1, 0, 1}};
    gs_ctl_allocate(e, 2, r);
    CHECK(r[0] == 3000 && r[1] == 7000, "soft falls back to its share under contention: %u %u", r[0], r[1]);
    struct gs_ctl_slice f[] = {{2000, GS_CTL_SOFT, 1, 0, 1}, {2000, GS_CTL_SOFT, 3, 0, 1}};
    gs_ctl_allocate(f, 2, r);
    CHECK(r[0] == 3500 && r[1] == 6500, "idle 60 split 1:3 between soft slices: %u %u", r[0], r[1]);
    struct gs_ctl_slice g[] = {{3000, GS_CTL_SOFT, 1, 0, 1}, {5000, GS_CTL_HARD, 1, 0, 0}};
    gs_ctl_allocate(g, 2, r);
    CHECK(r[0] == 10000 && r[1] == 5000, "inactive neighbour's share flows to soft: %u %u", r[0], r[1]);
    struct gs_ctl_slice h[] = {{6000, GS_CTL_HARD, 1, 1, 1}, {6000, GS_CTL_HARD, 1, 0, 1}};
    gs_ctl_allocate(h, 2, r);
    CHECK(r[0] == 4000 && r[1] == 6000, "high priority guaranteed first: %u %u", r[0], r[1]);
    struct gs_ctl_slice i[] = {{10000, GS_CTL_HARD, 1, 0, 1}, {0, GS_CTL_HARD, 1, 0, 1}, {5000, GS_CTL_OFF, 1, 0, 1}};
    gs_ctl_allocate(i, 3, r);
    CHECK(r[0] == 10000 && r[1] == 10000 && r[2] == 10000, "100/0/off are not paced: %u %u %u", r[0], r[1], r[2]);
    /* brute invariants on random inputs: the sum of paced active rates never exceeds the device,
     * hard rates never exceed the share, and nobody active with a share gets 0 */
    srand(7);
    for (int t = 0; t < 20000; t++) {
        int n = 1 + rand() % 8;
        struct gs_ctl_slice s[8];
        for (int k = 0; k < n; k++) {
            s[k].share_bp = (uint32_t)(100 + rand() % 9800);
            s[k].mode = (uint8_t)(rand() % 2);
            s[k].weight = (uint8_t)(1 + rand() % 16);
            s[k].priority = (uint8_t)(rand() % 2);
            s[k].active = (uint8_t)(rand() % 4 != 0);
        }
        gs_ctl_allocate(s, n, r);
        int64_t sum = 0;
        for (int k = 0; k < n; k++) {
            if (!s[k].active) continue;
            sum += r[k];
            if (s[k].mode == GS_CTL_HARD && r[k] > s[k].share_bp) { CHECK(0, "hard above share"); break; }
        }
        if (sum > 10000) { CHECK(0, "allocated %lld bp > device", (long long)sum); break; }
        /* starvation: a slice of the highest class present always gets something */
        int hi = 0;
        for (int k = 0; k < n; k++) hi |= s[k].active && s[k].priority == 0;
        for (int k = 0; k < n; k++)
            if (s[k].active && (s[k].priority == 0 || !hi) && r[k] == 0) { CHECK(0, "active slice starved"); t = 1 << 30; break; }
    }
    /* the credit arithmetic the engine applies with compare-and-swap */
    int64_t last = 0;
    CHECK(gs_ctl_accrue(&last, 5000, 5000) == 0 && last == 5000, "first accrual only starts the clock");
    CHECK(gs_ctl_accrue(&last, 15000, 5000) == 5000 && last == 15000, "10 us at 50 %% accrue 5 us");
    CHECK(gs_ctl_refilled(-100, 50, GS_CTL_BURST_NS) == -50, "refill adds");
    CHECK(gs_ctl_refilled(GS_CTL_BURST_NS - 10, 50, GS_CTL_BURST_NS) == GS_CTL_BURST_NS, "refill stops at the cap");
    CHECK(gs_ctl_refilled(GS_CTL_BURST_NS + 7, 50, GS_CTL_BURST_NS) == GS_CTL_BURST_NS + 7, "the cap takes nothing away");
    CHECK(gs_ctl_charged(0, 3 * GS_CTL_DEBT_MAX_NS) == -GS_CTL_DEBT_MAX_NS, "debt is capped");
    CHECK(gs_ctl_charged(0, -2 * GS_CTL_WANT_CAP_NS) == GS_CTL_WANT_CAP_NS, "a refund banks at most WANT_CAP");
    /* offered load: turns from 1.5 up, back to free below 1.0 */
    CHECK(!gs_ctl_takes_turns(0, 14999) && gs_ctl_takes_turns(0, 15000), "turns from an offered load of 1.5");
    CHECK(gs_ctl_takes_turns(1, 10000) && !gs_ctl_takes_turns(1, 9999), "and back below 1.0 (hysteresis)");
}

/* ---------------- the plant ---------------- */
#define DT 5000LL               /* 5 us step */
#define QMAX 1024
#define MAXP 12
#define TIMESLICE 2000000LL

enum { W_SAT, W_ITER, W_BURST, W_REQ, W_LB };
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
    /* plant state */
    struct item q[QMAX + 64]; int qh, qn;
    struct simev ev[2 * GS_ENG_RING + 1];   /* + the drain event */
    uint64_t seq;
    int64_t busy_true;          /* ground truth GPU time */
    int64_t win_busy; double wins[64]; int nwin;
    /* cpu */
    int state; int64_t next_t, slept, iter_k, req_t, next_req, next_dur;
    int64_t lat[4096]; int nlat;
    int64_t next_poll;
    int64_t last_ran, gap_max;  /* longest time without GPU time after the warm-up */
    struct gs_engine eng;
    struct gs_ticket tk;        /* one per launch, kept across its waits */
    unsigned rng;
    int started;
};
static struct sproc P[MAXP];
static int NP;
static int64_t NOW;
static const int64_t T0 = 1000000000LL; /* simulated start (the engine treats 0 as never) */

static int cur = -1;
static int64_t slice_left;
static int MARKERS_WAIT = 1; /* see gpu_step */
static int64_t GAP_FROM;    /* gaps are measured from here (the warm-up's end) */
static int64_t CTX_SWITCH = 0, switch_left; /* GPU time lost per context switch: 0 = ideal plant; test_switch_cost sets 100 us */
/* A switch away from a context whose queue ran empty (no kernel to save) may cost less than one that
 * preempts a running kernel: < 0 = the same as CTX_SWITCH (see test_launch_bound) */
static int64_t CTX_SWITCH_IDLE = -1;
static int last_ctx = -1;
static long n_switches, n_preempt; /* 100 us per context switch (see gpu_step) */
static int sim_rec(struct sproc *p, int id)
{
    struct simev *e = &p->ev[id];
    e->latest = ++p->seq;
    /* an idle context's marker is processed at once, unless (realistic model) another context holds
     * the GPU: then it waits for this context's turn like any command in its channel */
    int other_running = cur >= 0 && &P[cur] != p && P[cur].qn > 0;
    if (p->qn == 0 && !(MARKERS_WAIT && other_running)) { e->done_seq = e->latest; e->t_done = NOW; return 0; }
    struct item *it = &p->q[(p->qh + p->qn) % (QMAX + 64)];
    it->rem = 0; it->marker = id; it->seq = e->latest;
    p->qn++;
    return 0;
}
static int op_start(void *c, int idx, void *s) { (void)s; return sim_rec(c, 2 * idx); }
static int op_end(void *c, int idx, void *s) { (void)s; return sim_rec(c, 2 * idx + 1); }
static int op_query(void *c, int idx) { struct simev *e = &((struct sproc *)c)->ev[2 * idx + 1]; return e->done_seq == e->latest; }
static int64_t op_elapsed(void *c, int idx)
{
    struct sproc *p = c;
    struct simev *a = &p->ev[2 * idx], *b = &p->ev[2 * idx + 1];
    if (b->done_seq != b->latest || a->done_seq != a->latest) return -1;
    return b->t_done - a->t_done;
}
static int op_record_drain(void *c, void *s) { (void)s; return sim_rec(c, 2 * GS_ENG_RING); }
static int op_query_drain(void *c) { struct simev *e = &((struct sproc *)c)->ev[2 * GS_ENG_RING]; return e->done_seq == e->latest; }
static const struct gs_gpu_ops SIM_OPS = {op_start, op_end, op_query, op_elapsed, NULL, op_record_drain, op_query_drain};

/* Where event markers complete. 1 (default, what a time-sliced GPU does: an event is a command in
 * the context's own channel, processed when that context is scheduled): a marker completes when its
 * context runs. 0 (pessimistic): markers complete as soon as they reach the head of their queue,
 * even while another context holds the GPU, so event intervals include waiting. */
static void pop_markers(struct sproc *p, int64_t t)
{
    while (p->qn && p->q[p->qh].marker >= 0) {
        struct item *it = &p->q[p->qh];
        struct simev *e = &p->ev[it->marker];
        if (it->seq > e->done_seq) { e->done_seq = it->seq; e->t_done = t; }
        p->qh = (p->qh + 1) % (QMAX + 64); p->qn--;
    }
}
static void gpu_step(void)
{
    if (!MARKERS_WAIT)
        for (int i = 0; i < NP; i++) pop_markers(&P[i], NOW);
    for (int round = 0; round < 2; round++) {
        int want = 0;
        for (int i = 0; i < NP; i++) want += P[i].qn > 0;
        if (!want) { cur = -1; return; }
        if (cur < 0 || P[cur].qn == 0 || (slice_left <= 0 && want > 1)) {
            int prev = cur;
            for (int k = 1; k <= NP; k++) {
                int c = ((cur < 0 ? 0 : cur) + k) % NP;
                if (P[c].qn) { cur = c; break; }
            }
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
    if (it->rem <= 0) { p->qh = (p->qh + 1) % (QMAX + 64); p->qn--; pop_markers(p, NOW + DT); /* the kernel ended at the end of this step */ }
}

static unsigned rnd(unsigned *s) { *s = *s * 1103515245u + 12345u; return (*s >> 8) & 0xffffff; }
/* W_LB: kernel k of an iteration always has the same shape (its duration from a fixed pattern
 * over [kmin, kmax], +-2 % jitter), as in an inference loop */
static int64_t lb_dur(struct sproc *p, int64_t k)
{
    int64_t base = p->kmin + (p->kmax - p->kmin) * ((k * 7919 + 13) % 17) / 16;
    return base + ((int64_t)(rnd(&p->rng) % 41) - 20) * base / 1000;
}
static int64_t kdur(struct sproc *p) { if (p->wl == W_LB) return lb_dur(p, p->iter_k); if (p->iter_k < p->nbig) return p->kbig; return p->kmin + (p->kmax > p->kmin ? (int64_t)(rnd(&p->rng) % (unsigned)(p->kmax - p->kmin)) : 0); }

enum { S_LAUNCH, S_SYNC, S_THINK, S_IDLE, S_PUSH };
/* The driver's launch call takes time: the kernel reaches the GPU LAUNCH_GAP after the start event
 * recorded before it. Meanwhile the context's queue may be empty with its start marker already
 * done: the pair then holds the gap too, and the GPU may switch to a neighbour, whose run then lands
 * inside the pair (on a GPU the gap is the 2-5 us of cuLaunchKernel). 0 (the accuracy tests: they
 * pin the controller against an ideal device) = the kernel goes with its start event; the
 * launch-bound and overlap tests set DT, and test_launch_gap shows what it costs a lone slice. */
static int64_t LAUNCH_GAP = 0;
static void cpu_step(struct sproc *p)
{
    /* the poller thread of pacer.c: poll, then sleep as long as the engine says (250 us while work
     * is queued or just launched beside neighbours, 5 ms otherwise); a launch does not wake it */
    if (!p->raw && NOW >= p->next_poll) { gs_engine_poll(&p->eng, NOW); p->next_poll = NOW + gs_engine_poll_delay(&p->eng, NOW); }
    if (p->wl == W_REQ && p->state == S_IDLE && NOW >= p->next_req) {
        p->state = S_LAUNCH; p->req_t = p->next_req; p->next_req += p->period; p->iter_k = 0;
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
        if (w > 0) { p->slept = w; p->slept_sum += w; p->next_t = NOW + w; return; }
        p->slept = 0;
        if (LAUNCH_GAP > 0) { p->state = S_PUSH; p->next_t = NOW + LAUNCH_GAP; return; }
    } /* fallthrough */
    case S_PUSH: {
        p->state = S_LAUNCH;
        struct item *it = &p->q[(p->qh + p->qn) % (QMAX + 64)];
        it->rem = p->next_dur; it->marker = -1; it->seq = 0; p->qn++;
        if (!p->raw) gs_engine_after(&p->eng, NOW, NULL, &p->tk, 1);
        p->next_t = NOW + p->launch_cpu;
        if (p->kper && ++p->iter_k >= p->kper) { p->state = S_SYNC; p->iter_k = 0; }
        return;
    }
    case S_SYNC:
        if (p->qn) { p->next_t = NOW + DT; return; }
        if (p->wl == W_REQ) {
            if (p->nlat < 4096) p->lat[p->nlat++] = NOW - p->req_t;
            p->state = S_IDLE;
            return;
        }
        if (NOW >= GAP_FROM) p->iters++;
        p->state = S_THINK; p->next_t = NOW + p->think;
        return;
    case S_IDLE: return;
    }
}

static struct gs_devstate DS;
static char DIR_[256];
static void (*SIM_HOOK)(void); /* called every step (a test that pokes the shared state) */

static void sim_reset(void)
{
    memset(P, 0, sizeof P); NP = 0; cur = -1; slice_left = 0; switch_left = 0; last_ctx = -1;
}
static struct sproc *add(const char *grant, double share, int mode, int weight, int prio, int wl, int64_t kmin, int64_t kmax)
{
    struct sproc *p = &P[NP++];
    p->grant = grant; p->share_bp = (uint32_t)lround(share * 100); p->mode = mode; p->weight = weight; p->prio = prio;
    p->wl = wl; p->kmin = kmin; p->kmax = kmax; p->launch_cpu = 5000; p->rng = 12345u + (unsigned)NP * 77u;
    p->kper = wl == W_ITER ? 50 : 0;
    
    return p;
}

/* run for `secs` simulated seconds; 1-s windows after `warm` seconds go to wins[] */
static void sim_run(double secs, double warm)
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
        if (!p->raw && gs_engine_init(&p->eng, &DS, p->grant, p->share_bp, p->mode, p->weight, p->prio, getpid(), (uint32_t)i, &SIM_OPS, p, NOW) != 0) {
            printf("FAIL engine init\n"); exit(1);
        }
        p->next_poll = NOW; p->next_req = NOW + 1000000 + i * 333000 + p->delay; p->state = p->wl == W_REQ ? S_IDLE : S_LAUNCH;
        p->next_t = NOW + p->delay;
    }
    int64_t end = NOW + (int64_t)(secs * 1e9), w0 = NOW + (int64_t)(warm * 1e9), wstart = w0;
    GAP_FROM = w0;
    for (; NOW < end; NOW += DT) {
        if (SIM_HOOK) SIM_HOOK();
        for (int i = 0; i < NP; i++) cpu_step(&P[i]);
        gpu_step();
        if (NOW == w0) for (int i = 0; i < NP; i++) P[i].win_busy = 0;
        if (NOW > w0 && NOW - wstart >= 1000000000LL) {
            for (int i = 0; i < NP; i++) { if (P[i].nwin < 64) P[i].wins[P[i].nwin++] = P[i].win_busy / 1e7; P[i].win_busy = 0; }
            wstart = NOW;
        }
    }
    if (getenv("GS_SIM_DEBUG"))
        for (int i = 0; i < NP; i++)
            if (!P[i].raw)
                printf("    [%s] path %d offered %.2f measured %llu clean %llu dirty %llu cost_avg %lld us, charged %.3f s, "
                       "true %.3f s\n", P[i].grant, P[i].eng.path, P[i].eng.offered_bp / 1e4,
                       (unsigned long long)P[i].eng.measured, (unsigned long long)P[i].eng.sampled_clean,
                       (unsigned long long)P[i].eng.sampled_dirty, (long long)(P[i].eng.cost_avg_ns / 1000),
                       DS.procs[P[i].eng.proc].busy_total_ns / 1e9, P[i].busy_true / 1e9);
    if (!getenv("GS_KEEP")) for (int i = 0; i < NP; i++) if (!P[i].raw) gs_engine_fini(&P[i].eng);
}
static void win_stats(const struct sproc *p, double *mean, double *lo, double *hi)
{
    double s = 0; *lo = 1e9; *hi = -1e9;
    for (int i = 0; i < p->nwin; i++) { s += p->wins[i]; if (p->wins[i] < *lo) *lo = p->wins[i]; if (p->wins[i] > *hi) *hi = p->wins[i]; }
    *mean = p->nwin ? s / p->nwin : 0;
}
static void expect_share(const struct sproc *p, double target, double tol, const char *what)
{
    double m, lo, hi;
    win_stats(p, &m, &lo, &hi);
    CHECK(p->nwin >= 3, "%s: only %d windows", what, p->nwin);
    CHECK(fabs(m - target) <= tol && lo >= target - tol - 1 && hi <= target + tol + 1,
          "%s [%s]: target %.1f achieved mean %.2f min %.2f max %.2f", what, p->grant, target, m, lo, hi);
    printf("  %-36s %-6s set %5.1f -> mean %6.2f  [%6.2f, %6.2f]\n", what, p->grant, target, m, lo, hi);
}

static void test_single_shares(void)
{
    const double shares[] = {5, 10, 25, 33, 50, 66, 75, 90, 95};
    for (unsigned k = 0; k < sizeof shares / sizeof *shares; k++) {
        sim_reset();
        add("a", shares[k], GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
        sim_run(6, 2);
        expect_share(&P[0], shares[k], 2, "single hard, 200us kernels");
    }
    /* mixed kernels (ResNet-like: 20 us .. 3 ms), iterations of 50 launches + sync + 1 ms CPU */
    const double s2[] = {10, 50, 90};
    for (unsigned k = 0; k < 3; k++) {
        sim_reset();
        struct sproc *p = add("r", s2[k], GS_CTL_HARD, 1, 0, W_ITER, 20000, 3000000);
        p->think = 1000000;
        sim_run(6, 2);
        /* the slice cannot exceed what it would use unpaced; at 90 % the 1 ms CPU gap per iteration
         * (~1.3 %) makes its natural demand ~98 %, still above the share */
        expect_share(p, s2[k], 2, "single hard, mixed kernels + sync");
    }
    /* long kernels (20 ms, longer than a burst): the debt carries over, windows stay within ±2 */
    sim_reset();
    add("l", 30, GS_CTL_HARD, 1, 0, W_SAT, 20000000, 20000000);
    sim_run(8, 2);
    expect_share(&P[0], 30, 2, "single hard, 20 ms kernels");
}

static void test_multi(void)
{
    static const char *names[] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"};
    for (int n = 2; n <= 8; n += 2) {
        sim_reset();
        double sum = 0, sh[8];
        for (int i = 0; i < n; i++) { sh[i] = 5 + (i * 37) % 20; sum += sh[i]; }
        /* scale so they fill 95 % of the device (contention, not oversubscription) */
        for (int i = 0; i < n; i++) { sh[i] = floor(sh[i] * 95 / sum); add(names[i], sh[i], GS_CTL_HARD, 1, 0, W_SAT, 100000 + i * 50000, 400000 + i * 50000); }
        sim_run(6, 2);
        for (int i = 0; i < n; i++) expect_share(&P[i], sh[i], 2, n == 2 ? "2 hard slices" : n == 4 ? "4 hard slices" : n == 6 ? "6 hard slices" : "8 hard slices");
    }
    sim_reset();
    add("a30", 30, GS_CTL_HARD, 1, 0, W_SAT, 300000, 300000);
    add("b70", 70, GS_CTL_HARD, 1, 0, W_ITER, 50000, 2000000);
    sim_run(6, 2);
    expect_share(&P[0], 30, 2, "30/70 split");
    expect_share(&P[1], 70, 2, "30/70 split");
    {
        double a, b, lo, hi;
        win_stats(&P[0], &a, &lo, &hi);
        win_stats(&P[1], &b, &lo, &hi);
        CHECK(a + b >= 97, "30/70: device busy %.1f %% (turn hand-overs must not idle it)", a + b);
    }
    /* two processes of one slice share its 40 % */
    sim_reset();
    add("g", 40, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    add("g", 40, GS_CTL_HARD, 1, 0, W_SAT, 500000, 500000);
    add("h", 50, GS_CTL_HARD, 1, 0, W_SAT, 300000, 300000);
    sim_run(6, 2);
    struct sproc sum2 = P[0];
    sum2.grant = "g(2p)";
    for (int i = 0; i < sum2.nwin; i++) sum2.wins[i] += P[1].wins[i];
    expect_share(&sum2, 40, 2, "2 processes of one 40% slice");
    expect_share(&P[2], 50, 2, "beside it a 50% slice");
}

static void test_weights_soft(void)
{
    sim_reset();
    add("w1", 80, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    add("w3", 80, GS_CTL_HARD, 3, 0, W_SAT, 200000, 200000);
    sim_run(6, 2);
    expect_share(&P[0], 25, 2, "oversubscribed, weight 1 of 1:3");
    expect_share(&P[1], 75, 2, "oversubscribed, weight 3 of 1:3");
    sim_reset();
    add("soft", 30, GS_CTL_SOFT, 1, 0, W_SAT, 200000, 200000);
    sim_run(5, 2);
    {
        double m, lo, hi;
        win_stats(&P[0], &m, &lo, &hi);
        CHECK(m >= 97, "soft 30 alone uses the idle device: %.2f", m);
        printf("  soft 30 alone                        mean %.2f\n", m);
    }
    sim_reset();
    add("soft", 30, GS_CTL_SOFT, 1, 0, W_SAT, 200000, 200000);
    add("hard", 50, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    sim_run(6, 2);
    expect_share(&P[0], 50, 2, "soft 30 beside hard 50 takes the idle 20");
    expect_share(&P[1], 50, 2, "hard 50 beside soft");
    sim_reset();
    add("soft", 30, GS_CTL_SOFT, 1, 0, W_SAT, 200000, 200000);
    add("hard", 70, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    sim_run(6, 2);
    expect_share(&P[0], 30, 2, "soft 30 under full contention");
    expect_share(&P[1], 70, 2, "hard 70 beside soft");
}

static void test_bursty(void)
{
    /* on 300 ms / off 200 ms: the hard slice must never exceed its share in a window, and gets its
     * share during the on-phases (60 % duty -> 0.6 * 40 = 24 % average) */
    sim_reset();
    struct sproc *p = add("burst", 40, GS_CTL_HARD, 1, 0, W_BURST, 100000, 1000000);
    p->on = 300000000; p->off = 200000000;
    struct sproc *q = add("steady", 50, GS_CTL_HARD, 1, 0, W_SAT, 250000, 250000);
    sim_run(8, 2);
    /* credit banked during each off phase is capped at BURST (10 ms), so each of the 2 on phases a
     * second may add 10 ms: 24 % + 2 points; hard never exceeds its share while it runs */
    expect_share(p, 26, 1.5, "bursty 40% (60% duty)");
    expect_share(q, 50, 2, "steady 50% beside a bursty one");
}

static int cmp64(const void *a, const void *b) { int64_t x = *(const int64_t *)a, y = *(const int64_t *)b; return x < y ? -1 : x > y; }
static int64_t pct(struct sproc *p, double f) { qsort(p->lat, (size_t)p->nlat, sizeof p->lat[0], cmp64); return p->nlat ? p->lat[(int)(f * (p->nlat - 1))] : -1; }

static void test_priority(void)
{
    /* high priority: a request every 4 ms of 10 x 100 us kernels; low priority: training, 1 ms
     * kernels, unpaced */
    sim_reset();
    struct sproc *h = add("online", 100, GS_CTL_HARD, 1, 0, W_REQ, 100000, 100000);
    h->kper = 10; h->period = 4000000;
    sim_run(4, 1);
    int64_t a50 = pct(h, 0.5), a99 = pct(h, 0.99);
    sim_reset();
    h = add("online", 100, GS_CTL_HARD, 1, 0, W_REQ, 100000, 100000);
    h->kper = 10; h->period = 4000000;
    struct sproc *l = add("offline", 100, GS_CTL_HARD, 1, 1, W_SAT, 1000000, 1000000);
    sim_run(4, 1);
    int64_t b50 = pct(h, 0.5), b99 = pct(h, 0.99);
    double lm, llo, lhi;
    win_stats(l, &lm, &llo, &lhi);
    printf("  priority: high p50/p99 alone %.2f/%.2f ms, beside low %.2f/%.2f ms; low got %.1f %%\n",
           a50 / 1e6, a99 / 1e6, b50 / 1e6, b99 / 1e6, lm);
    /* the design bound: a request waits behind at most one low-priority kernel (1 ms) that was
     * already running, plus one poll of the pacer */
    CHECK(b99 <= a99 + 1000000 + 300000, "high p99 beside low %.2f ms > alone %.2f + 1 low kernel", b99 / 1e6, a99 / 1e6);
    CHECK(lm > 40, "low priority not starved between requests: %.1f %%", lm);
    CHECK(lm < 75, "low priority yields (high uses 25 %%): %.1f %%", lm);
    /* small low-priority kernels (40 us, like a ResNet step's): PRIO_QUEUE lets ~7 be in flight
     * instead of one, and a request waits behind at most that 0.3 ms */
    sim_reset();
    h = add("online", 100, GS_CTL_HARD, 1, 0, W_REQ, 100000, 100000);
    h->kper = 10; h->period = 4000000;
    l = add("offline", 100, GS_CTL_HARD, 1, 1, W_SAT, 40000, 40000);
    l->launch_cpu = 10000;
    sim_run(4, 1);
    int64_t c99 = pct(h, 0.99);
    win_stats(l, &lm, &llo, &lhi);
    printf("  priority, 40 us low kernels: high p99 %.2f ms (alone %.2f), low got %.1f %%\n", c99 / 1e6, a99 / 1e6, lm);
    CHECK(c99 <= a99 + GS_CTL_PRIO_QUEUE_NS + 40000 + 300000, "high p99 %.2f ms with small low kernels", c99 / 1e6);
    CHECK(lm > 50, "low priority keeps working between requests: %.1f %%", lm);
    /* a launch-bound request (60 kernels of 10 us, 30 us of CPU between launches: the GPU queue
     * drains between them, like ResNet-18 inference at batch 8) must wait behind low-priority work
     * once per request, not once per kernel: PRIO_HOLD covers the gaps (PRIO_HOLD_MEASURED) */
    for (int beside = 0; beside < 2; beside++) {
        sim_reset();
        h = add("online", 100, GS_CTL_HARD, 1, 0, W_REQ, 10000, 10000);
        h->kper = 60; h->period = 5000000; h->launch_cpu = 30000;
        if (beside) {
            l = add("offline", 100, GS_CTL_HARD, 1, 1, W_SAT, 40000, 40000);
            l->launch_cpu = 10000;
        }
        sim_run(4, 1);
        /* the first ~10 requests (50 ms) meet the trainer's start-up queue, before either engine
         * has measured a kernel: the steady state is what is pinned here */
        h->nlat -= 20;
        memmove(h->lat, h->lat + 20, (size_t)h->nlat * sizeof h->lat[0]);
        if (!beside) a99 = pct(h, 0.99);
        else c99 = pct(h, 0.99);
    }
    win_stats(l, &lm, &llo, &lhi);
    printf("  priority, launch-bound requests: high p50/p99 %.2f/%.2f ms (alone p99 %.2f), low got %.1f %%\n", pct(h, 0.5) / 1e6, c99 / 1e6, a99 / 1e6, lm);
    CHECK(c99 <= a99 + GS_CTL_PRIO_QUEUE_NS + 40000 + 300000, "launch-bound high p99 %.2f ms vs alone %.2f", c99 / 1e6,
          a99 / 1e6);
    CHECK(lm > 30, "low priority keeps working between launch-bound requests: %.1f %%", lm);
}

static void test_resume_bounded(void)
{
    /* a high-priority burst for 1 s then silence; the low-priority slice must run again within
     * PRIO_HOLD + one poll after the high one's last kernel completed */
    sim_reset();
    struct sproc *h = add("online", 100, GS_CTL_HARD, 1, 0, W_BURST, 500000, 500000);
    h->on = 1000000000; h->off = 3000000000LL; h->kper = 20; /* batches of 20 then sync, like serving */
    struct sproc *l = add("offline", 100, GS_CTL_HARD, 1, 1, W_SAT, 200000, 200000);
    (void)l;
    sim_run(2.01, 0);
    /* window 0: high busy for the whole second -> low ~0; window 1: low runs almost all of it */
    CHECK(P[1].nwin >= 2, "windows");
    printf("  resume: low got %.1f %% while high ran, %.1f %% after\n", P[1].wins[0], P[1].wins[1]);
    CHECK(P[1].wins[0] < 5, "low paused while high queued: %.1f", P[1].wins[0]);
    /* after the last high batch: PRIO_HOLD (2 ms) paused, then PRIO_SERIAL (200 ms) one launch at a
     * time (~80 %% with 200 us kernels), then full speed */
    CHECK(P[1].wins[1] > 90, "low resumed within a bounded time: %.1f", P[1].wins[1]);
}

/* The pessimistic device: events complete as soon as they reach the head of their queue even while
 * another context runs, so a measured pair can include time spent waiting behind a neighbour. Not
 * what a time-sliced GPU does (see gpu_step); run to know the bound if a device did it: with turns
 * the error stays within a few points, reported here and asserted loosely. */
static void test_pessimistic_events(void)
{
    MARKERS_WAIT = 0;
    sim_reset();
    add("a30", 30, GS_CTL_HARD, 1, 0, W_SAT, 300000, 300000);
    add("b70", 70, GS_CTL_HARD, 1, 0, W_ITER, 50000, 2000000);
    sim_run(6, 2);
    expect_share(&P[0], 30, 5, "pessimistic events, 30/70");
    expect_share(&P[1], 70, 5, "pessimistic events, 30/70");
    MARKERS_WAIT = 1;
}

/* Context switches cost the GPU time (the H100 run: two time-sliced matmul loops reached 92.5 % of
 * one). With 100 us per switch, turns must stay long enough that the device stays >= 95 % busy and
 * the shares hold. Known gap, reported loosely: two processes of one slice beside another slice
 * switch ~500 times a second and lose ~3 points (siblings share one credit, so their turns are
 * short); asserted within 4 points so a regression still fails. */
static void test_switch_cost(void)
{
    CTX_SWITCH = 100000;
    sim_reset();
    struct sproc *a = add("a30", 30, GS_CTL_HARD, 1, 0, W_ITER, 200000, 200000);
    struct sproc *b = add("b70", 70, GS_CTL_HARD, 1, 0, W_ITER, 200000, 200000);
    a->kper = b->kper = 100; a->think = b->think = 30000; a->launch_cpu = b->launch_cpu = 8000;
    n_switches = 0;
    sim_run(6, 2);
    expect_share(a, 30, 2, "100 us switches, 30/70 loops");
    expect_share(b, 70, 2, "100 us switches, 30/70 loops");
    double ma, mb, lo, hi;
    win_stats(a, &ma, &lo, &hi);
    win_stats(b, &mb, &lo, &hi);
    printf("  100 us switches: %.0f switches/s, device busy %.1f %%\n", n_switches / 6.0, ma + mb);
    CHECK(ma + mb >= 95, "device busy %.1f %% with 100 us switches", ma + mb);
    sim_reset();
    add("g", 40, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    add("g", 40, GS_CTL_HARD, 1, 0, W_SAT, 500000, 500000);
    add("h", 50, GS_CTL_HARD, 1, 0, W_SAT, 300000, 300000);
    sim_run(6, 2);
    struct sproc sum2 = P[0];
    sum2.grant = "g(2p)";
    for (int i = 0; i < sum2.nwin; i++) sum2.wins[i] += P[1].wins[i];
    expect_share(&sum2, 40, 4, "100 us switches, 2 procs of a 40% slice");
    expect_share(&P[2], 50, 4, "100 us switches, beside it 50%");
    CTX_SWITCH = 0;
}


/* ---------------- launch-bound services (issue 12) ----------------
 * N copies of an inference loop whose CPU launches kernels more slowly than the GPU runs them (a
 * ResNet-50 at batch 8 launches ~160 kernels of a few us each, ~25 us of CPU apart, then syncs):
 * alone the GPU is busy ~40 % of the time, and plain time-slicing fills the gaps with the other
 * copies' kernels. Every configuration runs beside the same copies without any enforcer (the
 * baseline), and the aggregate is compared with it. */
struct lb_kind { const char *name; int kper; int64_t kmin, kmax, cpu, think; };
static const struct lb_kind LB_KINDS[] = {
    {"resnet-like", 160, 3000, 17000, 30000, 200000},   /* ~37 % busy alone */
    {"encoder-like", 120, 3000, 30000, 30000, 200000},  /* ~55 % busy alone */
};
enum { LB_RAW, LB_MEMONLY, LB_HARD, LB_SOFT, LB_NMODES };

/* aggregate iterations/s of n copies in one mode; shares[i] (percent of device time, plant truth) */
static double lb_run(const struct lb_kind *k, int n, int mode, double *shares)
{
    static const char *names[] = {"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"};
    sim_reset();
    int share = mode == LB_HARD || mode == LB_SOFT ? 100 / n : 0;
    for (int i = 0; i < n; i++) {
        struct sproc *p = add(names[i], share, mode == LB_SOFT ? GS_CTL_SOFT : GS_CTL_HARD, 1, 1, W_LB, k->kmin, k->kmax);
        p->kper = k->kper; p->launch_cpu = k->cpu; p->think = k->think; p->raw = mode == LB_RAW;
        p->delay = i * 700000; /* not in lock step */
        p->rng = 777u + (unsigned)i * 31u;
    }
    sim_run(4, 1);
    double agg = 0;
    for (int i = 0; i < n; i++) {
        agg += P[i].iters / 3.0;
        if (shares) { double m, lo, hi; win_stats(&P[i], &m, &lo, &hi); shares[i] = m; }
    }
    return agg;
}

/* The issue-12 goals in the plant: memory-only slices >= 0.97x plain time-slicing, equal hard (and
 * soft) shares >= 0.9x, and each hard slice's device time within 2 points of its share, or of what
 * it uses alone when that is less (a launch-bound copy alone keeps the GPU ~34-51 % busy). Memory-
 * only processes must never wait and stay on the light path; the paced ones stay on the free path
 * (their offered load is ~0.4: turns would idle the device in their gaps). */
static void test_launch_bound(void)
{
    int64_t save = CTX_SWITCH, save_idle = CTX_SWITCH_IDLE, save_gap = LAUNCH_GAP;
    CTX_SWITCH = 50000; CTX_SWITCH_IDLE = 5000; LAUNCH_GAP = DT;
    printf("  launch-bound services (%lld us preempting / %lld us idle switches, %lld us launch gap): aggregate "
           "iterations/s\n", (long long)(CTX_SWITCH / 1000), (long long)(CTX_SWITCH_IDLE / 1000), (long long)(LAUNCH_GAP / 1000));
    printf("  %-13s %2s %8s | %8s | %-20s %-20s %-20s | share of device time (plant), min..max\n", "kind", "N",
           "alone", "plain", "memory-only", "hard equal", "soft equal");
    for (unsigned kk = 0; kk < sizeof LB_KINDS / sizeof *LB_KINDS; kk++) {
        const struct lb_kind *k = &LB_KINDS[kk];
        double alone_sh;
        double alone = lb_run(k, 1, LB_RAW, &alone_sh);
        for (int n = 2; n <= 8; n++) {
            double agg[LB_NMODES], sh[LB_NMODES][8];
            int light = 1, free_path = 1;
            int64_t slept = 0;
            for (int m = 0; m < LB_NMODES; m++) {
                agg[m] = lb_run(k, n, m, sh[m]);
                for (int i = 0; i < n; i++) {
                    if (m == LB_MEMONLY) { light &= P[i].eng.path == GS_DS_PATH_LIGHT; slept += P[i].slept_sum; }
                    if (m == LB_HARD) free_path &= P[i].eng.path == GS_DS_PATH_FREE;
                }
            }
            char cell[LB_NMODES][32];
            for (int m = 1; m < LB_NMODES; m++) snprintf(cell[m], sizeof cell[m], "%8.1f (%.2fx)", agg[m], agg[m] / agg[LB_RAW]);
            int share = 100 / n;
            double lo = 1e9, hi = -1e9, want = fmin(share, alone_sh);
            for (int i = 0; i < n; i++) { lo = fmin(lo, sh[LB_HARD][i]); hi = fmax(hi, sh[LB_HARD][i]); }
            printf("  %-13s %2d %8.1f | %8.1f | %-20s %-20s %-20s | hard %d%%: %.1f..%.1f (alone %.1f)\n", k->name, n,
                   alone, agg[LB_RAW], cell[LB_MEMONLY], cell[LB_HARD], cell[LB_SOFT], share, lo, hi, alone_sh);
            CHECK(agg[LB_MEMONLY] >= 0.97 * agg[LB_RAW], "%s N=%d: memory-only %.1f < 0.97 x plain %.1f", k->name, n,
                  agg[LB_MEMONLY], agg[LB_RAW]);
            CHECK(light && slept == 0, "%s N=%d: memory-only processes stay light and never wait (slept %lld ns)", k->name,
                  n, (long long)slept);
            CHECK(agg[LB_HARD] >= 0.9 * agg[LB_RAW], "%s N=%d: equal hard %.1f < 0.9 x plain %.1f", k->name, n, agg[LB_HARD],
                  agg[LB_RAW]);
            CHECK(agg[LB_SOFT] >= 0.9 * agg[LB_RAW], "%s N=%d: equal soft %.1f < 0.9 x plain %.1f", k->name, n, agg[LB_SOFT],
                  agg[LB_RAW]);
            CHECK(hi <= share + 2 && lo >= want - 2, "%s N=%d: hard %d%% slices got %.1f..%.1f of the device (alone %.1f)",
                  k->name, n, share, lo, hi, alone_sh);
            CHECK(free_path, "%s N=%d: the launch-bound paced processes take the free path", k->name, n);
        }
    }
    CTX_SWITCH = save; CTX_SWITCH_IDLE = save_idle; LAUNCH_GAP = save_gap;
}

/* Shares while contexts overlap: paced slices beside unpaced neighbours the pacer cannot hold back,
 * so the GPU time-slices them and event pairs hold the neighbours' runs. The cap must still hold on
 * the plant's ground truth (summing raw pairs would charge the neighbours' time slices too). */
static void test_overlap(void)
{
    int64_t save = CTX_SWITCH, save_idle = CTX_SWITCH_IDLE, save_gap = LAUNCH_GAP;
    CTX_SWITCH = 50000; CTX_SWITCH_IDLE = 5000; LAUNCH_GAP = DT;
    /* a launch-bound service capped at 20 % beside three saturating unpaced loops of 1 ms kernels:
     * time-slicing alone would give it 25 % */
    sim_reset();
    struct sproc *p = add("lb20", 20, GS_CTL_HARD, 1, 1, W_LB, 3000, 60000);
    p->kper = 100; p->launch_cpu = 50000; p->think = 100000; /* ~34 us kernels 55 us apart: ~60 % alone */
    for (int i = 0; i < 3; i++) add(i == 0 ? "sat0" : i == 1 ? "sat1" : "sat2", 0, GS_CTL_HARD, 1, 1, W_SAT, 1000000, 1000000);
    sim_run(6, 2);
    expect_share(p, 20, 2, "launch-bound 20% beside 3 unpaced loops");
    CHECK(p->eng.sampled_dirty > p->eng.sampled_clean, "its pairs overlapped neighbours (%llu dirty, %llu clean)",
          (unsigned long long)p->eng.sampled_dirty, (unsigned long long)p->eng.sampled_clean);
    for (int i = 1; i < 4; i++) CHECK(P[i].slept_sum == 0 && P[i].eng.path == GS_DS_PATH_LIGHT, "unpaced loop %d never waits", i);
    /* a saturating 30 % slice (turns path, but no one to take turns with) beside two unpaced
     * launch-bound services: their short kernels land inside its pairs */
    sim_reset();
    struct sproc *q = add("sat30", 30, GS_CTL_HARD, 1, 1, W_SAT, 300000, 300000);
    for (int i = 0; i < 2; i++) {
        struct sproc *r = add(i ? "lb-b" : "lb-a", 0, GS_CTL_HARD, 1, 1, W_LB, 3000, 17000);
        r->kper = 160; r->launch_cpu = 30000; r->think = 200000; r->delay = i * 900000;
    }
    sim_run(6, 2);
    expect_share(q, 30, 2, "saturating 30% beside 2 unpaced launch-bound");
    CHECK(q->eng.path == GS_DS_PATH_TURNS, "the saturating slice takes the turns path (%d)", q->eng.path);
    /* both kinds paced on one device: launch-bound 30 % (free) and saturating 50 % (turns) */
    sim_reset();
    struct sproc *a = add("lb30", 30, GS_CTL_HARD, 1, 1, W_LB, 3000, 60000);
    a->kper = 100; a->launch_cpu = 50000; a->think = 50000;
    struct sproc *b = add("sat50", 50, GS_CTL_HARD, 1, 1, W_SAT, 400000, 400000);
    sim_run(6, 2);
    expect_share(a, 30, 2, "launch-bound 30% beside saturating 50%");
    expect_share(b, 50, 2, "saturating 50% beside launch-bound 30%");
    CHECK(a->eng.path == GS_DS_PATH_FREE && b->eng.path == GS_DS_PATH_TURNS, "paths free / turns (%d, %d)", a->eng.path,
          b->eng.path);
    CTX_SWITCH = save; CTX_SWITCH_IDLE = save_idle; LAUNCH_GAP = save_gap;
}

/* A soft slice alone is allowed the whole device: whatever it is charged, it must not pile up debt
 * (two streams, launch gaps can charge a little above the wall time), or a neighbour's arrival
 * would leave it starved for seconds. The hook puts the debt at its floor while it runs alone. */
static void poke_debt(void)
{
    if (NOW != T0 + 2500000000LL) return;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if ((DS.slices[i].flags & GS_DS_SLICE_IN_USE) && !strcmp(DS.slices[i].grant, "soft"))
            DS.slices[i].credit_ns = -GS_CTL_DEBT_MAX_NS;
}
static void test_soft_alone_keeps_no_debt(void)
{
    sim_reset();
    add("soft", 50, GS_CTL_SOFT, 1, 0, W_SAT, 200000, 200000);
    struct sproc *h = add("hard", 50, GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
    h->delay = 3000000000LL;
    SIM_HOOK = poke_debt;
    sim_run(6, 0);
    SIM_HOOK = NULL;
    /* windows 3 and 4 (t = 3..5 s): the neighbour runs since t = 3 */
    printf("  soft alone then a neighbour: soft %.1f %% / %.1f %% in the two windows after it came\n", P[0].wins[3],
           P[0].wins[4]);
    CHECK(P[0].nwin >= 5 && P[0].wins[3] >= 45 && P[0].wins[4] >= 48, "soft slice starved after its neighbour came: %.1f %.1f",
          P[0].wins[3], P[0].wins[4]);
}

/* What the launch gap costs a lone paced slice: a pair started on an empty queue holds the time the
 * kernel takes to arrive (the plant's 5 us per 200 us kernel: 2.5 %; the H100's matmul at 10-50 %
 * came out 1.0 point low, 2026-11-23-h100-compute.txt). Reported, and bounded at the +-2 goal. */
static void test_launch_gap(void)
{
    int64_t save_gap = LAUNCH_GAP;
    LAUNCH_GAP = DT;
    const double shares[] = {10, 50, 90};
    for (unsigned k = 0; k < 3; k++) {
        sim_reset();
        add("gap", shares[k], GS_CTL_HARD, 1, 0, W_SAT, 200000, 200000);
        sim_run(6, 2);
        expect_share(&P[0], shares[k], 2, "5 us launch gap, 200 us kernels");
    }
    LAUNCH_GAP = save_gap;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_allocate();
    test_single_shares();
    test_multi();
    test_weights_soft();
    test_bursty();
    test_priority();
    test_resume_bounded();
    test_pessimistic_events();
    test_switch_cost();
    test_launch_bound();
    test_overlap();
    test_launch_gap();
    test_soft_alone_keeps_no_debt();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (DIR_[0] && system(cmd) != 0) printf("note: could not remove %s\n", DIR_);
    printf("test_controller: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
