/* The per-context cost measured on the card: with no context_overhead= in the slice, the first context
 * of the slice on a device is measured by NVML's free memory before/after (the double's contexts take
 * GSDOUBLE_CTX_BYTES each), published in the region for the slice's other processes, and every context
 * is charged it and gives exactly that back; an explicit context_overhead= wins; an implausible
 * measurement (0 here) keeps the built-in default, and so does one during which another process on the
 * device (NVML's process list) appeared or changed its memory. Also run with the enforcer LD_PRELOADed. */
#include "enforcer_api.h"

#define COST (300 * MiB)
#define DEFAULT_COST (680 * MiB)
#define MEASURED_BIT(idx) (1u << (1 + (idx)))

static struct gs_region region_copy(void)
{
    struct gs_region c;
    memset(&c, 0, sizeof c);
    struct gs_region *r = t_map_region();
    if (r) {
        memcpy(&c, r, sizeof c);
        munmap(r, sizeof *r);
    }
    return c;
}

static void s_first_context_is_measured_and_published(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1); /* 300 MiB */
    t_slice("memory_limit=2g\n");
    up(0);
    struct gs_region r = region_copy();
    CHECK_EQ(r.devices[0].context_overhead, COST);
    CHECK(r.flags & MEASURED_BIT(0), "the region says device 0's cost was measured (flags 0x%x)", r.flags);
    CHECK_EQ(r.devices[0].used, COST); /* charged the default first, settled to what was measured */
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(f, 2048 * MiB - COST);
    int n;
    CHECK_EQ(fill(cuMemAlloc_v2, 4 * MiB, NULL, &n), 2048 * MiB - COST);
}

static void child_first_context(void)
{
    up(0);
}

/* Another process of the slice does not measure again: its context is charged what was published. */
static void s_other_processes_use_the_published_cost(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    t_slice("memory_limit=2g\n");
    CHECK_EQ(t_fork(child_first_context), 0);
    struct gs_region *m = t_map_region();
    CHECK(m != NULL, "region");
    if (!m) return;
    m->devices[0].context_overhead = 100 * MiB; /* what this process finds is what it charges */
    munmap(m, sizeof *m);
    up(0);
    CHECK_EQ(region_copy().devices[0].used, 100 * MiB); /* the child exited: only ours */
    CHECK_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    CHECK_EQ(region_copy().devices[0].used, 0);
}

/* A created context is charged the measured cost and gives back exactly that, even if the region's value
 * changes meanwhile. */
static void s_created_context_gives_back_its_charge(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    t_slice("memory_limit=2g\n");
    up(0);
    CUcontext c;
    CHECK_EQ(cuCtxCreate_v2(&c, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(region_copy().devices[0].used, 2 * COST);
    struct gs_region *m = t_map_region();
    if (m) {
        m->devices[0].context_overhead = 1 * MiB;
        munmap(m, sizeof *m);
    }
    CHECK_EQ(cuCtxDestroy_v2(c), CUDA_SUCCESS);
    CHECK_EQ(region_copy().devices[0].used, COST);
}

static void s_configured_cost_wins(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    t_slice("memory_limit=2g\ncontext_overhead=64m\n");
    up(0);
    struct gs_region r = region_copy();
    CHECK_EQ(r.devices[0].context_overhead, 64 * MiB);
    CHECK(!(r.flags & MEASURED_BIT(0)), "not measured when the slice sets the cost");
    CHECK_EQ(r.devices[0].used, 64 * MiB);
}

static void s_implausible_measurement_keeps_the_default(void)
{
    unsetenv("GSDOUBLE_CTX_BYTES"); /* the double's contexts take nothing: 0 bytes measured */
    t_slice("memory_limit=2g\n");
    up(0);
    struct gs_region r = region_copy();
    CHECK_EQ(r.devices[0].context_overhead, DEFAULT_COST);
    CHECK(!(r.flags & MEASURED_BIT(0)), "an implausible measurement is not published");
    CHECK_EQ(r.devices[0].used, DEFAULT_COST);
}

/* Another slice's process allocated while our context was created (NVML lists it with more memory
 * after): the free-memory difference holds its allocation too, so nothing is published and the
 * default stays (on the H100, 8 slices starting together measured up to 7.5 GB for a 523-MiB context). */
static void s_a_neighbour_that_grew_meanwhile_spoils_the_measurement(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    setenv("GSDOUBLE_NVML_PIDS", "4242:1048576", 1);
    setenv("GSDOUBLE_NVML_PIDS_WITH_CTX", "4242:537919488", 1);
    t_slice("memory_limit=2g\n");
    up(0);
    struct gs_region r = region_copy();
    CHECK(!(r.flags & MEASURED_BIT(0)), "not measured while a neighbour grew (flags 0x%x)", r.flags);
    CHECK_EQ(r.devices[0].context_overhead, DEFAULT_COST);
    CHECK_EQ(r.devices[0].used, DEFAULT_COST);
}

/* Two processes appeared while our context was created (neither is our pid): which one is ours cannot
 * be told, so nothing is published. */
static void s_two_new_processes_spoil_the_measurement(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    setenv("GSDOUBLE_NVML_PIDS", "4242:1048576", 1);
    setenv("GSDOUBLE_NVML_PIDS_WITH_CTX", "4242:1048576,5001:314572800,5002:314572800", 1);
    t_slice("memory_limit=2g\n");
    up(0);
    CHECK(!(region_copy().flags & MEASURED_BIT(0)), "not measured when two processes appeared");
}

/* NVML lists this process (a host pid namespace) and nobody else changed: measured as before; likewise
 * one new process (ours, seen under a host pid a pid namespace hides) beside an unchanged neighbour. */
static void s_only_this_process_changed_is_measured(void)
{
    char after[128];
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    setenv("GSDOUBLE_NVML_PIDS", "4242:1048576", 1);
    snprintf(after, sizeof after, "4242:1048576,%d:314572800", (int)getpid());
    setenv("GSDOUBLE_NVML_PIDS_WITH_CTX", after, 1);
    t_slice("memory_limit=2g\n");
    up(0);
    struct gs_region r = region_copy();
    CHECK(r.flags & MEASURED_BIT(0), "measured (flags 0x%x)", r.flags);
    CHECK_EQ(r.devices[0].context_overhead, COST);
}

static void s_one_new_process_under_another_pid_is_ours(void)
{
    setenv("GSDOUBLE_CTX_BYTES", "314572800", 1);
    setenv("GSDOUBLE_NVML_PIDS", "4242:1048576", 1);
    setenv("GSDOUBLE_NVML_PIDS_WITH_CTX", "4242:1048576,987654:314572800", 1);
    t_slice("memory_limit=2g\n");
    up(0);
    CHECK_EQ(region_copy().devices[0].context_overhead, COST);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_first_context_is_measured_and_published);
    SCENARIO(s_other_processes_use_the_published_cost);
    SCENARIO(s_created_context_gives_back_its_charge);
    SCENARIO(s_configured_cost_wins);
    SCENARIO(s_implausible_measurement_keeps_the_default);
    SCENARIO(s_a_neighbour_that_grew_meanwhile_spoils_the_measurement);
    SCENARIO(s_two_new_processes_spoil_the_measurement);
    SCENARIO(s_only_this_process_changed_is_measured);
    SCENARIO(s_one_new_process_under_another_pid_is_ours);
    fprintf(stderr, "test_enforcer_ctxcost%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
