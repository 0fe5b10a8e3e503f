/* What a timing-event pair adds to its kernel (src/pacing/pairbias.c) and how the engine takes it off
 * each pair (src/pacing/pairs.c), issue 12. Each check names the behaviour it pins. The measurement itself
 * needs a GPU (bench/gpu/event_overhead.py and the packing benchmark's pair_bias_ns show it there); over
 * the CPU double it must give up without touching anything. */
#include <stdio.h>
#include <string.h>
#include "gpuslice/pacer_core.h"
#include "gpuslice/pairbias.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static void test_bias_from_times(void)
{
    int64_t pairs[GS_PB_KERNELS];
    /* the H200's figures (bench/results/2026-11-28-h200-event-overhead.txt): a 1.49-us kernel back to back,
     * 3.68 us in a pair, and a quarter of the pairs disturbed (a neighbour's time slice in them) */
    for (int i = 0; i < GS_PB_KERNELS; i++) pairs[i] = i % 4 == 0 ? 400000 : 3680;
    int64_t b = gs_pair_bias_from(32 * 1490, pairs);
    CHECK(b == 3680 - 1490, "the bias is the undisturbed pairs' mean less the marginal time (%lld)", (long long)b);
    for (int i = 0; i < GS_PB_KERNELS; i++) pairs[i] = 1400;
    CHECK(gs_pair_bias_from(32 * 1490, pairs) == 0, "pairs faster than the kernels back to back: no bias, never negative");
    for (int i = 0; i < GS_PB_KERNELS; i++) pairs[i] = 1490 + GS_PB_MAX_NS + 1;
    CHECK(gs_pair_bias_from(32 * 1490, pairs) == -1, "a bias above GS_PB_MAX_NS is a disturbed measurement, not used");
}

static void test_no_measurement_over_the_double(void)
{
    char why[160] = "";
    int64_t b = gs_pair_bias_measure(why, sizeof why);
    CHECK(b == -1 && why[0], "without a real GPU the measurement gives up with a reason (%lld: %s)", (long long)b, why);
}

/* One completed pair through the engine's accounting: clean, no shape, with launch gap `gap`. */
static int64_t charge_gap(int64_t bias, int64_t ns, int64_t gap)
{
    static struct gs_engine e;
    memset(&e, 0, sizeof e);
    e.pair_bias_ns = bias;
    e.ring_gap_ns[0] = gap;
    struct gs_eng_others o = {1, 0, 0}; /* known: nobody else launched: clean */
    e.ring_launch_ns[0] = 10 * GS_CTL_CLEAN_GUARD_NS;
    return gs_eng_account_pair(&e, 0, ns, &o);
}

static int64_t charge_of(int64_t bias, int64_t ns) { return charge_gap(bias, ns, 0); }

static void test_engine_takes_the_bias_off(void)
{
    CHECK(charge_of(0, 10000) == 10000, "no bias measured: a pair is charged as measured");
    CHECK(charge_of(2200, 10000) == 7800, "the bias comes off each pair (%lld)", (long long)charge_of(2200, 10000));
    CHECK(charge_of(2200, 3000) == 1500, "at most half a pair comes off: a short pair keeps a cost (%lld)",
          (long long)charge_of(2200, 3000));
    /* a pair started on an empty queue: the launch gap comes off first, then the bias, at most half of what
     * the gap left (the review's case: 6 us with a 4-us gap was charged 0 when both came off in full) */
    CHECK(charge_gap(2200, 6000, 4000) == 1000, "a gap pair keeps half of what its gap left (%lld)",
          (long long)charge_gap(2200, 6000, 4000));
    CHECK(charge_gap(2200, 12000, 4000) == 5800, "a long gap pair loses its gap and the whole bias (%lld)",
          (long long)charge_gap(2200, 12000, 4000));
    CHECK(charge_gap(0, 6000, 4000) == 2000, "no bias: the gap alone comes off, as before (%lld)",
          (long long)charge_gap(0, 6000, 4000));
    CHECK(charge_gap(2200, 5000, 9000) == 0, "a gap longer than the pair leaves nothing, as before (%lld)",
          (long long)charge_gap(2200, 5000, 9000));
}

int main(void)
{
    test_bias_from_times();
    test_no_measurement_over_the_double();
    test_engine_takes_the_bias_off();
    printf("test_pairbias: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
