/* Co-location in the plant (issue 13; README-compute.md, "Co-location"): a high-priority online server
 * beside a low-priority trainer that would saturate the device, under each colocation mode, on two
 * simulated devices:
 *   h100-like   a context that gets work while another runs preempts it after 5 us, and a switch costs
 *               5 us: what the H100 shows beside a busy neighbour (plain time-slicing made a ResNet-18
 *               request of ~65 kernels 0.7 ms slower beside a trainer, ~10 us a kernel, while the
 *               trainer kept the idle time; 2026-11-23-h100-compute.txt);
 *   slice-fifo  round robin at the end of 2-ms slices only, 50 us per preempting switch: the
 *               pessimistic device, where queued low-priority work is what a request waits behind.
 * Three server kinds (launch-bound at batch 1 with idle gaps, GPU-bound batched, a decoder's loop of
 * tiny kernels with a sync per token), each alone, beside the trainer with no enforcer (plain), and
 * with gpuslice preemptive, shared and tidal; the trainer alone. Reported: the server's p50/p99 against
 * alone, the trainer's iterations against alone and against the idle-time bound (its alone speed x
 * the idle fraction the server leaves alone), and the goals of issue 13 are checked where the design
 * promises them (the benchmark on a GPU, bench/gpu/coloc.sh, measures the real thing). */
#include "plant.h"
#include <sched.h>

struct gpu_model {
    const char *name;
    int arrival;
    int64_t slice, sw, sw_idle;
};
static const struct gpu_model MODELS[] = {
    {"h100-like", 1, 2000000, 5000, 5000},
    {"slice-fifo", 0, 2000000, 50000, 5000},
};

static void use_model(const struct gpu_model *m)
{
    ARRIVAL_PREEMPT = m->arrival;
    PREEMPT_LAT = DT;
    TIMESLICE = m->slice;
    CTX_SWITCH = m->sw;
    CTX_SWITCH_IDLE = m->sw_idle;
    LAUNCH_GAP = DT;
    WAKE_LAT = 20000;
    POLL_WAKE_LAT = 10000;
}

static void plain_model(void)
{
    ARRIVAL_PREEMPT = 0;
    TIMESLICE = 2000000;
    CTX_SWITCH = 0;
    CTX_SWITCH_IDLE = -1;
    LAUNCH_GAP = 0;
    WAKE_LAT = 0;
    POLL_WAKE_LAT = 0;
}

/* A request: ntok tokens of kper kernels (fixed shapes over [kmin, kmax]) launched cpu apart, a sync
 * and tok_cpu of CPU after each token; think between requests. */
struct server_kind {
    const char *name;
    int ntok, kper;
    int64_t kmin, kmax, cpu, tok_cpu, think;
};
static const struct server_kind SERVERS[] = {
    /* batch 1: 120 kernels of 5-15 us launched 20 us apart (the GPU idles most of a request), 3 ms think */
    {"launch-bound", 1, 120, 5000, 15000, 20000, 0, 3000000},
    /* shaped like the H100 finding (ResNet-50 b1 under eager PyTorch: the GPU idle 91 % of the time alone, only
     * 39 % of it between requests, bench/results/2026-11-25-h100-coloc-steps12.md): 160 kernels of 3-10 us
     * launched 35 us apart (a ~5.6-ms request, the GPU busy ~1 ms of it), 4 ms think */
    {"gappy-b1", 1, 160, 3000, 10000, 35000, 0, 4000000},
    /* batch 32: 40 kernels of 100-400 us, the CPU runs ahead (10 us apart), 8 ms think */
    {"gpu-bound", 1, 40, 100000, 400000, 10000, 0, 8000000},
    /* a decoder: 16 tokens of 40 kernels of 5-20 us (8 us apart), sync + 100 us of sampling per token */
    {"decode", 16, 40, 5000, 20000, 8000, 100000, 5000000},
};
enum { M_ALONE, M_PLAIN, M_PREEMPT, M_SHARED, M_TIDAL, M_N };
static const char *MODE_NAMES[] = {"alone", "plain", "preemptive", "shared", "tidal"};

struct result {
    double p50, p99, reqs, train, busy; /* ms, ms, requests/s, trainer iterations/s, server's device time % */
    double held;                        /* s the server's launches were held back by the pacer */
};

static struct sproc *add_server(const struct server_kind *k, double share, int mode, int coloc, int raw)
{
    struct sproc *h = add("server", share, mode, 1, 0, W_SRV, k->kmin, k->kmax);
    h->ntok = k->ntok;
    h->kper = k->kper;
    h->launch_cpu = k->cpu;
    h->tok_cpu = k->tok_cpu;
    h->think = k->think;
    h->coloc = coloc;
    h->raw = raw;
    h->rng = 4242u;
    return h;
}

/* the trainer: iterations of 200 kernels of 20-400 us (random shapes), 5 us of CPU apart, a sync
 * (loss.item()) and no think: alone it keeps the device ~97 % busy */
static struct sproc *add_trainer(double share, int mode, int coloc, int raw)
{
    struct sproc *l = add("trainer", share, mode, 1, 1, W_ITER, 20000, 400000);
    l->kper = 200;
    l->launch_cpu = 5000;
    l->think = 0;
    l->coloc = coloc;
    l->raw = raw;
    l->delay = 300000;
    return l;
}

#define SECS 6.0
#define WARM 1.0

static struct result run(const struct server_kind *k, int m, double server_busy)
{
    sim_reset();
    struct sproc *h = NULL, *l = NULL;
    /* shared: shares sized from what the server uses alone (x1.25 + 5 points), both soft, the trainer
     * the rest: what a user who measured the server would set */
    int sh = (int)lround(fmin(90, fmax(10, server_busy * 1.25 + 5)));
    if (k) {
        if (m == M_SHARED) h = add_server(k, sh, GS_CTL_SOFT, GS_COLOC_SHARED, 0);
        else h = add_server(k, 0, GS_CTL_HARD, GS_COLOC_PREEMPTIVE, m == M_PLAIN || m == M_ALONE);
    }
    if (!k || m != M_ALONE) {
        if (m == M_SHARED) l = add_trainer(100 - sh, GS_CTL_SOFT, GS_COLOC_SHARED, 0);
        else l = add_trainer(0, GS_CTL_HARD, m == M_TIDAL ? GS_COLOC_TIDAL : GS_COLOC_PREEMPTIVE, m == M_PLAIN || m == M_ALONE);
    }
    sim_run(SECS, WARM);
    struct result r = {0, 0, 0, 0, 0, 0};
    if (h) {
        r.p50 = pct(h, 0.5) / 1e6;
        r.p99 = pct(h, 0.99) / 1e6;
        r.reqs = h->iters / (SECS - WARM);
        r.busy = 100.0 * (h->busy_true - h->busy_at_warm) / ((SECS - WARM) * 1e9);
        r.held = h->slept_sum / 1e9;
    }
    if (l) r.train = l->iters / (SECS - WARM);
    return r;
}

static void test_modes(const struct gpu_model *gm)
{
    use_model(gm);
    struct result talone = run(NULL, M_PLAIN, 0);
    printf("  %s device: trainer alone %.1f it/s\n", gm->name, talone.train);
    printf("  %-13s %-11s %12s %8s %8s | %9s %8s %8s\n", "server", "mode", "p50/p99 ms", "p50 x", "p99 x", "trainer", "x alone",
           "x bound");
    for (unsigned kk = 0; kk < sizeof SERVERS / sizeof *SERVERS; kk++) {
        const struct server_kind *k = &SERVERS[kk];
        struct result alone = run(k, M_ALONE, 0), res[M_N];
        res[M_ALONE] = alone;
        double idle = 1 - alone.busy / 100, bound = talone.train * idle;
        for (int m = M_PLAIN; m < M_N; m++) res[m] = run(k, m, alone.busy);
        for (int m = 0; m < M_N; m++) {
            struct result *r = &res[m];
            printf("  %-13s %-11s %5.2f/%5.2f %8.3f %8.3f | %9.1f %8.2f %8.2f%s\n", k->name, MODE_NAMES[m], r->p50, r->p99,
                   r->p50 / alone.p50, r->p99 / alone.p99, r->train, r->train / talone.train, r->train / bound,
                   m == M_ALONE ? "" : "");
        }
        printf("  %-13s alone: device busy %.1f %%, idle bound for the trainer %.1f it/s\n", k->name, alone.busy, bound);
        struct result *p = &res[M_PREEMPT], *pl = &res[M_PLAIN];
        if (gm->arrival) {
            /* the goals of issue 13 where the device preempts on arrival (the H100's behaviour) */
            CHECK(p->p50 <= 1.03 * alone.p50, "%s/%s: preemptive p50 %.3f ms > 1.03 x alone %.3f", gm->name, k->name, p->p50,
                  alone.p50);
            CHECK(p->p99 <= 1.10 * alone.p99, "%s/%s: preemptive p99 %.3f ms > 1.10 x alone %.3f", gm->name, k->name, p->p99,
                  alone.p99);
        } else {
            /* the bound on the pessimistic device: a server kernel waits behind at most YIELD_QUEUE, the
             * trainer's longest kernel (400 us) and a switch, once per gap the trainer entered. A request
             * of one burst (launch-bound, GPU-bound) pays it about once; a decoder, whose per-token
             * sampling gaps the trainer now enters, up to once per token (plain time-slicing: 3.5x alone) */
            double bound_ms = (GS_CTL_YIELD_QUEUE_NS + 400000 + 2 * gm->sw) / 1e6;
            CHECK(p->p99 <= alone.p99 + k->ntok * bound_ms, "%s/%s: preemptive p99 %.3f ms > alone %.3f + %d x %.2f", gm->name,
                  k->name, p->p99, alone.p99, k->ntok, bound_ms);
        }
        if (gm->arrival || k->ntok == 1)
            CHECK(p->reqs >= 0.97 * alone.reqs, "%s/%s: the server keeps its request rate (%.1f vs %.1f /s)", gm->name, k->name,
                  p->reqs, alone.reqs);
        else
            CHECK(p->reqs >= pl->reqs, "%s/%s: request rate %.1f < plain's %.1f /s", gm->name, k->name, p->reqs, pl->reqs);
        /* work-conserving (issue 13, item 1): the trainer is held only while the server's queue is seen
         * not drained, so it also gets the idle time inside requests (CPU gaps, per-token syncs): at least
         * 80 % of its alone speed x the server's idle fraction, and where plain time-slicing protects the
         * server's p99 as well (<= 1.10 x alone), what plain gives it (3 % margin: 1 iteration in 5 s of
         * a ~14 it/s trainer is 1.4 %) */
        CHECK(p->train >= 0.8 * bound, "%s/%s: preemptive trainer %.1f it/s < 0.8 x the idle bound %.1f", gm->name, k->name,
              p->train, bound);
        if (pl->p99 <= 1.10 * alone.p99)
            CHECK(p->train >= 0.97 * pl->train, "%s/%s: preemptive trainer %.1f it/s < plain's %.1f with the same p99 protection",
                  gm->name, k->name, p->train, pl->train);
        double period = alone.p50 + k->think / 1e6, between = (k->think - GS_CTL_YIELD_GAP_NS) / 1e6 / period;
        /* shared: nobody yields and nobody is held below its soft share: the server (its share sized from
         * its use alone) is held by the pacer for under 1 % of the time (a GPU-bound request's burst can
         * outrun the 10-ms credit: 0.35 % measured); the trainer gets at least 90 % of its share's worth. The
         * server's latency is time-slicing's then (h100-like: p99 up to 1.3x alone): shared is for two jobs
         * that both must progress, not for a latency-critical one */
        struct result *sr = &res[M_SHARED];
        int sh = (int)lround(fmin(90, fmax(10, alone.busy * 1.25 + 5)));
        CHECK(sr->held < 0.01 * SECS, "%s/%s: the shared server was held %.4f s", gm->name, k->name, sr->held);
        double share_worth = talone.train * (100 - sh) / 100.0;
        if (pl->train >= share_worth)
            CHECK(sr->train >= 0.9 * share_worth, "%s/%s: shared trainer %.1f it/s < 0.9 x its %d %% share of %.1f", gm->name,
                  k->name, sr->train, 100 - sh, talone.train);
        else /* the device's switches (one each way per server kernel) leave even plain time-slicing less than
              * the share (gappy-b1: 160 kernels a request). Shared gets 0.83 of plain there (h100-like:
              * 14.0 vs 16.8 it/s): the turns path of a saturating paced trainer beside a server that launches
              * every 35 us, not co-location's yield path; left to the pacer's throughput work (issue 12) */
            CHECK(sr->train >= 0.8 * pl->train, "%s/%s: shared trainer %.1f it/s < 0.8 x plain's %.1f", gm->name, k->name,
                  sr->train, pl->train);
        /* tidal follows the time the server leaves: at least that much of the between-request bound */
        CHECK(res[M_TIDAL].train >= 0.9 * talone.train * between, "%s/%s: tidal trainer %.1f it/s < 0.9 x alone x %.2f",
              gm->name, k->name, res[M_TIDAL].train, between);
    }
}

/* A preemptive server that is on the device but idle (one request, then a long think): the trainer
 * keeps its queue bounded (the server may come back any time) and still runs at full speed. */
static void test_work_conserving(const struct gpu_model *gm)
{
    use_model(gm);
    struct result talone = run(NULL, M_PLAIN, 0);
    sim_reset();
    struct sproc *h = add_server(&SERVERS[1], 0, GS_CTL_HARD, GS_COLOC_PREEMPTIVE, 0);
    h->think = 100000000000LL;
    struct sproc *l = add_trainer(0, GS_CTL_HARD, GS_COLOC_PREEMPTIVE, 0);
    sim_run(SECS, WARM);
    double t = l->iters / (SECS - WARM);
    printf("  %s: trainer beside an idle preemptive server %.1f it/s (alone %.1f), path %d\n", gm->name, t, talone.train,
           l->eng.path);
    CHECK(l->eng.path == GS_DS_PATH_YIELD, "the trainer is on the yield path beside the server (%d)", l->eng.path);
    CHECK(t >= 0.97 * talone.train, "%s: trainer beside an idle server %.1f < 0.97 x alone %.1f", gm->name, t, talone.train);
    /* a paced trainer (30 %, hard) on the yield path is still held to its share */
    sim_reset();
    h = add_server(&SERVERS[1], 0, GS_CTL_HARD, GS_COLOC_PREEMPTIVE, 0);
    h->think = 100000000000LL;
    l = add_trainer(30, GS_CTL_HARD, GS_COLOC_PREEMPTIVE, 0);
    sim_run(SECS, 2);
    expect_share(l, 30, 2, "a 30 % trainer on the yield path");
}

/* Where a yielding trainer's held time goes (gs_engine_stats' yield_*_ns): every sleep the yield gate asked
 * for is counted once, by why it held (the trainer is unpaced: beyond its first launches it sleeps for
 * nothing else), and the split names what holds it beside each server kind, which the GPU bench reads from
 * the real enforcer. Most of it is its own queue's bound, the normal state of a trainer that keeps the device
 * busy; the neighbour's reasons are the time it waits for the server. */
static void test_yield_time_by_why(const struct gpu_model *gm)
{
    use_model(gm);
    static const char *why[GS_YW_N] = {"-", "busy", "backlog", "late", "no looks", "own queue"};
    static const char *field[GS_YW_N] = {"", "yield_busy_ns", "yield_backlog_ns", "yield_late_ns", "yield_no_looks_ns",
                                         "yield_own_queue_ns"};
    for (unsigned kk = 0; kk < sizeof SERVERS / sizeof *SERVERS; kk++) {
        (void)run(&SERVERS[kk], M_PREEMPT, 0);
        struct sproc *l = &P[1];
        printf("  %s/%s: the trainer held %.3f s:", gm->name, SERVERS[kk].name, l->slept_sum / 1e9);
        for (int w = GS_YW_BUSY; w < GS_YW_N; w++) printf(" %s %.3f", why[w], l->eng.st_yield_ns[w] / 1e9);
        printf(" (other waits %.6f)\n", l->slept_why[GS_YW_NONE] / 1e9);
        CHECK(!strcmp(l->grant, "trainer") && l->eng.path == GS_DS_PATH_YIELD, "%s/%s: the trainer yields", gm->name,
              SERVERS[kk].name);
        /* each reason gets exactly the sleeps the gate asked for with it; the last sleep of the run is counted
         * only by the call after it (never made), and the credit's waits (its first launches) by none */
        for (int w = GS_YW_NONE; w < GS_YW_N; w++) {
            int64_t got = l->eng.st_yield_ns[w], want = l->slept_why[w] * (w != GS_YW_NONE);
            CHECK(got <= want && want - got <= GS_CTL_WAIT_MAX_NS + 1000000, "%s/%s: %s counted %lld ns, slept %lld",
                  gm->name, SERVERS[kk].name, why[w], (long long)got, (long long)want);
        }
        CHECK(l->eng.st_yield_ns[GS_YW_BACKLOG] > 0 && l->eng.st_yield_ns[GS_YW_OWN_QUEUE] > 0,
              "%s/%s: the server's backlog and the trainer's own queue bound both hold it", gm->name, SERVERS[kk].name);
        if (!strcmp(SERVERS[kk].name, "gpu-bound"))
            CHECK(l->eng.st_yield_ns[GS_YW_BACKLOG] > l->eng.st_yield_ns[GS_YW_LATE],
                  "%s/gpu-bound: a batch's backlog is what holds the trainer for it", gm->name);
    }
    /* the stats name every reason's sum and the gate's let-gos, each under its own field */
    struct gs_engine *e = &P[1].eng;
    for (int w = GS_YW_BUSY; w < GS_YW_N; w++) e->st_yield_ns[w] = 1000 + w;
    e->yield_entries = 77;
    char buf[1024], want[96];
    int n = gs_engine_stats(e, buf, sizeof buf);
    CHECK(n > 0 && n < (int)sizeof buf && strstr(buf, "\"yield_entries\": 77,"), "the stats give the let-gos: %s", buf);
    for (int w = GS_YW_BUSY; w < GS_YW_N; w++) {
        snprintf(want, sizeof want, "\"%s\": %d", field[w], 1000 + w);
        CHECK(strstr(buf, want) != NULL, "the stats give %s: %s", field[w], buf);
    }
}

/* The schedule of a tidal slice: its share at the hour it is told (UTC), the slice's compute share for
 * hours no span covers (0: the whole device). */
static void test_tidal_schedule(void)
{
    use_model(&MODELS[0]);
    struct gs_tidal t;
    char err[160];
    CHECK(gs_tidal_parse("0-8:30, 8-20:60", &t, err, sizeof err) == 0, "schedule parses: %s", err);
    static const struct { int hour; double want; } at[] = {{3, 30}, {12, 60}};
    for (unsigned i = 0; i < 2; i++) {
        sim_reset();
        struct sproc *l = add_trainer(0, GS_CTL_HARD, GS_COLOC_TIDAL, 0);
        l->tidal = t;
        l->tidal_hour = at[i].hour;
        sim_run(6, 2);
        expect_share(l, at[i].want, 2, "tidal schedule, trainer alone");
    }
    sim_reset();
    struct sproc *l = add_trainer(0, GS_CTL_HARD, GS_COLOC_TIDAL, 0);
    l->tidal = t;
    l->tidal_hour = 21;
    sim_run(5, 2);
    double m, lo, hi;
    win_stats(l, &m, &lo, &hi);
    printf("  tidal schedule, an hour no span covers: %.1f %% of the device\n", m);
    CHECK(m >= 95, "an hour no span covers gives the whole device (compute 0): %.1f", m);
}

/* Following the idle time: beside a server that is busy for a second and idle for the next, a
 * preemptive trainer takes every idle second whole; a tidal one follows the tide (the server's queued
 * fraction, EWMA over 2 s: ~half), so it does not jump to the whole device in each lull. Both yield
 * to the server while it is queued. */
static void test_tidal_follows_idle(void)
{
    use_model(&MODELS[0]);
    double off_share[2];
    for (int tidal = 0; tidal < 2; tidal++) {
        sim_reset();
        struct sproc *h = add("server", 0, GS_CTL_HARD, 1, 0, W_BURST, 200000, 200000);
        h->on = 1000000000;
        h->off = 1000000000;
        h->kper = 10;
        struct sproc *l = add_trainer(0, GS_CTL_HARD, tidal ? GS_COLOC_TIDAL : GS_COLOC_PREEMPTIVE, 0);
        sim_run(10, 4);
        /* windows start at t = 4 s: even windows are the server's on-phases, odd ones its lulls */
        double on = 0, off = 0;
        for (int i = 0; i + 1 < l->nwin; i += 2) {
            on += l->wins[i];
            off += l->wins[i + 1];
        }
        off_share[tidal] = off / (l->nwin / 2);
        printf("  bursty server (1 s on, 1 s off): %s trainer %.1f %% of its on-phases, %.1f %% of its lulls (share "
               "now %.1f %%)\n", tidal ? "tidal" : "preemptive", on / (l->nwin / 2), off_share[tidal], l->eng.share_bp / 100.0);
        CHECK(on / (l->nwin / 2) < 5, "the trainer yields while the server runs: %.1f %%", on / (l->nwin / 2));
    }
    CHECK(off_share[0] > 90, "a preemptive trainer takes the lulls: %.1f %%", off_share[0]);
    CHECK(off_share[1] > 30 && off_share[1] < 75, "a tidal trainer follows the tide, not each lull: %.1f %%", off_share[1]);
}

/* The contract of the queued signal (devstate.h, GS_DS_PROC_DRAINS): what a high-priority process's
 * poller publishes from its drain event, and what a neighbour reads from it. */
static int fake_pending, queries;
static int fq_drain(void *c) { (void)c; queries++; return fake_pending ? 0 : 1; }
static void test_queued_signal(void)
{
    static _Alignas(4096) unsigned char spage[4096], ppage[4096]; /* one slot: its two pages, unmapped */
    struct gs_devstate ds = {.sbase = spage, .pbase = ppage, .page = sizeof spage, .nslots = 1};
    static const struct gs_gpu_ops ops = {.query_drain = fq_drain};
    struct gs_engine e;
    memset(&e, 0, sizeof e);
    e.ds = &ds;
    e.ops = &ops;
    struct gs_ds_proc *p = gs_ds_proc(&ds, 0);
    int64_t t = T0;
    /* an older enforcer (no DRAINS flag): queued for YIELD_GAP after a launch */
    p->flags = GS_DS_PROC_IN_USE | GS_DS_PROC_LIGHT;
    p->last_launch_ns = t;
    CHECK(gs_eng_high_queued(p, t + GS_CTL_YIELD_GAP_NS - 1) == GS_YW_NO_LOOKS &&
          !gs_eng_high_queued(p, t + GS_CTL_YIELD_GAP_NS),
          "without drain looks: queued for YIELD_GAP after a launch (why: no looks)");
    p->drain_seen_ns = t + GS_CTL_YIELD_GAP_NS;
    CHECK(gs_eng_high_queued(p, t + GS_CTL_YIELD_GAP_NS + GS_CTL_DRAIN_FRESH_NS - 1) == GS_YW_NO_LOOKS &&
          !gs_eng_high_queued(p, t + GS_CTL_YIELD_GAP_NS + GS_CTL_DRAIN_FRESH_NS), "or DRAIN_FRESH after a sighting");
    p->drain_seen_ns = 0;
    /* a measured busy flag, believed while its poller is alive */
    p->flags |= GS_DS_PROC_BUSY;
    p->last_seen_ns = t;
    CHECK(gs_eng_high_queued(p, t + GS_CTL_BUSY_STALE_NS - 1) == GS_YW_BUSY &&
          !gs_eng_high_queued(p, t + GS_CTL_BUSY_STALE_NS + GS_CTL_YIELD_GAP_NS), "a busy flag holds (why: busy)");
    p->flags &= ~GS_DS_PROC_BUSY;
    p->flags |= GS_DS_PROC_DRAINS;
    /* one launch, its kernel pending at the first look: not a backlog, not queued */
    __atomic_store_n(&e.drain_gen, 1, __ATOMIC_RELAXED);
    e.drain_pending = 1;
    fake_pending = 1;
    gs_coloc_drain_poll(&e, t + 10000);
    CHECK(p->drain_seen_ns == t + 10000 && !p->drain_backlog_ns && !gs_eng_high_queued(p, t + 12000),
          "one short kernel pending is not a backlog (seen %lld, backlog %lld)", (long long)p->drain_seen_ns,
          (long long)p->drain_backlog_ns);
    CHECK(gs_coloc_drain_delay(&e, t + 10000) == GS_CTL_DRAIN_SPIN_NS, "the next look comes after DRAIN_SPIN");
    /* a second launch behind the pending one: a backlog at the next look, and queued from then on */
    __atomic_store_n(&e.drain_gen, 2, __ATOMIC_RELAXED);
    p->last_launch_ns = t + 15000;
    gs_coloc_drain_poll(&e, t + 20000);
    CHECK(p->drain_backlog_ns == t + 20000 &&
          gs_eng_high_queued(p, t + 20000 + GS_CTL_BUSY_STALE_NS - 1) == GS_YW_BACKLOG &&
          !gs_eng_high_queued(p, t + 20000 + GS_CTL_BUSY_STALE_NS), "a backlog holds (for BUSY_STALE without looks)");
    /* pending DRAIN_SHORT is a backlog too; the looks back off to DRAIN_POLL behind it */
    CHECK(gs_coloc_drain_delay(&e, t + 10000 + 4 * GS_CTL_DRAIN_POLL_NS) == GS_CTL_DRAIN_POLL_NS, "looks back off");
    /* drained: the backlog is over, the queue seen empty, not queued */
    fake_pending = 0;
    gs_coloc_drain_poll(&e, t + 30000);
    CHECK(!p->drain_backlog_ns && p->drain_done_ns == t + 30000 && !e.drain_pending && !gs_eng_high_queued(p, t + 30001),
          "drained: not queued");
    /* a single kernel pending for DRAIN_SHORT becomes a backlog */
    __atomic_store_n(&e.drain_gen, 3, __ATOMIC_RELAXED);
    p->last_launch_ns = t + 40000;
    e.drain_pending = 1;
    fake_pending = 1;
    gs_coloc_drain_poll(&e, t + 45000);
    CHECK(!p->drain_backlog_ns, "not a backlog yet");
    gs_coloc_drain_poll(&e, t + 45000 + GS_CTL_DRAIN_SHORT_NS);
    CHECK(p->drain_backlog_ns && gs_eng_high_queued(p, t + 46000 + GS_CTL_DRAIN_SHORT_NS), "pending DRAIN_SHORT: a backlog");
    /* a launch within a busy spell (a look less than DRAIN_LATE ago) is not queued before its look ... */
    fake_pending = 0;
    gs_coloc_drain_poll(&e, t + 100000);
    p->last_launch_ns = t + 120000;
    CHECK(!gs_eng_high_queued(p, t + 100000 + GS_CTL_DRAIN_LATE_NS - 1), "a launch in a busy spell is not queued");
    /* ... the first after a quiet spell (or with a stalled poller) is, until its look, up to YIELD_GAP */
    int64_t l = t + 1000000;
    p->last_launch_ns = l;
    CHECK(gs_eng_high_queued(p, l) == GS_YW_LATE && gs_eng_high_queued(p, l + GS_CTL_YIELD_GAP_NS - 1) == GS_YW_LATE &&
          !gs_eng_high_queued(p, l + GS_CTL_YIELD_GAP_NS), "the first launch after a quiet spell: queued until looked at");
    __atomic_store_n(&e.drain_gen, 4, __ATOMIC_RELAXED);
    e.drain_pending = 1;
    gs_coloc_drain_poll(&e, l + 10000);
    CHECK(!gs_eng_high_queued(p, l + 10001), "looked at and drained: not queued");
}

/* The poller's wake (controller.h DRAIN_HOT): a launch that arms a drain record wakes the poller only when
 * it said it sleeps longer than DRAIN_POLL; within DRAIN_HOT of a launch it ticks every DRAIN_SPIN on its
 * own, and it never goes to a long sleep with a record armed. */
static int wakes, records;
static int fr_drain(void *c, void *s) { (void)c; (void)s; records++; return 0; }
static void fw_wake(void *c) { (void)c; wakes++; }
/* A light-path engine of a process whose neighbours yield to it (drains wanted), on the one-slot device state `ds`. */
static void light_drain_engine(struct gs_engine *e, struct gs_devstate *ds, const struct gs_gpu_ops *ops)
{
    memset(e, 0, sizeof *e);
    e->ds = ds;
    e->ops = ops;
    e->path = GS_DS_PATH_LIGHT;
    e->drain_wanted = 1;
}

static void test_poller_wake(void)
{
    static _Alignas(4096) unsigned char spage[4096], ppage[4096];
    struct gs_devstate ds = {.sbase = spage, .pbase = ppage, .page = sizeof spage, .nslots = 1};
    static const struct gs_gpu_ops ops = {.record_drain = fr_drain, .query_drain = fq_drain, .wake = fw_wake};
    struct gs_engine e;
    light_drain_engine(&e, &ds, &ops);
    e.poller_cold = 1; /* as gs_engine_init leaves it */
    struct gs_ds_proc *p = gs_ds_proc(&ds, 0);
    p->flags = GS_DS_PROC_IN_USE | GS_DS_PROC_LIGHT | GS_DS_PROC_DRAINS;
    struct gs_ticket t = {.slot = -1};
    int64_t l = T0;
    /* a request's first launch after idle time: the poller sleeps long, so it is woken once */
    p->last_launch_ns = l;
    gs_engine_after(&e, 0, NULL, &t, 1);
    CHECK(records == 1 && wakes == 1 && e.drain_pending, "the first armed record wakes a cold poller (wakes %d)", wakes);
    fake_pending = 0;
    gs_engine_poll(&e, l + 10000);
    CHECK(!e.drain_pending, "looked at and drained");
    /* hot: the next look comes after DRAIN_SPIN without a wake, for DRAIN_HOT after the last launch */
    CHECK(gs_engine_poll_delay(&e, l + 10000) == GS_CTL_DRAIN_SPIN_NS && !e.poller_cold, "hot: ticks every DRAIN_SPIN");
    p->last_launch_ns = l + 30000;
    gs_engine_after(&e, 0, NULL, &t, 1);
    CHECK(records == 2 && wakes == 1 && e.drain_pending, "a launch while the poller is hot arms without a wake");
    gs_engine_poll(&e, l + 40000);
    CHECK(gs_engine_poll_delay(&e, l + 30000 + GS_CTL_DRAIN_HOT_NS - 1) == GS_CTL_DRAIN_SPIN_NS, "still hot");
    /* DRAIN_HOT after the last launch: a long sleep again, and the next armed record wakes it */
    CHECK(gs_engine_poll_delay(&e, l + 30000 + GS_CTL_DRAIN_HOT_NS) > GS_CTL_DRAIN_POLL_NS && e.poller_cold, "cold again");
    p->last_launch_ns = l + 5000000;
    gs_engine_after(&e, 0, NULL, &t, 1);
    CHECK(records == 3 && wakes == 2, "a cold poller is woken (wakes %d)", wakes);
    /* a record armed while the poller decides to sleep long: it does not sleep long */
    gs_engine_poll(&e, l + 5000000 + 10000); /* drained */
    e.drain_pending = 1;                        /* armed before the poller decides (the race itself: the seq_cst pair) */
    int64_t w = gs_engine_poll_delay(&e, l + 5000000 + 2 * GS_CTL_DRAIN_HOT_NS);
    CHECK(w <= GS_CTL_DRAIN_POLL_NS && !e.poller_cold, "never a long sleep with a record armed (%lld)", (long long)w);
    /* a process nobody yields to records nothing and never ticks hot */
    e.drain_wanted = 0;
    e.drain_pending = 0;
    p->last_launch_ns = l + 9000000;
    gs_engine_after(&e, 0, NULL, &t, 1);
    CHECK(records == 3 && gs_engine_poll_delay(&e, l + 9000000 + 1000) > GS_CTL_DRAIN_POLL_NS, "no drains wanted: idle");
    /* a launch stamped after the poller's clock reading (another thread's later read) counts as just made */
    e.drain_wanted = 1;
    p->last_launch_ns = l + 20000000;
    CHECK(gs_engine_poll_delay(&e, l + 20000000 - 3000) == GS_CTL_DRAIN_SPIN_NS, "a launch after our clock: hot");
    /* the free path polls under the device lock: woken, never ticking hot */
    e.path = GS_DS_PATH_FREE;
    CHECK(gs_engine_poll_delay(&e, l + 20000000 + 1000) > GS_CTL_DRAIN_POLL_NS && e.poller_cold, "free path: not hot");
    e.path = GS_DS_PATH_LIGHT;
    /* DRAIN_AGE: a record younger than that is not looked at (no query, nothing published); at DRAIN_AGE it is */
    int64_t a = l + 30000000;
    p->last_launch_ns = a;
    gs_engine_after(&e, 0, NULL, &t, 1);
    fake_pending = 1;
    int q0 = queries;
    int64_t seen = p->drain_seen_ns;
    gs_coloc_drain_poll(&e, a + GS_CTL_DRAIN_AGE_NS - 1);
    CHECK(queries == q0 && p->drain_seen_ns == seen, "a record younger than DRAIN_AGE is not looked at");
    CHECK(gs_coloc_drain_delay(&e, a + GS_CTL_DRAIN_AGE_NS - 1) >= 1, "the next look waits for it");
    gs_coloc_drain_poll(&e, a + GS_CTL_DRAIN_AGE_NS);
    CHECK(queries == q0 + 1 && p->drain_seen_ns == a + GS_CTL_DRAIN_AGE_NS, "at DRAIN_AGE it is");
    /* one stamped after our clock is young; one stamped far ahead is no launch time: looked at */
    p->last_launch_ns = a + 100000 + 2000;
    gs_coloc_drain_poll(&e, a + 100000);
    CHECK(queries == q0 + 1, "a launch stamped after our clock reading is young");
    p->last_launch_ns = a + 100000 + 1000000000LL;
    gs_coloc_drain_poll(&e, a + 100000);
    CHECK(queries == q0 + 2, "a stamp far in the future does not stop the looks");
    fake_pending = 0;
    /* gs_engine_init leaves the poller cold: the first armed record of a process wakes it */
    struct gs_engine fresh;
    CHECK(gs_engine_init(&fresh, &DS, "wake-init", 0, GS_CTL_HARD, 1, 0, getpid(), 0, &SIM_OPS, NULL, T0) == 0 &&
              fresh.poller_cold == 1,
          "a new engine's poller counts as cold");
    gs_engine_fini(&fresh);
}

/* The two sides of the drain record, on two threads (a helper's harness, kept): a launch arms a record while the
 * poller clears the previous one and decides how long to sleep. Neither may be lost: a record armed after the
 * generation the poller saw stays pending (not dropped by its clear), and a poller that goes to a long sleep
 * with a record armed was woken. Both held only with seq_cst pairs (release/acquire lost ~1 % of rounds on a
 * multi-core host); on one free core the interleavings are rarer and the test can pass a broken pair. */
static struct gs_engine race_e;
static long race_n, race_go, race_done;
static int race_woke;
static void race_wake(void *c) { (void)c; __atomic_store_n(&race_woke, 1, __ATOMIC_SEQ_CST); }
static int race_rec(void *c, void *s) { (void)c; (void)s; return 0; }
static int race_query(void *c) { (void)c; return 1; }
static void wait_for(long *v, long i)
{
    for (int k = 0; __atomic_load_n(v, __ATOMIC_ACQUIRE) < i; k++)
        if (k > 64) sched_yield(); /* a loaded 2-core box: let the other side run */
}
static void *race_launcher(void *arg)
{
    (void)arg;
    struct gs_ticket t = {.slot = -1};
    for (long i = 1; i <= race_n; i++) {
        wait_for(&race_go, i);
        for (volatile int k = (int)(i * 7919 % 61); k > 0; k--) {
        }
        gs_engine_after(&race_e, 0, NULL, &t, 1);
        __atomic_store_n(&race_done, i, __ATOMIC_RELEASE);
    }
    return NULL;
}
static void test_drain_races(void)
{
    static _Alignas(4096) unsigned char spage[4096], ppage[4096];
    static struct gs_devstate ds = {.sbase = spage, .pbase = ppage, .page = sizeof spage, .nslots = 1};
    static const struct gs_gpu_ops ops = {.record_drain = race_rec, .query_drain = race_query, .wake = race_wake};
    memset(&race_e, 0, sizeof race_e);
    race_e.ds = &ds;
    race_e.ops = &ops;
    race_e.path = GS_DS_PATH_LIGHT;
    race_e.drain_wanted = 1;
    race_e.poller_cold = 1;
    struct gs_ds_proc *p = gs_ds_proc(&ds, 0);
    p->flags = GS_DS_PROC_IN_USE | GS_DS_PROC_LIGHT | GS_DS_PROC_DRAINS;
    p->last_launch_ns = 0; /* no hot window, no age gate: the poller decides a long sleep every round */
    race_n = 200000;
    pthread_t th;
    long lost_arm = 0, lost_wake = 0;
    CHECK(pthread_create(&th, NULL, race_launcher, NULL) == 0, "launcher thread");
    for (long i = 1; i <= race_n; i++) {
        race_e.drain_pending = 1;
        race_e.drain_done_gen = race_e.drain_gen;
        __atomic_store_n(&race_woke, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&race_go, i, __ATOMIC_SEQ_CST);
        for (volatile int k = (int)(i * 104729 % 61); k > 0; k--) {
        }
        int64_t now = T0 + i * 1000;
        gs_coloc_drain_poll(&race_e, now);
        int64_t w = gs_engine_poll_delay(&race_e, now);
        wait_for(&race_done, i);
        int pending = __atomic_load_n(&race_e.drain_pending, __ATOMIC_SEQ_CST);
        lost_arm += !pending && __atomic_load_n(&race_e.drain_gen, __ATOMIC_SEQ_CST) != race_e.drain_done_gen;
        lost_wake += pending && w > GS_CTL_DRAIN_POLL_NS && !__atomic_load_n(&race_woke, __ATOMIC_SEQ_CST);
    }
    pthread_join(th, NULL);
    CHECK(lost_arm == 0 && lost_wake == 0, "%ld rounds: %ld armed records dropped, %ld long sleeps with one armed", race_n,
          lost_arm, lost_wake);
}

/* A launch into a stream being captured into a CUDA graph runs only with the graph: a process whose neighbours
 * yield to it records no drain after it (the record would be captured, and the poller's look at it would
 * invalidate the application's capture) and does not stamp it as a launch (neighbours would be held through the
 * whole capture phase, up to YIELD_GAP after each captured launch: the review's demonstration held them at 2000 of
 * 2000 looks). A launch outside the capture goes on as before. */
static void *capturing_stream = (void *)0x77;
static int fc_capturing(void *c, void *s) { (void)c; return s == capturing_stream; }
static void test_a_capture_is_no_queue_and_gets_no_drain_record(void)
{
    static _Alignas(4096) unsigned char spage[4096], ppage[4096];
    struct gs_devstate ds = {.sbase = spage, .pbase = ppage, .page = sizeof spage, .nslots = 1};
    static const struct gs_gpu_ops ops = {.record_drain = fr_drain, .query_drain = fq_drain, .wake = fw_wake,
                                          .capturing = fc_capturing};
    struct gs_engine e;
    light_drain_engine(&e, &ds, &ops);
    int64_t l = T0 + 1000000;
    e.path_check_ns = e.beat_ns = l; /* no path recheck, no heartbeat inside the case */
    struct gs_ds_proc *p = gs_ds_proc(&ds, 0);
    p->flags = GS_DS_PROC_IN_USE | GS_DS_PROC_LIGHT | GS_DS_PROC_DRAINS;
    struct gs_ticket t = {.slot = -1, .captured = -1};
    int r0 = records;
    CHECK(gs_engine_before(&e, l, (void *)0x78, 7, 0, &t) == 0 && t.captured == 0 && p->last_launch_ns == l,
          "a launch outside a capture is asked about and stamped");
    gs_engine_after(&e, 0, (void *)0x78, &t, 1);
    CHECK(records == r0 + 1 && e.drain_pending, "and gets its drain record");
    fake_pending = 0;
    gs_coloc_drain_poll(&e, l + 10000);
    CHECK(!e.drain_pending && !gs_eng_high_queued(p, l + 10001), "looked at and drained");
    int held = 0, n = 2000;
    for (int i = 0; i < n; i++) { /* 20 ms of captured launches, 10 us apart */
        int64_t now = l + 20000 + (int64_t)i * 10000;
        e.path_check_ns = e.beat_ns = now; /* the path stays light (no neighbours in this state to recheck with) */
        gs_engine_before(&e, now, capturing_stream, 7, 0, &t);
        gs_engine_after(&e, 0, capturing_stream, &t, 1);
        held += gs_eng_high_queued(p, now + GS_CTL_DRAIN_LATE_NS + 1) != GS_YW_NONE;
    }
    CHECK(held == 0 && e.path == GS_DS_PATH_LIGHT, "neighbours never see a queue while it captures (%d of %d looks)", held, n);
    CHECK(records == r0 + 1 && !e.drain_pending && e.drain_gen == 1 && p->last_launch_ns == l,
          "no captured launch stamped or followed by a drain record (%d records)", records - r0);
    struct gs_ticket unasked = {.slot = -1, .captured = -1}; /* drains became wanted after its gs_engine_before */
    gs_engine_after(&e, 0, capturing_stream, &unasked, 1);
    CHECK(records == r0 + 1, "a ticket not asked about is asked in gs_engine_after: no record into the capture");
    int64_t m = l + 30000000;
    e.path_check_ns = e.beat_ns = m;
    gs_engine_before(&e, m, (void *)0x78, 7, 0, &t);
    gs_engine_after(&e, 0, (void *)0x78, &t, 1);
    CHECK(records == r0 + 2 && e.drain_pending && p->last_launch_ns == m, "the next launch outside it records again");
    fake_pending = 0;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (unsigned i = 0; i < sizeof MODELS / sizeof *MODELS; i++) {
        test_modes(&MODELS[i]);
        test_work_conserving(&MODELS[i]);
        test_yield_time_by_why(&MODELS[i]);
    }
    test_tidal_schedule();
    test_tidal_follows_idle();
    test_queued_signal();
    test_poller_wake();
    test_drain_races();
    test_a_capture_is_no_queue_and_gets_no_drain_record();
    plain_model();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (DIR_[0] && system(cmd) != 0) printf("note: could not remove %s\n", DIR_);
    printf("test_coloc: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
