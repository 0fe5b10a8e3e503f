/* The enforcer end to end over the CPU driver double: every allocation path counted and refused past
 * the limit, frees give back, queries show the slice, cuGetProcAddress and dlsym hand out hooks,
 * config errors refuse GPU work, several threads and processes share one limit with no over-commit,
 * dead processes are reclaimed, a lock holder killed by SIGKILL is recovered from.
 * Built twice by the Makefile: with the enforcer linked in under ASan/UBSan, and as a plain program
 * with build/libgpuslice.so LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "testlib.h"

#include <dlfcn.h>
#include <pthread.h>

#include "enforcer_api.h"

/* ------------------------------------------------------------------ scenarios */
static void s_not_in_slice_passes_through(void)
{
    unsetenv("GPUSLICE_SLICE");
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 8ull << 30), CUDA_SUCCESS); /* no limit: only the card's 16 GiB */
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 16ull << 30);
    CHECK(access(t_region, F_OK) != 0, "no region file without a slice");
}

static void s_limit_exact(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CHECK_EQ(t_used(0), CTX); /* the primary context is counted */
    CUdeviceptr a, b, c;
    CHECK_EQ(cuMemAlloc_v2(&a, 512 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc_v2(&b, 448 * MiB), CUDA_SUCCESS); /* 64 + 512 + 448 = 1024 MiB: exactly full */
    CHECK_EQ(t_used(0), 1024 * MiB);
    CHECK_EQ(cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(gsdouble_used(0), 960 * MiB); /* the refused byte never reached the driver */
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB);
    CHECK_EQ(f, 0);
    size_t tot;
    CHECK_EQ(cuDeviceTotalMem_v2(&tot, 0), CUDA_SUCCESS);
    CHECK_EQ(tot, 1024 * MiB);
    CHECK_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), 576 * MiB);
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(f, 448 * MiB);
    CHECK_EQ(cuMemAlloc_v2(&b, 448 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree_v2(b), CUDA_ERROR_INVALID_VALUE); /* double free: the driver's error, no give-back */
    CHECK_EQ(t_used(0), CTX);
    struct gs_region *r = t_map_region();
    CHECK(r && r->devices[0].oom_refusals == 1, "one refusal recorded");
    CHECK(r && r->devices[0].peak == 1024 * MiB, "peak recorded");
    if (r) munmap(r, sizeof *r);
    CHECK_EQ(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), 0);
}

static CUresult alloc_managed(CUdeviceptr *p, size_t b) { return cuMemAllocManaged(p, b, 1); }
static CUresult alloc_async(CUdeviceptr *p, size_t b) { return cuMemAllocAsync(p, b, NULL); }
static CUresult alloc_async_ptsz(CUdeviceptr *p, size_t b) { return cuMemAllocAsync_ptsz(p, b, NULL); }
static CUmemoryPool g_pool;
static CUresult alloc_pool(CUdeviceptr *p, size_t b) { return cuMemAllocFromPoolAsync(p, b, g_pool, NULL); }
static CUresult alloc_pool_ptsz(CUdeviceptr *p, size_t b) { return cuMemAllocFromPoolAsync_ptsz(p, b, g_pool, NULL); }
static CUresult alloc_pitch(CUdeviceptr *p, size_t b)
{
    size_t pitch;
    CUresult r = cuMemAllocPitch_v2(p, &pitch, 1000, b / 1024, 4); /* rows padded 1000 -> 1024 */
    if (!r) CHECK_EQ(pitch, 1024);
    return r;
}
static CUresult alloc_vmm(CUdeviceptr *p, size_t b)
{
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    CUresult r = cuMemCreate(&h, b, &prop, 0);
    if (!r) *p = h;
    return r;
}
static CUresult alloc_array(CUdeviceptr *p, size_t b)
{
    CUDA_ARRAY_DESCRIPTOR d = {b / 4 / 1024, 1024, 0x20 /* float */, 1};
    CUarray a;
    CUresult r = cuArrayCreate_v2(&a, &d);
    if (!r) *p = (CUdeviceptr)(uintptr_t)a;
    return r;
}
static CUresult alloc_array3d(CUdeviceptr *p, size_t b)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {b / 2 / 4 / 256 / 4, 256, 4, 0x10 /* half */, 4, 0};
    CUarray a;
    CUresult r = cuArray3DCreate_v2(&a, &d);
    if (!r) *p = (CUdeviceptr)(uintptr_t)a;
    return r;
}
static CUresult free_plain(CUdeviceptr p) { return cuMemFree_v2(p); }
static CUresult free_async(CUdeviceptr p) { return cuMemFreeAsync(p, NULL); }
static CUresult free_async_ptsz(CUdeviceptr p) { return cuMemFreeAsync_ptsz(p, NULL); }
static CUresult free_vmm(CUdeviceptr p) { return cuMemRelease(p); }
static CUresult free_array(CUdeviceptr p) { return cuArrayDestroy((CUarray)(uintptr_t)p); }

static void s_every_path(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 256 * MiB, CTX);
    up(0);
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CHECK_EQ(cuMemPoolCreate(&g_pool, &pp), CUDA_SUCCESS);
    struct { const char *name; CUresult (*alloc)(CUdeviceptr *, size_t); CUresult (*free)(CUdeviceptr); } paths[] = {
        {"cuMemAlloc_v2", cuMemAlloc_v2, free_plain},
        {"cuMemAllocManaged", alloc_managed, free_plain},
        {"cuMemAllocPitch_v2", alloc_pitch, free_plain},
        {"cuMemAllocAsync", alloc_async, free_async},
        {"cuMemAllocAsync_ptsz", alloc_async_ptsz, free_async_ptsz},
        {"cuMemAllocFromPoolAsync", alloc_pool, free_async},
        {"cuMemAllocFromPoolAsync_ptsz", alloc_pool_ptsz, free_async_ptsz},
        {"cuMemCreate", alloc_vmm, free_vmm},
        {"cuArrayCreate_v2", alloc_array, free_array},
        {"cuArray3DCreate_v2", alloc_array3d, free_array},
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        CUdeviceptr keep[64];
        int n;
        unsigned long long got = fill(paths[i].alloc, 32 * MiB, keep, &n);
        CHECK(got == 256 * MiB, "%s: granted %llu bytes of a 256 MiB allowance", paths[i].name, got);
        CHECK(t_used(0) == CTX + 256 * MiB, "%s: region shows %llu", paths[i].name, t_used(0));
        CHECK(gsdouble_used(0) == 256 * MiB, "%s: driver holds %llu", paths[i].name, gsdouble_used(0));
        for (int k = 0; k < n; k++) CHECK_EQ(paths[i].free(keep[k]), CUDA_SUCCESS);
        CHECK(t_used(0) == CTX, "%s: after frees region shows %llu", paths[i].name, t_used(0));
    }
    /* mipmapped: 4 levels of 256x256 float = 256K + 64K + 16K + 4K bytes */
    CUDA_ARRAY3D_DESCRIPTOR d = {256, 256, 0, 0x20, 1, 0};
    CUmipmappedArray m;
    CHECK_EQ(cuMipmappedArrayCreate(&m, &d, 4), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + (256 + 64 + 16 + 4) * 1024 * 4 / 4);
    CHECK_EQ(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR big = {16384, 16384, 0, 0x20, 4, 0}; /* 4 GiB base level */
    CHECK_EQ(cuMipmappedArrayCreate(&m, &big, 2), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(t_used(0), CTX);
}

static void s_procaddr_and_dlsym(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 100 * MiB, CTX);
    up(0);
    /* cudart's protocol: look up cuGetProcAddress through cuGetProcAddress_v2, then everything else
     * through what came back. */
    void *gpa = NULL;
    CUdriverProcAddressQueryResult st = -1;
    CHECK_EQ(cuGetProcAddress_v2("cuGetProcAddress", &gpa, 12000, 0, &st), CUDA_SUCCESS);
    CHECK_EQ(st, 0);
    CHECK(gpa == (void *)cuGetProcAddress_v2, "self-lookup returns the hooked cuGetProcAddress_v2");
    __typeof__(&cuGetProcAddress_v2) g = (__typeof__(&cuGetProcAddress_v2))gpa;
    void *alloc = NULL, *fr = NULL, *aa = NULL, *launch = NULL, *sync = NULL;
    CHECK_EQ(g("cuMemAlloc", &alloc, 12000, 0, NULL), CUDA_SUCCESS);
    CHECK_EQ(g("cuMemFree", &fr, 12000, 0, NULL), CUDA_SUCCESS);
    CHECK_EQ(g("cuMemAllocAsync", &aa, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), CUDA_SUCCESS);
    CHECK_EQ(g("cuLaunchKernel", &launch, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL), CUDA_SUCCESS);
    CHECK_EQ(g("cuCtxSynchronize", &sync, 12000, 0, NULL), CUDA_SUCCESS);
    CHECK(alloc == (void *)cuMemAlloc_v2, "cuMemAlloc@12000 -> hooked cuMemAlloc_v2");
    CHECK(aa == (void *)cuMemAllocAsync_ptsz, "cuMemAllocAsync+PTDS -> hooked _ptsz");
    CHECK(launch == (void *)cuLaunchKernel_ptsz, "cuLaunchKernel+PTDS -> hooked _ptsz");
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL, "dlopen libcuda double");
    CHECK(sync == dlsym(h, "cuCtxSynchronize"), "unhooked functions are the driver's own");
    Dl_info info;
    CHECK(dladdr(sync, &info) && strstr(info.dli_fname, "libcuda.so.1"), "unhooked pointer lives in libcuda");
    /* Behaviour, not just addresses: what the look-ups returned enforces the limit. */
    CUdeviceptr p, q;
    CHECK_EQ(((CUresult(*)(CUdeviceptr *, size_t))alloc)(&p, 100 * MiB), CUDA_SUCCESS);
    CHECK_EQ(((CUresult(*)(CUdeviceptr *, size_t, CUstream))aa)(&q, 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(((CUresult(*)(CUdeviceptr))fr)(p), CUDA_SUCCESS);
    /* dlsym on a libcuda handle (CuPy, JAX, ctypes) */
    CUresult (*dalloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CHECK(dalloc == cuMemAlloc_v2, "dlsym(libcuda, cuMemAlloc_v2) is the hook");
    CHECK_EQ(dalloc(&p, 101 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(dlsym(h, "cuGetProcAddress_v2") == (void *)cuGetProcAddress_v2, "dlsym(libcuda, cuGetProcAddress_v2) is the hook");
    CHECK(dlsym(h, "no_such_symbol") == NULL && dlerror() != NULL, "missing symbols still fail with dlerror");
    /* RTLD_NEXT keeps its meaning relative to the caller (our trampoline preserves the return address) */
    void *(*next_malloc)(size_t) = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    CHECK(next_malloc != NULL, "dlsym(RTLD_NEXT, malloc) works through the wrapper");
    if (next_malloc) free(next_malloc(16)); /* same allocator as free(): must not crash ASan */
    void *lc = dlopen("libc.so.6", RTLD_NOW);
    CHECK(lc && dlsym(lc, "strlen") != NULL, "ordinary dlsym passes through");
    /* NVML through dlsym as well */
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    CHECK(hn && dlsym(hn, "nvmlDeviceGetMemoryInfo") == (void *)nvmlDeviceGetMemoryInfo, "dlsym(nvml) hooked");
    dlclose(h);
    if (hn) dlclose(hn);
    if (lc) dlclose(lc);
}

static void s_launches_pass_through(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\ncompute=0\n", CTX);
    up(0);
    unsigned long before = gsdouble_launches;
    CUlaunchConfig cfg = {1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
    CHECK_EQ(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel_ptsz(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernelEx(&cfg, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchCooperativeKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch_ptsz(NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(gsdouble_launches - before, 6);
}

static void s_multi_device(void)
{
    char u1[64];
    t_uuid(1, u1);
    t_slice("memory_limit=1g\nmemory_limit.%s=256m\ncontext_overhead=%llu\n", u1, CTX);
    up(0);
    CUcontext c1;
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    int n;
    unsigned long long got0 = fill(cuMemAlloc_v2, 64 * MiB, NULL, &n);
    CHECK_EQ(got0, 1024 * MiB - CTX);
    CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    unsigned long long got1 = fill(cuMemAlloc_v2, 64 * MiB, NULL, &n);
    CHECK_EQ(got1, 256 * MiB - CTX);
    CHECK_EQ(gsdouble_used(1), 192 * MiB);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 256 * MiB);
    CHECK_EQ(f, 0);
}

static void s_device_outside_slice(void)
{
    char u0[64], path[320];
    t_uuid(0, u0);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "version=1\ndevices=%s\nmemory_limit=1g\nregion=%s\ncontext_overhead=0\n", u0, t_region);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, MiB), CUDA_SUCCESS);
    CUcontext c1;
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(gsdouble_used(1), 0);
}

/* The races run every kind of allocation at once: linear, VMM, the default async pool and an explicit
 * pool (pool chunks of 2 MiB, so 10 MiB blocks fill pools exactly). */
static CUmemoryPool g_race_pool;
static CUresult race_alloc(int path, CUdeviceptr *p, size_t b)
{
    switch (path % 4) {
    case 0: return cuMemAlloc_v2(p, b);
    case 1: return alloc_vmm(p, b);
    case 2: return cuMemAllocAsync(p, b, NULL);
    default: return cuMemAllocFromPoolAsync(p, b, g_race_pool, NULL);
    }
}
static CUresult race_free(int path, CUdeviceptr p)
{
    return path % 4 == 0 ? cuMemFree_v2(p) : path % 4 == 1 ? cuMemRelease(p) : cuMemFreeAsync(p, NULL);
}
static void race_setup(void)
{
    setenv("GSDOUBLE_POOL_CHUNK", "2097152", 1);
    struct t_pool_props pp = t_pool_on(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CHECK_EQ(cuMemPoolCreate(&g_race_pool, &pp), CUDA_SUCCESS);
}

struct race { int threads; unsigned long long got[16], churned[16]; };
static struct race g_race;
static pthread_barrier_t g_race_barrier;
static void *race_thread(void *arg)
{
    int i = (int)(intptr_t)arg;
    CUcontext c;
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    CUdeviceptr p;
    /* Alloc/free churn, then fill: the limit must hold at every instant, not only at the end. */
    for (int k = 0; k < 200; k++)
        if (race_alloc(i, &p, 4 * MiB) == CUDA_SUCCESS && race_free(i, p) == CUDA_SUCCESS) g_race.churned[i]++;
    pthread_barrier_wait(&g_race_barrier);
    while (race_alloc(i, &p, 10 * MiB) == CUDA_SUCCESS) g_race.got[i] += 10 * MiB;
    return NULL;
}

static void s_threads_race(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 1005 * MiB, CTX);
    up(0);
    race_setup();
    pthread_t th[8];
    pthread_barrier_init(&g_race_barrier, NULL, 8);
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, race_thread, (void *)(intptr_t)i);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_race_barrier);
    unsigned long long sum = 0, by_path[4] = {0};
    for (int i = 0; i < 8; i++) {
        sum += g_race.got[i];
        by_path[i % 4] += g_race.churned[i];
    }
    CHECK_EQ(sum, 1000 * MiB); /* 100 chunks fit in 1005 MiB, the 101st never */
    CHECK_EQ(gsdouble_used(0), 1000 * MiB);
    CHECK_EQ(t_used(0), CTX + 1000 * MiB);
    for (int k = 0; k < 4; k++) CHECK(by_path[k] > 100, "path %d: only %llu alloc/free pairs in the churn", k, by_path[k]);
}

/* Several processes of one slice, each filling with another allocation path: together exactly the
 * limit, never more. */
static void s_processes_share_limit(void)
{
    enum { N = 4 };
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", N * CTX + 1000 * MiB + 5 * MiB, CTX);
    setenv("GSDOUBLE_POOL_CHUNK", "2097152", 1);
    int fds[N][2], go[2];
    pid_t pids[N];
    if (pipe(go)) exit(2);
    for (int i = 0; i < N; i++) {
        if (pipe(fds[i])) exit(2);
        fflush(NULL);
        if ((pids[i] = fork()) == 0) {
            char ch;
            up(0);
            race_setup();
            if (read(go[0], &ch, 1) != 1) _exit(3);
            unsigned long long got = 0;
            CUdeviceptr p;
            while (race_alloc(i, &p, 10 * MiB) == CUDA_SUCCESS) got += 10 * MiB;
            if (write(fds[i][1], &got, sizeof got) != sizeof got) _exit(3);
            pause(); /* hold the memory until the parent has looked */
            _exit(0);
        }
    }
    usleep(200000);
    for (int i = 0; i < N; i++)
        if (write(go[1], "x", 1) != 1) exit(2);
    unsigned long long sum = 0;
    for (int i = 0; i < N; i++) {
        unsigned long long got;
        if (read(fds[i][0], &got, sizeof got) != sizeof got) exit(2);
        sum += got;
    }
    CHECK_EQ(sum, 1000 * MiB);
    CHECK_EQ(t_used(0), N * CTX + 1000 * MiB);
    for (int i = 0; i < N; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < N; i++) waitpid(pids[i], NULL, 0);
    /* all four died holding memory: the next process of the slice gets it all back */
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, N * CTX + 1000 * MiB - CTX), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), N * CTX + 1000 * MiB);
}

static void s_dead_process_reclaimed(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    int ready[2];
    if (pipe(ready)) exit(2);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        up(0);
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 900 * MiB) != CUDA_SUCCESS) _exit(3);
        if (write(ready[1], "x", 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char ch;
    CHECK_EQ(read(ready[0], &ch, 1), 1);
    CHECK_EQ(t_used(0), CTX + 900 * MiB);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK_EQ(t_used(0), CTX + 900 * MiB); /* nobody has looked yet */
    up(0);                                 /* attaching reclaims */
    CHECK_EQ(t_used(0), CTX);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB - CTX), CUDA_SUCCESS);
}

/* A process SIGKILLed while it holds the region lock, in the middle of an update (seq odd, a device
 * total out of step): the next process recovers the lock, rebuilds totals, and goes on. */
static void s_killed_holding_lock(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    int ready[2];
    if (pipe(ready)) exit(2);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        up(0); /* creates the region and counts a context */
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 100 * MiB) != CUDA_SUCCESS) _exit(3);
        struct gs_region *r = t_map_region();
        if (!r || pthread_mutex_lock(&r->lock.mutex)) _exit(3);
        r->seq++;                      /* writer inside */
        r->devices[0].used += 777 * MiB; /* half-done update */
        if (write(ready[1], "x", 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char ch;
    CHECK_EQ(read(ready[0], &ch, 1), 1);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    up(0); /* must not hang: robust mutex -> EOWNERDEAD -> recover */
    struct gs_region *r = t_map_region();
    CHECK(r && (r->seq & 1) == 0, "seq even after recovery");
    CHECK_EQ(t_used(0), CTX); /* the dead child's 100 MiB + context reclaimed, the bogus 777 MiB gone */
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB - CTX), CUDA_SUCCESS);
    if (r) munmap(r, sizeof *r);
}

static void s_oom_kill_policy(void)
{
    t_slice("memory_limit=128m\ncontext_overhead=%llu\noom_policy=kill\n", CTX);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        up(0);
        CUdeviceptr p;
        cuMemAlloc_v2(&p, 65 * MiB);
        _exit(0); /* not reached: the refusal kills */
    }
    int st;
    waitpid(child, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "oom_policy=kill: status 0x%x", st);
}

static void s_bad_config_refuses(void)
{
    t_slice("memory_limt=1g\n"); /* typo: unknown key */
    CHECK_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_NOT_INITIALIZED);
}

/* A slice file that cannot be read is not trusted for anything, fail_open included; and env may only
 * tighten: GPUSLICE_FAIL_OPEN=1 cannot turn a broken configuration into an unlimited one. */
static void s_bad_config_env_cannot_fail_open(void)
{
    t_slice("memory_limit=lots\nfail_open=1\n");
    setenv("GPUSLICE_FAIL_OPEN", "1", 1);
    CHECK_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 2ull << 30), CUDA_ERROR_NOT_INITIALIZED);
}

/* fail_open=1 in a slice file that parses: the enforcer's own failure (here: a region it cannot
 * create) lets calls through unlimited. */
static void s_slice_fail_open(void)
{
    char path[320];
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "version=1\nmemory_limit=1g\nregion=/nonexistent-dir/slice.region\nfail_open=1\n");
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 2ull << 30), CUDA_SUCCESS);
}

/* ... and env may turn it off again: GPUSLICE_FAIL_OPEN=0 tightens. */
static void s_env_turns_fail_open_off(void)
{
    char path[320];
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "version=1\nmemory_limit=1g\nregion=/nonexistent-dir/slice.region\nfail_open=1\n");
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    setenv("GPUSLICE_FAIL_OPEN", "0", 1);
    CHECK_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
}

static void s_missing_slice_file_refuses(void)
{
    setenv("GPUSLICE_SLICE", "/nonexistent/slice.conf", 1);
    CHECK_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
}

/* A slice file without devices= limits every device the process sees, by ordinal. */
static void s_slice_without_devices(void)
{
    char path[320];
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "version=1\nmemory_limit=512m\nregion=%s\ncontext_overhead=0\n", t_region);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    up(0);
    int n;
    CHECK_EQ(fill(cuMemAlloc_v2, 64 * MiB, NULL, &n), 512 * MiB);
    CUcontext c1;
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(fill(cuMemAlloc_v2, 64 * MiB, NULL, &n), 512 * MiB);
    /* host-located VMM memory is not counted */
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = 2; /* CU_MEM_LOCATION_TYPE_HOST: the double refuses it, uncounted either way */
    CUmemGenericAllocationHandle h;
    CHECK_EQ(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
}

static void s_env_only_lowers(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=0\n");
    setenv("GPUSLICE_MEMORY_LIMIT", "256m", 1);
    up(0);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 256 * MiB);
}

static void s_env_cannot_raise(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=0\n");
    setenv("GPUSLICE_MEMORY_LIMIT", "8g", 1);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB + 1), CUDA_ERROR_OUT_OF_MEMORY);
}

static void s_hami_env(void)
{
    unsetenv("GPUSLICE_SLICE");
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "3000m", 1);   /* HAMi style: 3000 MiB */
    setenv("CUDA_DEVICE_MEMORY_LIMIT_1", "1g", 1);
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", t_region, 1);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    up(0);
    int n;
    /* the built-in context overhead applies (no slice file to set it): the slice holds 3000 MiB in all */
    unsigned long long ctx = t_used(0);
    CHECK(ctx > 0 && ctx < 3000 * MiB, "context counted: %llu", ctx);
    unsigned long long got = fill(cuMemAlloc_v2, MiB, NULL, &n);
    CHECK_EQ(got + ctx, 3000 * MiB);
    CUcontext c1;
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB); /* CUDA_DEVICE_MEMORY_LIMIT_1 */
    CHECK(access(t_region, F_OK) == 0, "CUDA_DEVICE_MEMORY_SHARED_CACHE names the region");
}

static void s_nvml_shows_slice(void)
{
    t_slice("memory_limit=2g\ncontext_overhead=%llu\n", CTX);
    char env[64];
    snprintf(env, sizeof env, "%d:999,424242:555", (int)getpid());
    setenv("GSDOUBLE_NVML_PIDS", env, 1);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 300 * MiB), CUDA_SUCCESS);
    nvmlDevice_t d;
    CHECK_EQ(nvmlInit_v2(), 0);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &d), 0);
    nvmlMemory_t m;
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d, &m), 0);
    CHECK_EQ(m.total, 2048 * MiB);
    CHECK_EQ(m.used, CTX + 300 * MiB);
    CHECK_EQ(m.free, 2048 * MiB - CTX - 300 * MiB);
    nvmlMemory_v2_t m2 = {0};
    CHECK_EQ(nvmlDeviceGetMemoryInfo_v2(d, &m2), 0);
    CHECK_EQ(m2.total, 2048 * MiB);
    CHECK_EQ(m2.used, CTX + 300 * MiB);
    nvmlProcessInfo_t procs[8];
    unsigned n = 8;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs), 0);
    CHECK_EQ(n, 1); /* the foreign pid 424242 is not in the slice */
    CHECK_EQ(procs[0].pid, getpid());
    CHECK_EQ(procs[0].usedGpuMemory, CTX + 300 * MiB);
    n = 0;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(n, 1);
    nvmlProcessDetail_v1_t det[4];
    nvmlProcessDetailList_t list = {1, 0, 4, det};
    CHECK_EQ(nvmlDeviceGetRunningProcessDetailList(d, &list), 0);
    CHECK_EQ(list.numProcArrayEntries, 1);
    CHECK_EQ(det[0].pid, getpid());
    CHECK_EQ(det[0].usedGpuMemory, CTX + 300 * MiB);
    /* device 1 has not been touched by the slice: the limit shows, usage 0 */
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(1, &d), 0);
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d, &m), 0);
    CHECK_EQ(m.total, 2048 * MiB);
    CHECK_EQ(m.used, 0);
}

static void s_created_contexts(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext a, b;
    CHECK_EQ(cuCtxCreate_v2(&a, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), 2 * CTX);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 100 * MiB), CUDA_SUCCESS); /* made in b, the current one */
    CHECK_EQ(cuCtxDestroy_v2(b), CUDA_SUCCESS);           /* frees p with it */
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(cuCtxDestroy_v2(a), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), 0);
}

static void s_fork_child_is_separate(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 200 * MiB), CUDA_SUCCESS);
    fflush(NULL);
    pid_t c = fork();
    if (c == 0) {
        /* the child owns none of the parent's memory; its own context and allocation count */
        int fails = 0;
        CUcontext ctx;
        if (cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) fails++;
        CUdeviceptr q;
        if (cuMemAlloc_v2(&q, 100 * MiB)) fails++;
        if (t_used(0) != 2 * CTX + 300 * MiB) fails++;
        if (cuMemFree_v2(p) != CUDA_SUCCESS) fails++; /* the double is process-local: p is a valid copy */
        _exit(fails);
    }
    int st;
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status 0x%x", st);
    /* The child left with _exit (no destructors): its record stays until someone needs the memory.
     * The child's free of p did not touch the parent's count. */
    CHECK_EQ(t_used(0), 2 * CTX + 300 * MiB);
    int n;
    CHECK_EQ(fill(cuMemAlloc_v2, MiB, NULL, &n), 1024 * MiB - CTX - 200 * MiB); /* dead child reclaimed */
    CHECK_EQ(t_used(0), 1024 * MiB);
}

/* A process that exits normally gives its record back at once (library destructor). */
static void s_normal_exit_detaches(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    fflush(NULL);
    pid_t c = fork();
    if (c == 0) {
        up(0);
        CUdeviceptr p;
        exit(cuMemAlloc_v2(&p, 500 * MiB) == CUDA_SUCCESS && t_used(0) == CTX + 500 * MiB ? 0 : 1);
    }
    int st;
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status 0x%x", st);
    CHECK_EQ(t_used(0), 0);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_not_in_slice_passes_through);
    SCENARIO(s_limit_exact);
    SCENARIO(s_every_path);
    SCENARIO(s_procaddr_and_dlsym);
    SCENARIO(s_launches_pass_through);
    SCENARIO(s_multi_device);
    SCENARIO(s_device_outside_slice);
    SCENARIO(s_threads_race);
    SCENARIO(s_processes_share_limit);
    SCENARIO(s_dead_process_reclaimed);
    SCENARIO(s_killed_holding_lock);
    SCENARIO(s_oom_kill_policy);
    SCENARIO(s_bad_config_refuses);
    SCENARIO(s_bad_config_env_cannot_fail_open);
    SCENARIO(s_slice_fail_open);
    SCENARIO(s_env_turns_fail_open_off);
    SCENARIO(s_missing_slice_file_refuses);
    SCENARIO(s_slice_without_devices);
    SCENARIO(s_env_only_lowers);
    SCENARIO(s_env_cannot_raise);
    SCENARIO(s_hami_env);
    SCENARIO(s_nvml_shows_slice);
    SCENARIO(s_created_contexts);
    SCENARIO(s_fork_child_is_separate);
    SCENARIO(s_normal_exit_detaches);
    fprintf(stderr, "test_enforcer%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
