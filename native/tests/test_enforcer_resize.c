/* Live resize: the node rewrites a running slice's file (temporary file + rename, a higher
 * generation=) and the running processes follow within a second, without a restart: a raise lets
 * the next allocation through and shows in the memory queries and the region; a lower refuses the
 * next allocation of every process of the slice; a file of the same generation still only lowers;
 * an older or stale file never undoes a resize; a rewrite that changes devices is ignored. Also run
 * with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds until cuMemAlloc_v2(bytes) gives `want` (retrying, up to 1 s; > 1 = never). Succeeded
 * allocations are freed again so that the caller's books stay as they were. */
static double until_alloc(size_t bytes, CUresult want)
{
    double t0 = now_s();
    for (;;) {
        CUdeviceptr p;
        CUresult r = cuMemAlloc_v2(&p, bytes);
        if (r == CUDA_SUCCESS) cuMemFree_v2(p);
        if (r == want) return now_s() - t0;
        if (now_s() - t0 > 1.0) return 9.0;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static struct gs_region_device region_dev(int rec)
{
    struct gs_region_device d;
    memset(&d, 0, sizeof d);
    struct gs_region *r = t_map_region();
    if (r) {
        d = r->devices[rec];
        munmap(r, sizeof *r);
    }
    return d;
}

/* Raise: a full slice gets room within a second of the rewrite; queries and region show it. */
static void s_raise_reaches_running_process(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - CTX), CUDA_SUCCESS); /* exactly full */
    CHECK_EQ(cuMemAlloc_v2(&p, 256 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    t_slice("memory_limit=1g\ncontext_overhead=%llu\ngeneration=1\n", CTX);
    double took = until_alloc(256 * MiB, CUDA_SUCCESS);
    CHECK(took < 1.0, "the raise reached the running process within a second (took %.3f s)", took);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB);
    CHECK_EQ(f, 512 * MiB);
    struct gs_region_device d = region_dev(0);
    CHECK_EQ(d.limit, 1024 * MiB);
    CHECK_EQ(d.generation, 1);
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB), CUDA_SUCCESS); /* all of the new size... */
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY); /* ...and not a byte more */
}

static int g_ready[2], g_go[2], g_done[2];

/* A second process of the slice: holds 300 MiB, then (after the lower) is refused what still fit. */
static void child_follows_lower(void)
{
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 300 * MiB), CUDA_SUCCESS);
    if (write(g_ready[1], "x", 1) != 1) _exit(3);
    char ch;
    if (read(g_go[0], &ch, 1) != 1) _exit(3);
    CHECK(until_alloc(100 * MiB, CUDA_ERROR_OUT_OF_MEMORY) < 1.0, "the lower reached the other process");
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 768 * MiB);
    if (write(g_done[1], "x", 1) != 1) _exit(3);
    if (read(g_go[0], &ch, 1) != 1) _exit(3);
}

/* Lower: every running process of the slice is held to the new size within a second. */
static void s_lower_reaches_every_process(void)
{
    t_slice("memory_limit=2g\ncontext_overhead=%llu\n", CTX);
    if (pipe(g_ready) || pipe(g_go) || pipe(g_done)) exit(2);
    fflush(NULL);
    pid_t other = fork();
    if (other == 0) {
        t_failures = 0;
        child_follows_lower();
        _exit(t_failures ? 1 : 0);
    }
    char ch;
    CHECK_EQ(read(g_ready[0], &ch, 1), 1);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 200 * MiB), CUDA_SUCCESS);
    /* in use: 2 contexts + 300 + 200 MiB = 628 MiB; lowered to 768 MiB: 140 MiB left */
    t_slice("memory_limit=768m\ncontext_overhead=%llu\ngeneration=1\n", CTX);
    double took = until_alloc(200 * MiB, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(took < 1.0, "the lower reached this process within a second (took %.3f s)", took);
    CHECK_EQ(cuMemAlloc_v2(&p, 140 * MiB), CUDA_SUCCESS); /* exactly full under the new size */
    if (write(g_go[1], "x", 1) != 1) exit(2);
    CHECK_EQ(read(g_done[0], &ch, 1), 1);
    CHECK_EQ(region_dev(0).limit, 768 * MiB);
    if (write(g_go[1], "x", 1) != 1) exit(2);
    int st;
    waitpid(other, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other process followed the lower (status 0x%x)", st);
}

static void child_touch(void) { up(0); }

/* Without a newer generation a larger file still does not raise the region (a process started from
 * an older, larger file can never undo a shrink); after a resize, a file of an older generation is
 * ignored by a running process and cannot raise the region either. */
static void s_generation_orders_rewrites(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\ngeneration=2\n", CTX);
    CHECK_EQ(t_fork(child_touch), 0);
    CHECK_EQ(region_dev(0).generation, 2);
    t_slice("memory_limit=1g\ncontext_overhead=%llu\ngeneration=2\n", CTX); /* same generation: no raise */
    up(0);
    CHECK_EQ(region_dev(0).limit, 512 * MiB);
    CHECK(until_alloc(512 * MiB, CUDA_SUCCESS) > 1.0, "a same-generation file does not raise the slice");
    t_slice("memory_limit=2g\ncontext_overhead=%llu\ngeneration=1\n", CTX); /* older: ignored */
    CHECK(until_alloc(512 * MiB, CUDA_SUCCESS) > 1.0, "an older generation does not raise the slice");
    CHECK_EQ(region_dev(0).limit, 512 * MiB);
    t_slice("memory_limit=1g\ncontext_overhead=%llu\ngeneration=3\n", CTX);
    CHECK(until_alloc(512 * MiB, CUDA_SUCCESS) < 1.0, "generation 3 raises it");
    CHECK_EQ(region_dev(0).generation, 3);
}

/* A rewrite that names other devices is not a resize: ignored, the limits stay. */
static void s_device_change_ignored(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX);
    up(0);
    char u0[64], path[320], tmp[330];
    t_uuid(0, u0);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    snprintf(tmp, sizeof tmp, "%s/.slice.conf.new", t_dir);
    FILE *f = fopen(tmp, "w");
    fprintf(f, "version=1\ngrant=test\ndevices=%s\nregion=%s\nmemory_limit=4g\ncontext_overhead=%llu\ngeneration=1\n",
            u0, t_region, CTX);
    fclose(f);
    CHECK_EQ(rename(tmp, path), 0);
    CHECK(until_alloc(512 * MiB, CUDA_SUCCESS) > 1.0, "a device change is not taken over");
    CHECK_EQ(region_dev(0).limit, 512 * MiB);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_raise_reaches_running_process);
    SCENARIO(s_lower_reaches_every_process);
    SCENARIO(s_generation_orders_rewrites);
    SCENARIO(s_device_change_ignored);
    fprintf(stderr, "test_enforcer_resize%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
