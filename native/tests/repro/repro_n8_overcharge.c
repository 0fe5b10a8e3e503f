/* Issue 12, N = 8 over-charge: a plant probe of one candidate mechanism. It does NOT reproduce the N = 8
 * over-charge (see bench/results/2026-11-28-cpu-packing-n8-overcharge-analysis.md); kept out of
 * tests/test_*.c so `make test` does not run it.
 *
 * On the H100 eight ResNet-50 inference loops at 12 % hard were charged ~2.0 ms of device time per
 * request (1.39x the eager ruler's 1.44 ms) and held to 0.77x plain. The mechanism tried here
 * (MARKER_PREEMPT in plant.h): an event recorded into an idle context while a neighbour runs brings that
 * context in, so a pair's start event runs while the launch call is still in flight; the context drains,
 * the GPU goes back to the neighbour, and the kernel waits for it after the launch call returned (the
 * gap correction does not take that wait off). Result (2026-11-28, this VM): at N = 8 the charge stays
 * within 0.1 point of use for launch gaps of 5-20 us (only 27-33 % of pairs start on an empty queue: the
 * neighbours' queues are rarely empty); at N = 2 with a 20-us gap +1.7..+2.1 points; with a 10-us gap the
 * engine UNDER-charges (the start event ran late, the gap taken off is more than the pair held). The
 * plant's 5-us step also quantizes any inflation to >= 5 us, above the cost band for kernels < 24 us, so
 * the continuous 0.5-3 us inflation a GPU pair can hold is never admitted here.
 *
 * Build and run (from native/, no sanitizers, < 1 s):
 *   cc -O2 -std=c11 -Iinclude -Itests tests/repro/repro_n8_overcharge.c src/pacing/[a-z]*.c \
 *      src/base/[a-z]*.c src/config/[a-z]*.c -o /tmp/repro_n8 -ldl -lm -pthread && /tmp/repro_n8
 * REPRO_GAP_US (launch gap, default 10) and REPRO_THINK_US (default 1500) vary the plant. Exit 1 = a check
 * failed (the charge off by more than 2 points, or hard below 0.9x plain). */
#include "plant.h"

struct lbk { const char *name; int kper; int64_t kmin, kmax, cpu, think; };
static const struct lbk H100_RESNET = {"h100-resnet", 160, 3000, 17000, 30000, 1500000};

static double run(int n, int raw, double *used, double *charged, uint64_t *meas, uint64_t *gap, uint64_t *clean)
{
    static const char *names[] = {"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"};
    sim_reset();
    for (int i = 0; i < n; i++) {
        struct sproc *p = add(names[i], 100 / n, GS_CTL_HARD, 1, 1, W_LB, H100_RESNET.kmin, H100_RESNET.kmax);
        p->kper = H100_RESNET.kper; p->launch_cpu = H100_RESNET.cpu; p->think = getenv("REPRO_THINK_US") ? atoll(getenv("REPRO_THINK_US")) * 1000 : H100_RESNET.think; p->raw = raw;
        p->delay = i * 700000;
        p->rng = 777u + (unsigned)i * 31u;
    }
    setenv("GS_KEEP", "1", 1);
    sim_run(4, 1);
    double agg = 0;
    *used = *charged = 0; *meas = *gap = *clean = 0;
    for (int i = 0; i < n; i++) {
        agg += P[i].iters / 3.0;
        *used += P[i].busy_true / 4.0 / 1e7 / n;   /* mean % of the device over the run */
        *charged += P[i].charged / 4.0 / 1e7 / n;
        if (!raw) { *meas += P[i].eng.measured; *gap += P[i].eng.sampled_gap; *clean += P[i].eng.sampled_clean; gs_engine_fini(&P[i].eng); }
    }
    unsetenv("GS_KEEP");
    return agg;
}

static int64_t GAP_ENV(void) { const char *g = getenv("REPRO_GAP_US"); return g ? atoll(g) * 1000 : 2 * DT; }
static void scenario(const char *what, int marker_preempt, int n)
{
    ARRIVAL_PREEMPT = 1; PREEMPT_LAT = DT; TIMESLICE = 2000000; CTX_SWITCH = 5000; CTX_SWITCH_IDLE = 5000;
    LAUNCH_GAP = GAP_ENV(); WAKE_LAT = 20000; POLL_WAKE_LAT = 10000; CPU_JITTER = 0.3;
    MARKER_PREEMPT = marker_preempt;
    double u, c; uint64_t m, g, cl;
    double plain = run(n, 1, &u, &c, &m, &g, &cl);
    double hard = run(n, 0, &u, &c, &m, &g, &cl);
    printf("  %-34s N=%d: hard %.1f it/s = %.2fx plain %.1f; per slice used %.2f %% charged %.2f %% (%.2fx, %+.2f points); "
           "pairs %llu, %.0f %% started on an empty queue, %.1f %% clean\n", what, n, hard, hard / plain, plain, u, c, c / u,
           c - u, (unsigned long long)m, m ? 100.0 * g / m : 0, m ? 100.0 * cl / m : 0);
    CHECK(fabs(c - u) <= 2, "%s N=%d: a hard slice charged %+.2f points off what it used (%.2f for %.2f)", what, n, c - u, c, u);
    CHECK(hard >= 0.9 * plain, "%s N=%d: equal hard %.1f < 0.9 x plain %.1f", what, n, hard, plain);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("issue 12 N=8 over-charge, h100-like plant (arrival preemption, 5-us switches, 10-us launch gap, 30 %% jitter)\n");
    scenario("markers wait for their turn", 0, 8);
    scenario("markers bring their context in", 1, 8);
    scenario("markers bring their context in", 1, 2);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (DIR_[0] && system(cmd) != 0) printf("note: could not remove %s\n", DIR_);
    printf("repro_n8_overcharge: %d checks, %d failures%s\n", checks, failures,
           failures ? " (see the header: a probe, not the N = 8 over-charge)" : "");
    return failures ? 1 : 0;
}
