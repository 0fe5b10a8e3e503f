/* oom_policy=wait: an allocation the slice has room for but the device has not (the double's card of
 * GSDOUBLE_TOTAL bytes is full, as when limits add up past the card) waits -- counted as waiting in the
 * region -- and succeeds once memory is freed; it fails after oom_wait_ms when nothing frees; an
 * allocation past the slice's limit is refused at once whatever the policy; oom_policy=return fails at
 * once. Also run with the enforcer LD_PRELOADed. */
#include "enforcer_api.h"

#include <pthread.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t proc_spare(int field)
{
    struct gs_region *r = t_map_region();
    uint64_t v = 0;
    if (r) {
        for (int i = 0; i < GS_REGION_MAX_PROCS; i++)
            if (r->procs[i].pid == getpid()) v = r->procs[i].spare[field];
        munmap(r, sizeof *r);
    }
    return v;
}

static CUdeviceptr g_big;
static volatile uint64_t g_waiting_seen, g_bytes_seen;
static void *free_later(void *arg)
{
    (void)arg;
    for (int i = 0; i < 400 && !g_waiting_seen; i++) { /* the main thread's allocation is waiting */
        g_waiting_seen = proc_spare(0);
        g_bytes_seen = proc_spare(3);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cuMemFree_v2(g_big); /* a neighbour lets go */
    return NULL;
}

/* 1 GiB card, a 4 GiB slice (limits past the card): the card fills, the next allocation waits. */
static void s_waits_until_memory_is_freed(void)
{
    setenv("GSDOUBLE_TOTAL", "1073741824", 1);
    t_slice("memory_limit=4g\ncontext_overhead=%llu\noom_policy=wait\noom_wait_ms=20000\n", CTX);
    up(0);
    CHECK_EQ(cuMemAlloc_v2(&g_big, 768 * MiB), CUDA_SUCCESS);
    pthread_t t;
    pthread_create(&t, NULL, free_later, NULL);
    CUdeviceptr p;
    double t0 = now_s();
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB), CUDA_SUCCESS); /* waited for the free, then got it */
    double took = now_s() - t0;
    pthread_join(t, NULL);
    CHECK(g_waiting_seen == 1, "the region showed one allocation waiting (%llu)", (unsigned long long)g_waiting_seen);
    CHECK_EQ(g_bytes_seen, 512 * MiB);
    CHECK(took < 10.0, "it went on once memory was freed (%.3f s)", took);
    CHECK_EQ(proc_spare(0), 0);
    CHECK_EQ(proc_spare(1), 1);
    CHECK_EQ(proc_spare(2), 0);
}

static void s_times_out_when_nothing_frees(void)
{
    setenv("GSDOUBLE_TOTAL", "1073741824", 1);
    t_slice("memory_limit=4g\ncontext_overhead=%llu\noom_policy=wait\noom_wait_ms=300\n", CTX);
    up(0);
    CUdeviceptr a, p;
    CHECK_EQ(cuMemAlloc_v2(&a, 768 * MiB), CUDA_SUCCESS);
    double t0 = now_s();
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    double took = now_s() - t0;
    CHECK(took >= 0.29 && took < 5.0, "failed after the 300 ms wait (%.3f s)", took);
    CHECK_EQ(proc_spare(1), 1);
    CHECK_EQ(proc_spare(2), 1);
    CHECK_EQ(t_used(0), CTX + 768 * MiB); /* the waited-for bytes left the books */
}

/* Past the slice's own limit nothing waits: refused at once. */
static void s_over_the_limit_is_refused_at_once(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\noom_policy=wait\noom_wait_ms=20000\n", CTX);
    up(0);
    CUdeviceptr p;
    double t0 = now_s();
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(now_s() - t0 < 1.0, "refused at once");
    CHECK_EQ(proc_spare(1), 0);
}

static void s_return_policy_fails_at_once(void)
{
    setenv("GSDOUBLE_TOTAL", "1073741824", 1);
    t_slice("memory_limit=4g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr a, p;
    CHECK_EQ(cuMemAlloc_v2(&a, 768 * MiB), CUDA_SUCCESS);
    double t0 = now_s();
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(now_s() - t0 < 1.0, "failed at once");
    CHECK_EQ(proc_spare(1), 0);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_waits_until_memory_is_freed);
    SCENARIO(s_times_out_when_nothing_frees);
    SCENARIO(s_over_the_limit_is_refused_at_once);
    SCENARIO(s_return_policy_fails_at_once);
    fprintf(stderr, "test_enforcer_oomwait%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
