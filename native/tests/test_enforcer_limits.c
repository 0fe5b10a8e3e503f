/* Whose limit is it: the region holds the slice's limit (slice file / HAMi env), a process's
 * GPUSLICE_MEMORY_LIMIT only lowers its own view, a shrunk slice file lowers the region, a larger one
 * does not raise it; a slice file listing MIG-... UUIDs matches CUDA's devices; the enforcer's own
 * failures (region lock lost) follow fail_open and say why; HAMi's ACTIVE_OOM_KILLER. Also run with
 * the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <pthread.h>

static unsigned long long region_limit(int rec)
{
    struct gs_region *r = t_map_region();
    if (!r) return 0;
    unsigned long long l = r->devices[rec].limit;
    munmap(r, sizeof *r);
    return l;
}

/* Run fn in a child process of the slice; its exit status (0 = its checks passed). */
static int in_child(void (*fn)(void))
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        t_failures = 0;
        fn();
        _exit(t_failures ? 1 : 0);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void child_env_256m(void)
{
    setenv("GPUSLICE_MEMORY_LIMIT", "256m", 1);
    up(0);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 256 * MiB); /* this process sees (and is held to) 256 MiB */
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 150 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc_v2(&p, 100 * MiB), CUDA_ERROR_OUT_OF_MEMORY); /* 64 + 150 + 100 > 256 */
    CHECK_EQ(region_limit(0), 1024 * MiB); /* ...but the slice's limit in the region is untouched */
}

/* The first process to touch the device has an env-lowered limit; the slice keeps its own. */
static void s_env_limit_is_per_process(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    CHECK_EQ(in_child(child_env_256m), 0);
    up(0); /* no env: the slice file's 1 GiB */
    CHECK_EQ(region_limit(0), 1024 * MiB);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB - CTX), CUDA_SUCCESS); /* the child exited: all of it */
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);
}

static int g_hold[2], g_go[2];
static void child_holds_then_allocates(void)
{
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 300 * MiB), CUDA_SUCCESS);
    if (write(g_hold[1], "x", 1) != 1) _exit(3);
    char ch;
    if (read(g_go[0], &ch, 1) != 1) _exit(3);
    /* the slice was shrunk to 512 MiB while we ran: we follow at our next allocation */
    CHECK_EQ(cuMemAlloc_v2(&p, 100 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 512 * MiB);
}

/* A shrunk slice file lowers the region's limit for every process of the slice. */
static void s_shrunk_slice_lowers_region(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    if (pipe(g_hold) || pipe(g_go)) exit(2);
    fflush(NULL);
    pid_t old = fork();
    if (old == 0) {
        t_failures = 0;
        child_holds_then_allocates();
        _exit(t_failures ? 1 : 0);
    }
    char ch;
    CHECK_EQ(read(g_hold[0], &ch, 1), 1);
    CHECK_EQ(region_limit(0), 1024 * MiB);
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX); /* the node shrinks the slice */
    up(0);
    CHECK_EQ(region_limit(0), 512 * MiB);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - 2 * CTX - 300 * MiB), CUDA_SUCCESS); /* exactly full */
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);
    if (write(g_go[1], "x", 1) != 1) exit(2);
    int st;
    waitpid(old, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the older process follows the shrink (status 0x%x)", st);
}

static void child_touch(void) { up(0); }

/* A larger limit in a slice file does not raise an existing region (a grown slice gets a fresh one),
 * so a process started from an older, larger file can never undo a shrink. */
static void s_region_never_raised(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX);
    CHECK_EQ(in_child(child_touch), 0);
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CHECK_EQ(region_limit(0), 512 * MiB);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - CTX + 1), CUDA_ERROR_OUT_OF_MEMORY);
}

/* The region is writable by the slice's processes (in Kubernetes: by the container; the slice file
 * is mounted read-only). A program that raises the limit there and zeroes every usage counter still
 * cannot pass the slice file's limit, and its queries keep showing the slice file's size. */
static void s_rewritten_region_cannot_raise(void)
{
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - CTX), CUDA_SUCCESS);
    struct gs_region *r = t_map_region();
    CHECK(r != NULL, "region mapped");
    if (!r) return;
    r->devices[0].limit = 64ull << 30;
    r->devices[0].used = 0;
    for (int i = 0; i < GS_REGION_MAX_PROCS; i++) r->procs[i].used[0] = 0;
    munmap(r, sizeof *r);
    CHECK_EQ(cuMemAlloc_v2(&p, 64 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 512 * MiB);
    CHECK_EQ(cuMemFree_v2(p), CUDA_SUCCESS); /* frees still give back: the same piece fits again... */
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - CTX), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY); /* ...and not a byte more */
}

/* A slice file that names its device as a MIG instance (MIG-<uuid>): CUDA reports the instance's
 * UUID bytes, which we print GPU-<uuid>; they are the same device. NVML names it MIG-... too. */
static void s_mig_uuid_matches(void)
{
    char u0[64], path[320];
    t_uuid(0, u0);
    memcpy(u0, "MIG-", 4);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "version=1\ndevices=%s\nmemory_limit=1g\nregion=%s\ncontext_overhead=%llu\n", u0, t_region, CTX);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    setenv("GSDOUBLE_MIG", "1", 1);
    up(0);
    int n;
    CHECK_EQ(fill(cuMemAlloc_v2, 64 * MiB, NULL, &n), 1024 * MiB - CTX);
    struct gs_region *r = t_map_region();
    CHECK(r && !strcmp(r->devices[0].uuid, u0), "the region names the device as the slice does (%s)", r ? r->devices[0].uuid : "");
    if (r) munmap(r, sizeof *r);
    nvmlDevice_t d;
    nvmlMemory_t m;
    CHECK_EQ(nvmlInit_v2(), 0);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &d), 0);
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d, &m), 0);
    CHECK_EQ(m.total, 1024 * MiB);
    CHECK_EQ(m.used, 1024 * MiB);
}

/* Make the region's robust mutex unrecoverable: a holder dies, the next owner unlocks without
 * marking it consistent. Every later lock fails with ENOTRECOVERABLE. */
static void break_region_lock(void)
{
    CHECK_EQ(in_child(child_touch), 0); /* creates the region */
    struct gs_region *r = t_map_region();
    if (!r) exit(2);
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        pthread_mutex_lock(&r->lock.mutex);
        _exit(0);
    }
    waitpid(p, NULL, 0);
    CHECK_EQ(pthread_mutex_lock(&r->lock.mutex), EOWNERDEAD);
    pthread_mutex_unlock(&r->lock.mutex);
    munmap(r, sizeof *r);
}

/* stderr of the calls in fn, as text (the enforcer logs one line per event). */
static void capture_stderr(void (*fn)(void), char *out, size_t len)
{
    char path[320];
    snprintf(path, sizeof path, "%s/stderr.txt", t_dir);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, out, len - 1, 0);
    out[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
}

static CUresult g_r1, g_r2;
static void two_allocations(void)
{
    CUcontext c = NULL;
    cuInit(0);
    g_r1 = cuDevicePrimaryCtxRetain(&c, 0);
    if (g_r1 == CUDA_SUCCESS) cuCtxSetCurrent(c);
    CUdeviceptr p;
    g_r2 = cuMemAlloc_v2(&p, 2048 * MiB);
}

/* The region lock fails (our own failure): with fail_open=1 calls pass through unlimited -- the
 * device is not mistaken for one outside the slice -- and the log says what failed. */
static void s_lock_failure_fail_open(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\nfail_open=1\n", CTX);
    break_region_lock();
    setenv("GPUSLICE_LOG_LEVEL", "warn", 1);
    char log[4096];
    capture_stderr(two_allocations, log, sizeof log);
    CHECK_EQ(g_r1, CUDA_SUCCESS);
    CHECK_EQ(g_r2, CUDA_SUCCESS);
    CHECK(strstr(log, "lock failed") != NULL, "log names the lock failure: %s", log);
    CHECK(strstr(log, "fail_open=1") != NULL, "log says fail_open lets it through: %s", log);
    CHECK(strstr(log, "no room") == NULL && strstr(log, "not part of this slice") == NULL,
          "no wrong reason in the log: %s", log);
}

/* ... and with fail_open=0 they are refused, for the same, stated reason. */
static void s_lock_failure_fail_closed(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    break_region_lock();
    setenv("GPUSLICE_LOG_LEVEL", "warn", 1);
    char log[4096];
    capture_stderr(two_allocations, log, sizeof log);
    CHECK_EQ(g_r1, CUDA_ERROR_OUT_OF_MEMORY); /* the context cannot be accounted: refused */
    CHECK(g_r2 != CUDA_SUCCESS, "no allocation without accounting (%d)", g_r2);
    CHECK(strstr(log, "lock failed") != NULL && strstr(log, "refusing") != NULL, "log: %s", log);
    CHECK(strstr(log, "no room") == NULL, "no wrong reason in the log: %s", log);
}

static void hami_env(const char *killer)
{
    unsetenv("GPUSLICE_SLICE");
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "2g", 1); /* the built-in context overhead (680 MiB) fits */
    setenv("CUDA_DEVICE_SM_LIMIT", "30", 1);
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", t_region, 1);
    setenv("ACTIVE_OOM_KILLER", killer, 1);
}

static void child_overallocates(void)
{
    up(0);
    CUdeviceptr p;
    cuMemAlloc_v2(&p, 2048 * MiB);
}

/* HAMi's ACTIVE_OOM_KILLER=true: a refused allocation kills the process. */
static void s_active_oom_killer(void)
{
    hami_env("true");
    int st = in_child(child_overallocates);
    CHECK_EQ(st, 128 + SIGKILL);
    hami_env("1");
    CHECK_EQ(in_child(child_overallocates), 128 + SIGKILL);
    hami_env("false");
    CHECK_EQ(in_child(child_overallocates), 0);
}

static void bad_killer(void)
{
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 2048 * MiB), CUDA_ERROR_OUT_OF_MEMORY); /* refused, not killed */
}

/* A value HAMi does not know is not ignored silently: one line names the variable and the values. */
static void s_active_oom_killer_bad_value(void)
{
    hami_env("yes");
    setenv("GPUSLICE_LOG_LEVEL", "warn", 1);
    char log[4096];
    capture_stderr(bad_killer, log, sizeof log);
    CHECK(strstr(log, "ACTIVE_OOM_KILLER='yes'") && strstr(log, "1, true, 0, false"), "log: %s", log);
}

/* The legacy 32-bit entry points libcuda still exports under the plain names (reached only by
 * programs that look the names up themselves: dlsym, ctypes, an old cuGetProcAddress version) meet
 * the same limit and show the same slice as the _v2 ones. */
CUresult cuMemAlloc(CUdeviceptr_v1 *, unsigned int);
CUresult cuMemAllocPitch(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
CUresult cuMemFree(CUdeviceptr_v1);
CUresult cuMemGetInfo(unsigned int *, unsigned int *);
CUresult cuDeviceTotalMem(unsigned int *, CUdevice);
static void s_legacy_entry_points(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    unsigned int f = 0, t = 0, total = 0;
    CHECK_EQ(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB);
    CHECK_EQ(f, 1024 * MiB - CTX);
    CHECK_EQ(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
    CHECK_EQ(total, 1024 * MiB);
    CUdeviceptr_v1 a = 0, b = 0, c = 0;
    CHECK_EQ(cuMemAlloc(&a, (unsigned)(512 * MiB)), CUDA_SUCCESS);
    unsigned int pitch = 0;
    /* 1024-byte rows (pitch 1024 in the double) x 512 Ki rows = 512 MiB: over what is left (448 MiB) */
    CHECK_EQ(cuMemAllocPitch(&b, &pitch, 1024, 512 * 1024, 4), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(cuMemAllocPitch(&b, &pitch, 1024, 448 * 1024, 4), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc(&c, 1), CUDA_ERROR_OUT_OF_MEMORY); /* exactly full: not one byte more */
    CHECK_EQ(cuMemFree(b), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(f, 448 * MiB); /* the pitched allocation came back whole */
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_env_limit_is_per_process);
    SCENARIO(s_shrunk_slice_lowers_region);
    SCENARIO(s_region_never_raised);
    SCENARIO(s_rewritten_region_cannot_raise);
    SCENARIO(s_mig_uuid_matches);
    SCENARIO(s_lock_failure_fail_open);
    SCENARIO(s_lock_failure_fail_closed);
    SCENARIO(s_active_oom_killer);
    SCENARIO(s_active_oom_killer_bad_value);
    SCENARIO(s_legacy_entry_points);
    fprintf(stderr, "test_enforcer_limits%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
