/* What a high-priority process's drain machinery (native/src/pacing/coloc.c) costs its launching thread, piece by
 * piece, on the real driver (issue 13). The stop-31 runs found a ResNet-50 server 1-2 ms a request slower with drain
 * records on (bench/results/2026-11-29-h200-coloc-spatialgate-*.md) and could not say which piece costs it. Here a
 * request is R ops of: C us of CPU work (a framework's per-op time), then one launch of a K-us spin kernel; after
 * the R ops the thread synchronizes. The median request time is reported for each scenario:
 *   base        nothing else
 *   rec         + cuEventRecord of one drain event after every launch
 *   rec_wake    + a poller thread as the enforcer runs it: a launch finding no drain armed arms it and wakes the
 *                 poller with FUTEX_WAKE; the poller queries the event every 10-100 us while armed, else sleeps
 *   rec_poll10  + a poller querying every 10 us while armed, never woken (a launch only arms)
 *   rec_poll50  the same every 50 us
 *   rec_age15   + a poller ticking every 10 us that queries only a record at least 15 us old (the enforcer's
 *               DRAIN_AGE), never woken
 *   rec_cap     rec with a cuStreamIsCapturing before each record (the enforcer records no drain into a stream
 *               being captured into a CUDA graph: what that check adds)
 *   poll10      a poller querying a done event every 10 us, no records (the query's cost alone)
 *   wake        futex wakes of a sleeping thread that makes no CUDA call (the wake's cost alone)
 *   wv          cuStreamWriteValue32 of a sequence number to mapped pinned host memory after every launch, instead
 *               of the event record (the GPU writes it once the launch's work is done)
 *   wv_poll10   + a poller reading that memory every 10 us while armed: no driver call in the poller
 * It also says whether the written value arrived (stream memory operations work here, e.g. as an MPS client).
 * Patterns: launch (launch-bound), decode (many tiny kernels), gpubound (back-to-back 30-us kernels over every SM,
 * no CPU work between launches: whether a record between kernels costs the GPU time, which the CPU-bound patterns
 * cannot show). Scenarios run in order, then in reverse (ABBA), `reps` times. Prints "pattern scenario median_us p90_us" lines.
 * Build: cc -O2 -std=c11 -pthread bench/drain_cost.c -o drain_cost -ldl
 * Run:   ./drain_cost [requests=150] [reps=2]  (twice: alone, and as an MPS client) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuModuleLoadData)(void **, const void *);
static CUresult (*cuModuleGetFunction)(void **, void *, const char *);
static CUresult (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                                  void **, void **);
static CUresult (*cuEventCreate)(void **, unsigned);
static CUresult (*cuEventRecord)(void *, void *);
static CUresult (*cuEventQuery)(void *);
static CUresult (*cuStreamIsCapturing)(void *, int *);
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemHostGetDevicePointer_v2)(unsigned long long *, void *, unsigned);
static CUresult (*wv32)(void *, unsigned long long, uint32_t, unsigned);

/* a kernel that spins for `ns` of the GPU's global timer */
static const char ptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                          ".visible .entry spin(.param .u64 ns)\n{\n"
                          " .reg .u64 %t0, %t1, %d, %n;\n .reg .pred %p;\n"
                          " ld.param.u64 %n, [ns];\n mov.u64 %t0, %globaltimer;\n"
                          "LOOP:\n mov.u64 %t1, %globaltimer;\n sub.u64 %d, %t1, %t0;\n"
                          " setp.lt.u64 %p, %d, %n;\n @%p bra LOOP;\n ret;\n}\n";

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void cpu_work(int64_t ns)
{
    int64_t end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

enum { BASE, REC, REC_WAKE, REC_POLL10, REC_POLL50, REC_AGE15, REC_CAP, POLL10, WAKE, WV, WV_POLL10, NSCEN };
static const char *NAMES[NSCEN] = {"base", "rec", "rec_wake", "rec_poll10", "rec_poll50", "rec_age15", "rec_cap", "poll10",
                                   "wake", "wv", "wv_poll10"};
#define RECORDS(s)                                                                                                     \
    ((s) == REC || (s) == REC_WAKE || (s) == REC_POLL10 || (s) == REC_POLL50 || (s) == REC_AGE15 || (s) == REC_CAP)

static struct {
    CUcontext ctx;
    void *fn, *drain;
    int scen, stop;
    uint32_t armed, seq, wv_seq;
    int64_t rec_ns;
    volatile uint32_t *host;
    unsigned long long dptr;
    long queries;
} g;

static void futex_wait(uint32_t *w, uint32_t v, int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, &ts, NULL, 0);
}

static void futex_wake(uint32_t *w)
{
    __atomic_add_fetch(w, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *poller(void *arg)
{
    (void)arg;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); /* as the enforcer's poller */
    cuCtxSetCurrent(g.ctx);
    int64_t since = 0;
    while (!__atomic_load_n(&g.stop, __ATOMIC_ACQUIRE)) {
        uint32_t seq = __atomic_load_n(&g.seq, __ATOMIC_ACQUIRE);
        int s = g.scen;
        int64_t next = 5000000;
        if (s == POLL10) {
            cuEventQuery(g.drain);
            g.queries++;
            next = 10000;
        } else if ((s == REC_WAKE || s == REC_POLL10 || s == REC_POLL50) && __atomic_load_n(&g.armed, __ATOMIC_ACQUIRE)) {
            int64_t t = now_ns();
            if (s == REC_WAKE) cuCtxSetCurrent(g.ctx); /* as the enforcer's poller does each round */
            g.queries++;
            if (cuEventQuery(g.drain) == 0) {
                __atomic_store_n(&g.armed, 0, __ATOMIC_RELEASE);
                since = 0;
            } else if (!since) {
                since = t;
            }
            /* gs_coloc_drain_delay: half the time pending, 10..100 us */
            int64_t d = since ? (t - since) / 2 : 0;
            next = s == REC_POLL50 ? 50000 : d < 10000 ? 10000 : d > 100000 ? 100000 : d;
        } else if (s == REC_AGE15) {
            if (__atomic_load_n(&g.armed, __ATOMIC_ACQUIRE) && now_ns() - __atomic_load_n(&g.rec_ns, __ATOMIC_ACQUIRE) >= 15000) {
                g.queries++;
                if (cuEventQuery(g.drain) == 0) __atomic_store_n(&g.armed, 0, __ATOMIC_RELEASE);
            }
            next = 10000;
        } else if (s == WV_POLL10 && g.host && __atomic_load_n(&g.armed, __ATOMIC_ACQUIRE)) {
            g.queries++;
            if (*g.host == __atomic_load_n(&g.wv_seq, __ATOMIC_ACQUIRE)) __atomic_store_n(&g.armed, 0, __ATOMIC_RELEASE);
            next = 10000;
        } else if (s == REC_POLL10 || s == REC_POLL50 || s == WV_POLL10) {
            next = s == REC_POLL10 ? 10000 : 50000;
        }
        futex_wait(&g.seq, seq, next);
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* one scenario: `n` requests of `ops` (C us CPU, K us kernel of `grid` blocks); median and p90 request time in us */
static void run(const char *pattern, int s, int n, int ops, int64_t c_ns, unsigned long long k_ns, unsigned grid,
                int64_t *out)
{
    cuCtxSynchronize(); /* the previous scenario's records have run: nothing armed is left over */
    __atomic_store_n(&g.armed, 0, __ATOMIC_RELEASE);
    g.scen = s;
    futex_wake(&g.seq); /* the poller takes up the scenario now */
    void *args[] = {&k_ns};
    for (int r = 0; r < n; r++) {
        int64_t t0 = now_ns();
        for (int i = 0; i < ops; i++) {
            cpu_work(c_ns);
            cuLaunchKernel(g.fn, grid, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
            int capturing = 0;
            if (s == REC_CAP && (cuStreamIsCapturing(NULL, &capturing) != 0 || capturing)) continue;
            if (RECORDS(s)) {
                cuEventRecord(g.drain, NULL);
                if (s == REC_AGE15) __atomic_store_n(&g.rec_ns, now_ns(), __ATOMIC_RELEASE);
                int was = __atomic_exchange_n(&g.armed, 1, __ATOMIC_ACQ_REL);
                if (s == REC_WAKE && !was) futex_wake(&g.seq);
            } else if ((s == WV || s == WV_POLL10) && wv32) {
                uint32_t v = __atomic_add_fetch(&g.wv_seq, 1, __ATOMIC_RELEASE);
                wv32(NULL, g.dptr, v, 0);
                __atomic_store_n(&g.armed, 1, __ATOMIC_RELEASE);
            } else if (s == WAKE) {
                futex_wake(&g.seq);
            }
        }
        cuCtxSynchronize();
        out[r] = now_ns() - t0;
        cpu_work(c_ns * 4); /* a gap between requests */
    }
    qsort(out, (size_t)n, sizeof *out, cmp);
    printf("%s %s %.1f %.1f\n", pattern, NAMES[s], out[n / 2] / 1e3, out[n * 9 / 10] / 1e3);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 150, reps = argc > 2 ? atoi(argv[2]) : 2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
#define SYM(f)                                                                                                         \
    do {                                                                                                               \
        *(void **)&f = dlsym(h, #f);                                                                                   \
        if (!f) {                                                                                                      \
            fprintf(stderr, "no %s\n", #f);                                                                           \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
    SYM(cuInit);
    SYM(cuDevicePrimaryCtxRetain);
    SYM(cuCtxSetCurrent);
    SYM(cuCtxSynchronize);
    SYM(cuModuleLoadData);
    SYM(cuModuleGetFunction);
    SYM(cuLaunchKernel);
    SYM(cuEventCreate);
    SYM(cuEventRecord);
    SYM(cuEventQuery);
    SYM(cuStreamIsCapturing);
    *(void **)&cuMemHostAlloc = dlsym(h, "cuMemHostAlloc");
    *(void **)&cuMemHostGetDevicePointer_v2 = dlsym(h, "cuMemHostGetDevicePointer_v2");
    *(void **)&wv32 = dlsym(h, "cuStreamWriteValue32_v2");
    if (!wv32) *(void **)&wv32 = dlsym(h, "cuStreamWriteValue32");
    void *mod;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDevicePrimaryCtxRetain(&g.ctx, 0)) || (r = cuCtxSetCurrent(g.ctx)) ||
        (r = cuModuleLoadData(&mod, ptx)) || (r = cuModuleGetFunction(&g.fn, mod, "spin")) ||
        (r = cuEventCreate(&g.drain, 2 /* CU_EVENT_DISABLE_TIMING */))) {
        fprintf(stderr, "init failed: %d\n", r);
        return 1;
    }
    void *hp = NULL;
    if (!wv32 || !cuMemHostAlloc || !cuMemHostGetDevicePointer_v2 || (r = cuMemHostAlloc(&hp, 4096, 2 /* DEVICEMAP */)) ||
        (r = cuMemHostGetDevicePointer_v2(&g.dptr, hp, 0)) || (r = wv32(NULL, g.dptr, 7, 0)) || (r = cuCtxSynchronize())) {
        printf("stream_write_value unavailable (%s %d): wv scenarios measure nothing\n", r ? "error" : "no symbol", r);
        wv32 = NULL;
    } else {
        g.host = hp;
        printf("stream_write_value %s\n", *g.host == 7 ? "works" : "wrote nothing");
        if (*g.host != 7) wv32 = NULL;
    }
    pthread_t t;
    pthread_create(&t, NULL, poller, NULL);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(n > 20 ? n : 20));
    /* launch-bound (a ResNet-50 b1 request: ~150 ops, ~25 us each on the CPU, short kernels) and decode-like
     * (many tiny kernels launched back to back) */
    struct { const char *name; int ops; int64_t c; unsigned long long k; unsigned grid; } pat[] = {
        {"launch", 150, 20000, 5000, 1}, {"decode", 300, 3000, 4000, 1}, {"gpubound", 150, 0, 30000, 264}};
    enum { NPAT = sizeof pat / sizeof pat[0] };
    for (int p = 0; p < NPAT; p++) run(pat[p].name, BASE, 20, pat[p].ops, pat[p].c, pat[p].k, pat[p].grid, out); /* warm-up */
    for (int rep = 0; rep < reps; rep++)
        for (int p = 0; p < NPAT; p++)
            for (int k = 0; k < 2 * NSCEN; k++) {
                int s = k < NSCEN ? k : 2 * NSCEN - 1 - k;
                run(pat[p].name, s, n, pat[p].ops, pat[p].c, pat[p].k, pat[p].grid, out);
            }
    __atomic_store_n(&g.stop, 1, __ATOMIC_RELEASE);
    futex_wake(&g.seq);
    pthread_join(t, NULL);
    fprintf(stderr, "poller queries: %ld\n", g.queries);
    free(out);
    return 0;
}
