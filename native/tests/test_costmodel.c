/* The per-kernel cost model (src/pacing/costmodel.c): what a launch of one kernel shape is charged
 * when its event pairs may hold a neighbour's time slice. Each check names the behaviour it pins. */
#include <stdio.h>
#include <stdlib.h>
#include "gpuslice/costmodel.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static int64_t mean_of(struct gs_costmodel *m, uint64_t key)
{
    struct gs_cost_entry *en = gs_cost_find(m, key);
    return en ? en->mean_ns : -1;
}

static void test_keys(void)
{
    static const int fn = 0;
    uint64_t a = gs_cost_key(&fn, 128, 1, 1, 256, 1, 1, 0), b = gs_cost_key(&fn, 256, 1, 1, 256, 1, 1, 0);
    CHECK(a != b, "another grid is another shape");
    CHECK(a == gs_cost_key(&fn, 128, 1, 1, 256, 1, 1, 0), "the same launch is the same shape");
    CHECK(a != gs_cost_key(&fn, 128, 1, 1, 256, 1, 1, 1024), "shared memory is part of the shape");
    CHECK(a != gs_cost_key(&a, 128, 1, 1, 256, 1, 1, 0), "another function is another shape");
    int zero = 1;
    for (uint32_t g = 0; g < 100000; g++) zero &= gs_cost_key(NULL, g, 0, 0, 0, 0, 0, 0) != 0;
    CHECK(zero, "a key is never 0 (0 = unknown)");
}

static void test_inflated_pairs_ignored(void)
{
    struct gs_costmodel m;
    CHECK(gs_cost_init(&m) == 0, "table");
    uint64_t k = 77;
    for (int i = 0; i < 20; i++) gs_cost_sample(&m, k, 20000 + (i % 3) * 200, 0, 0);
    int64_t before = mean_of(&m, k);
    CHECK(before > 19500 && before < 20700, "20 us kernels learned as ~20 us (%lld)", (long long)before);
    /* a neighbour's 2 ms time slice inside 1 pair in 4 (dirty pairs): the mean stays the kernel's */
    for (int i = 0; i < 400; i++) gs_cost_sample(&m, k, i % 4 == 0 ? 2020000 : 20100, 0, 0);
    int64_t after = mean_of(&m, k);
    CHECK(after > 19500 && after < 20700, "inflated pairs do not move the mean (%lld)", (long long)after);
    /* a clean pair is taken as it is, even far above the mean */
    int64_t got = gs_cost_sample(&m, k, 60000, 0, 1);
    CHECK(got > after + 4000, "a clean pair moves the mean (%lld -> %lld)", (long long)after, (long long)got);
    gs_cost_free(&m);
}

static void test_cost_changes(void)
{
    struct gs_costmodel m;
    CHECK(gs_cost_init(&m) == 0, "table");
    uint64_t k = 5;
    for (int i = 0; i < 20; i++) gs_cost_sample(&m, k, 10000, 0, 0);
    /* the same grid now does 5x the work (a longer input behind a grid-stride loop): once the old
     * samples have left the floor's window (16 samples) the model follows the new ones, from the
     * smallest of them */
    for (int i = 0; i < 7; i++) gs_cost_sample(&m, k, 51000, 0, 0);
    CHECK(mean_of(&m, k) < 20000, "7 samples 5x above the mean are taken as inflated (%lld)", (long long)mean_of(&m, k));
    for (int i = 7; i < 16; i++) gs_cost_sample(&m, k, 50000 + (i == 7 ? 0 : 1000), 0, 0);
    CHECK(mean_of(&m, k) >= 50000 && mean_of(&m, k) <= 51000, "a changed cost is learned after 16 samples (%lld)",
          (long long)mean_of(&m, k));
    /* cheaper than the mean is never inflation: taken at once */
    int64_t low = gs_cost_sample(&m, k, 40000, 0, 0);
    CHECK(low < 50000, "a smaller sample lowers the mean (%lld)", (long long)low);
    /* learning: a first sample that held a neighbour's slice is dropped by the next small one */
    uint64_t j = 9;
    gs_cost_sample(&m, j, 3000000, 0, 0);
    gs_cost_sample(&m, j, 12000, 0, 0);
    CHECK(mean_of(&m, j) == 12000, "while learning, a far smaller sample restarts the mean (%lld)", (long long)mean_of(&m, j));
    gs_cost_free(&m);
}

/* Issue 12: with 8 launch-bound contexts interleaving, most dirty pairs hold a neighbour's kernel or
 * a context switch: a few us on a 10-us kernel, not a time slice. The old rule (reject above 1.5 x the
 * mean and mean + 4 x deviation + 10 us) let those in and learned ~1.4x the kernel; the floor's band
 * (1/8 + 2 us over the smallest recent pair) keeps them out. */
static void test_interleaved_pairs_ignored(void)
{
    struct gs_costmodel m;
    CHECK(gs_cost_init(&m) == 0, "table");
    uint64_t k = 21;
    /* 2 pairs in 3 hold a neighbour's 6-12 us kernel; the kernel alone is 10 us */
    for (int i = 0; i < 300; i++) gs_cost_sample(&m, k, i % 3 == 0 ? 10000 + (i % 7) * 50 : 16000 + (i % 5) * 1500, 0, 0);
    int64_t got = mean_of(&m, k);
    CHECK(got >= 10000 && got <= 10500, "moderately inflated dirty pairs are not learned (%lld)", (long long)got);
    /* a pair started on an empty queue holds the launch call (gap): its kernel is the pair less it */
    int64_t charged = gs_cost_sample(&m, k, 14200, 4000, 1);
    CHECK(charged == 10200, "a clean pair is charged less its launch gap (%lld)", (long long)charged);
    /* a kernel whose own time varies by +-10 % is learned at its mean, not at its fastest */
    uint64_t j = 22;
    for (int i = 0; i < 300; i++) gs_cost_sample(&m, j, 20000 + ((i * 37) % 21 - 10) * 200, 0, 0);
    got = mean_of(&m, j);
    CHECK(got >= 19500 && got <= 20500, "natural spread within the band is averaged (%lld)", (long long)got);
    gs_cost_free(&m);
}

static void test_sampling_schedule(void)
{
    struct gs_costmodel m;
    CHECK(gs_cost_init(&m) == 0, "table");
    uint64_t k = 11;
    CHECK(gs_cost_find(&m, k) == NULL, "an unknown shape is not in the table");
    gs_cost_sample(&m, k, 1000, 0, 0);
    struct gs_cost_entry *en = gs_cost_find(&m, k);
    int measured = 0;
    for (int i = 0; i < 10; i++) measured += gs_cost_should_sample(en);
    CHECK(measured == 10, "a shape with fewer than LEARN samples is measured on every launch (%d)", measured);
    for (unsigned i = 1; i < GS_COST_LEARN; i++) gs_cost_sample(&m, k, 1000, 0, 0);
    measured = 0;
    int phases[GS_COST_SAMPLE_EVERY] = {0}, hit = 0;
    for (int i = 0; i < 1600; i++) {
        int s = gs_cost_should_sample(en);
        measured += s;
        if (s && phases[i % GS_COST_SAMPLE_EVERY]++ == 0) hit++;
    }
#ifdef GS_COST_SAMPLE_PHASED
    CHECK(measured == 100, "then 1 launch in %u (%d of 1600)", GS_COST_SAMPLE_EVERY, measured);
#else
    /* binomial(1600, 1/16): mean 100, sd 9.7; 50..150 is over 5 sd */
    CHECK(measured >= 50 && measured <= 150, "then 1 launch in %u on average (%d of 1600)", GS_COST_SAMPLE_EVERY,
          measured);
    /* a shape launched 16 (or 4, or 8) times a step is measured at every place in the step, not at one:
     * the per-shape count hit 1 place of 16 forever (issue 12's under-delivered training share) */
    CHECK(hit >= (int)GS_COST_SAMPLE_EVERY / 2, "the measured launches fall at many places of a 16-launch period (%d)",
          hit);
#endif
    /* a full table keeps what it has and learns no new shapes */
    int inserted = 0;
    for (uint64_t x = 1000; x < 1000 + GS_COST_SLOTS; x++) {
        gs_cost_sample(&m, x, 5000, 0, 1);
        inserted += gs_cost_find(&m, x) != NULL;
    }
    CHECK(inserted < GS_COST_SLOTS && inserted >= GS_COST_SLOTS / 2, "the table stops at 3/4 full (%d)", inserted);
    CHECK(mean_of(&m, k) == 1000, "what it knew stays");
    gs_cost_free(&m);
    struct gs_costmodel none = {NULL, 0};
    CHECK(gs_cost_find(&none, k) == NULL && gs_cost_sample(&none, k, 7, 0, 0) == 7, "no table: nothing known, samples pass through");
}

/* A kernel's first launch holds what the driver does once for it (lazy loading: ms inside the pair, the GPU
 * idle); a clean pair is charged as measured, but the shape's cost is learned from the later launches. */
static void test_first_launch_not_learned(void)
{
    struct gs_costmodel m;
    CHECK(gs_cost_init(&m) == 0, "table");
    uint64_t k = 33;
    CHECK(gs_cost_sample(&m, k, 5000000, 0, 1) == 5000000, "the first launch is charged what it measured");
    gs_cost_sample(&m, k, 50000, 0, 1);
    int64_t got = mean_of(&m, k);
#ifdef GS_COST_KEEP_FIRST
    CHECK(got > 1000000, "the old rule averages the first launch in (%lld)", (long long)got);
#else
    CHECK(got == 50000, "the smaller of the first two clean pairs is the shape's cost (%lld)", (long long)got);
    gs_cost_sample(&m, k, 56000, 0, 1);
    got = mean_of(&m, k);
    CHECK(got == 53000, "the third is averaged with it, 1/2 each (%lld)", (long long)got);
    gs_cost_sample(&m, k, 50000, 0, 1);
    got = mean_of(&m, k);
    CHECK(got == 52000, "then a running mean of the three (%lld)", (long long)got);
    /* whichever of the first two carried the load: another thread's launch may have been measured first */
    uint64_t j = 34;
    gs_cost_sample(&m, j, 50000, 0, 1);
    gs_cost_sample(&m, j, 5000000, 0, 1);
    got = mean_of(&m, j);
    CHECK(got == 50000, "an inflated second pair does not replace a smaller first (%lld)", (long long)got);
#endif
    gs_cost_free(&m);
}

int main(void)
{
    test_keys();
    test_inflated_pairs_ignored();
    test_cost_changes();
    test_interleaved_pairs_ignored();
    test_sampling_schedule();
    test_first_launch_not_learned();
    printf("test_costmodel: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
