/* Controller and pacer engine against a simulated device (no GPU): the allocation, shares of 1..8
 * slices, weights and soft shares, bursts, turns with switch costs, launch-bound services (issue 12)
 * and overlap with unpaced neighbours, on the plant of plant.h. Co-location of the two priorities is
 * test_coloc.c's. */
#include "plant.h"

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
    /* a credit scribbled to the extremes by a hostile tenant (the pacing file is 0666) clamps and never
     * overflows: UBSan (this test's sanitizer build) stops on signed overflow */
    CHECK(gs_ctl_charged(INT64_MIN, INT64_MAX) == -GS_CTL_DEBT_MAX_NS, "debt from the extreme clamps");
    CHECK(gs_ctl_charged(INT64_MAX, INT64_MIN) == GS_CTL_WANT_CAP_NS, "credit from the extreme clamps");
    struct gs_ctl_bucket hostile = {0};
    hostile.credit_ns = INT64_MIN;
    CHECK(gs_ctl_gate(&hostile, 5000, INT64_MAX) == GS_CTL_WAIT_MAX_NS, "a wait from the extreme is WAIT_MAX");
    hostile.credit_ns = -1000000000000000LL;
    CHECK(gs_ctl_gate(&hostile, 1, 1000) == GS_CTL_WAIT_MAX_NS, "a huge debt at a tiny rate waits WAIT_MAX");
    hostile.credit_ns = INT64_MAX;
    CHECK(gs_ctl_gate(&hostile, 5000, INT64_MIN) == 0, "a huge credit goes");
    /* offered load: turns from 1.5 up, back to free below 1.0 */
    CHECK(!gs_ctl_takes_turns(0, 14999) && gs_ctl_takes_turns(0, 15000), "turns from an offered load of 1.5");
    CHECK(gs_ctl_takes_turns(1, 10000) && !gs_ctl_takes_turns(1, 9999), "and back below 1.0 (hysteresis)");
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

/* What a launch-bound slice is charged against what it used (issue 12). On the H100 eight ResNet-50
 * services at 12 % hard were charged 11.4 % of the device each while, by their GPU time alone, they
 * used 6.4 %: they were throttled 17 % of the time, 0.77x plain time-slicing. In the plant the old
 * engine (before the floor band in costmodel.c and the launch-gap correction) charged two of these
 * loops 47-50 % of the device for 32 % used: dirty pairs holding a neighbour's kernel passed its
 * outlier rule (test_costmodel pins that rule). Loops with 30 % CPU jitter (exact ones phase-lock,
 * see CPU_JITTER); three kinds, the last as light as the H100's ResNet-50 (~27 % busy alone, so
 * N = 2..4 leave the GPU idle between kernels and pairs start on empty queues). Each hard slice's
 * charge must be within 2 points of what it used (plant truth), and the aggregate not below 0.95x
 * the same loops without gpuslice. */
static void test_launch_bound_charge(void)
{
    int64_t save = CTX_SWITCH, save_idle = CTX_SWITCH_IDLE, save_gap = LAUNCH_GAP;
    CTX_SWITCH = 50000; CTX_SWITCH_IDLE = 5000; LAUNCH_GAP = DT; CPU_JITTER = 0.3;
    static const struct lb_kind kinds[] = {
        {"resnet-like", 160, 3000, 17000, 30000, 200000},
        {"encoder-like", 120, 3000, 30000, 30000, 200000},
        {"h100-resnet", 160, 3000, 17000, 30000, 1500000},
    };
    static const int ns[] = {2, 3, 4, 6, 8};
    printf("  launch-bound, equal hard shares: device %% charged vs used (plant), aggregate vs no gpuslice\n");
    for (unsigned kk = 0; kk < sizeof kinds / sizeof *kinds; kk++) {
        for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int n = ns[ni];
            double raw = lb_run(&kinds[kk], n, LB_RAW, NULL), sh[8];
            double hard = lb_run(&kinds[kk], n, LB_HARD, sh);
            double worst = 0, secs = 4.0;
            for (int i = 0; i < n; i++) {
                double err = (P[i].charged - P[i].busy_true) / secs / 1e7;
                if (fabs(err) > fabs(worst)) worst = err;
            }
            printf("  %-13s N=%d: hard %.1f it/s (%.2fx plain), used %.1f %%, charge error worst %+.1f points\n", kinds[kk].name,
                   n, hard, hard / raw, sh[0], worst);
            CHECK(fabs(worst) <= 2, "%s N=%d: a hard slice was charged %+.1f points off what it used", kinds[kk].name, n, worst);
            CHECK(hard >= 0.95 * raw, "%s N=%d: equal hard %.1f < 0.95 x no gpuslice %.1f", kinds[kk].name, n, hard, raw);
        }
    }
    CPU_JITTER = 0;
    CTX_SWITCH = save; CTX_SWITCH_IDLE = save_idle; LAUNCH_GAP = save_gap;
}

/* A training loop alone, held at 25 / 75 %: 800 kernels of 3-80 us a step, 15 us of CPU apart (it
 * keeps the GPU busy alone), a 10-us launch gap and 20-us wake-ups. Whenever the pacer held it back,
 * its queue ran dry, and the pairs after that started on an empty queue: charged with their launch
 * gap, the slice got 20.7 / 70.0 % (the H100, 2026-11-25: ResNet-50 training 21.1 / 66.1 %). */
static void test_training_gap(void)
{
    int64_t save_gap = LAUNCH_GAP, save_wake = WAKE_LAT;
    LAUNCH_GAP = 2 * DT; WAKE_LAT = 20000;
    static const double shares[] = {25, 75};
    for (int blind = 1; blind >= 0; blind--)
        for (unsigned k = 0; k < 2; k++) {
            GAP_BLIND = blind;
            sim_reset();
            struct sproc *p = add("train", shares[k], GS_CTL_HARD, 1, 0, W_LB, 3000, 80000);
            p->kper = 800; p->launch_cpu = 15000; p->think = 7000000;
            sim_run(6, 2);
            GAP_BLIND = 0;
            if (!blind) { expect_share(p, shares[k], 2, "training loop, 10 us launch gap"); continue; }
            double m, lo, hi;
            win_stats(p, &m, &lo, &hi);
            printf("  training loop, 10 us launch gap, without the gap correction: set %.0f -> %.2f\n", shares[k], m);
            CHECK(m < shares[k] - 3, "without the gap correction the slice is held under its share (%.2f for %.0f)", m, shares[k]);
        }
    LAUNCH_GAP = save_gap; WAKE_LAT = save_wake;
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
        if ((gs_ds_slice(&DS, i)->flags & GS_DS_SLICE_IN_USE) && !strcmp(gs_ds_slice(&DS, i)->grant, "soft"))
            gs_ds_slice(&DS, i)->credit_ns = -GS_CTL_DEBT_MAX_NS;
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
    test_pessimistic_events();
    test_switch_cost();
    test_launch_bound();
    test_launch_bound_charge();
    test_training_gap();
    test_overlap();
    test_launch_gap();
    test_soft_alone_keeps_no_debt();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (DIR_[0] && system(cmd) != 0) printf("note: could not remove %s\n", DIR_);
    printf("test_controller: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
