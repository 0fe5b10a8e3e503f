/* pacer.c end to end over the CPU driver double: config text -> gs_pacer_init -> launches through
 * gs_pacer_before/after_launch with real CUDA-event calls (the double's events time host intervals,
 * so a "kernel" here is the time between before and after). Checks the achieved duty cycle against
 * the share, the per-device state file the pacer publishes, the unpaced 100 % path and the cost of
 * the measured path; and, through the launch hooks, which stream a _ptsz launch's events and
 * capture check name. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "gpuslice/config.h"
#include "gpuslice/controller.h"
#include "gpuslice/cuda_types.h"
#include "gpuslice/devstate.h"
#include "gpuslice/pacer.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuThreadExchangeStreamCaptureMode(int *);
/* the double's record of what the pacer asked (tests/double/cuda_double.c) */
extern void *gsdouble_last_event_stream, *gsdouble_capture_stream, *gsdouble_last_capture_query;
extern unsigned long gsdouble_event_records, gsdouble_launches, gsdouble_capture_violations, gsdouble_event_looks;

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* The CPU driver double's uuid of device 0 (tests/double/cuda_double.c), as the pacer names its state file. */
static void double_uuid(char *out, size_t len)
{
    unsigned char b[16];
    for (int k = 0; k < 16; k++) b[k] = (unsigned char)(k * 17);
    b[0] = 0xA0;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void spin(double s)
{
    double t = now_s() + s;
    while (now_s() < t) {
    }
}

/* Seconds this thread has waited on a run queue (runnable, not running): /proc's schedstat, 0 where
 * the kernel does not keep it. */
static double run_delay_s(void)
{
    unsigned long long on_cpu = 0, waited = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return 0;
    int n = fscanf(f, "%llu %llu", &on_cpu, &waited);
    fclose(f);
    return n == 2 ? waited / 1e9 : 0;
}

/* Run launches of `kern` seconds each for `secs`; return the achieved share in percent. *starved is
 * the part of the run this thread waited for a CPU: on a loaded box spins stretch and the pacer's
 * sleeps wake late, so the share is not the pacer's to hold. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The "kernel" is this thread spinning. Its share is judged two ways: by wall time (what the pacer's clock
 * sees: a spin preempted on a loaded box still held the device) and by the CPU time the spins got (what the
 * "device" really ran). Over the share is judged by the second (a 70 % slice read 73.7-74.0 % by wall time
 * with the thread waiting for a CPU 40 % of the time: CI of 6030e26, the preemption counted as device time),
 * under it by the first (a starved spin still holds its turn). *cpu_share: the second, when asked for. */
static double last_cpu_share;
static double run(double kern, double secs, double *starved)
{
    double busy = 0, cpu = 0, t0 = now_s(), d0 = run_delay_s();
    while (now_s() - t0 < secs) {
        gs_pacer_before_launch(0, NULL, 42);
        double k0 = now_s(), c0 = thread_cpu_s();
        spin(kern);
        busy += now_s() - k0;
        cpu += thread_cpu_s() - c0;
        gs_pacer_after_launch(0, NULL, 0);
    }
    double wall = now_s() - t0;
    if (starved) *starved = (run_delay_s() - d0) / wall;
    last_cpu_share = 100.0 * cpu / wall;
    return 100.0 * busy / wall;
}

/* Whether an achieved share holds the target: never more than 3 points over (by the spins' CPU time); at most
 * 3 under (by wall time), plus the part of the run this thread spent waiting for a CPU (a starved thread
 * cannot use its share: its wake-ups come late and its allowance is capped at one burst). */
static int holds(double got, double got_cpu, double target, double starved)
{
    return got_cpu < target + 3 && got > target - 3 - 100 * starved;
}

/* The achieved share over `secs` after a short settle, measured again (up to 4 times) while it misses `ok`
 * and the thread waited for a CPU more than 2 % of the time: a busy test box must not fail the pacer, and a
 * miss on a quiet one still does. *starved: the last attempt's wait. */
static double measured(double target, double secs, int (*ok)(double got, double target), const char *what,
                       double *starved)
{
    double got = 0;
    for (int attempt = 1; attempt <= 4; attempt++) {
        run(0.0005, 0.3, NULL);
        got = run(0.0005, secs, starved);
        if (ok(got, target)) return got;
        printf("  %s: achieved %.2f%% (%.2f%% by CPU time) against %.0f%%, %.1f%% of the time waiting for a CPU (attempt %d)\n",
               what, got, last_cpu_share, target, 100 * *starved, attempt);
        if (*starved <= 0.02) break;
    }
    return got;
}

static int in_band(double got, double target) { return got > target - 3 && last_cpu_share < target + 3; }
static int above(double got, double floor) { return got > floor; }

/* The achieved share within +-3 points of `target` (measured()). When every attempt was starved (a CI box 3x
 * oversubscribed saw 60-80 %), the last is judged with holds(). */
static double held_share(double target, double secs, const char *what)
{
    double starved = 0, got = measured(target, secs, in_band, what, &starved);
    if (in_band(got, target)) return got;
    CHECK(starved > 0.02 && holds(got, last_cpu_share, target, starved),
          "%s: achieved %.2f (%.2f by CPU time) against %.0f (the last attempt waited for a CPU %.1f%% of the time)", what,
          got, last_cpu_share, target, 100 * starved);
    return got;
}

static int scenario(const char *dir, int share)
{
    char text[512], err[256];
    struct gs_config cfg;
    snprintf(text, sizeof text, "version=1\ncompute=%d\nmode=hard\ngrant=pacer-test\npriority=0\ndevice_state_dir=%s\n", share, dir);
    if (gs_config_parse_text(text, strlen(text), &cfg, err, sizeof err) != 0) {
        CHECK(0, "config: %s", err);
        return 1;
    }
    CHECK(gs_pacer_init(&cfg) == 0, "pacer init");
    double got;
    if (share > 0 && share < 100) {
        got = held_share(share, 1.5, "share");
    } else {
        /* above 90 %, measured again while starved (measured()) and the last judged with that allowance (a CI
         * box with two CPU hogs and a second test job read 59 % here, its thread waiting for a CPU 46 % of the
         * time) */
        double starved = 0;
        got = measured(90, 1.5, above, "unpaced", &starved);
        CHECK(got > 90 - 100 * starved, "unpaced: achieved %.2f (the last attempt waited for a CPU %.1f%% of the time)", got,
              100 * starved);
    }
    printf("  share %3d%%: achieved %.2f%% (500 us kernels, synchronous double)\n", share, got);
    /* what the pacer published */
    struct gs_devstate ds;
    char uuid[64];
    double_uuid(uuid, sizeof uuid);
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "state folder %s/%s: %s", dir, uuid, err);
    int found = 0;
    for (int i = 0; i < gs_ds_nslices(&ds); i++) {
        struct gs_ds_slice *s = gs_ds_slice(&ds, i);
        if (!(s->flags & GS_DS_SLICE_IN_USE) || strcmp(s->grant, "pacer-test")) continue;
        found = 1;
        CHECK(s->share_bp == (uint32_t)share * 100, "published share %u", s->share_bp);
        if (share > 0 && share < 100) {
            CHECK(s->paced == 1 && s->launches > 100, "paced, launches counted (%llu)", (unsigned long long)s->launches);
            /* the published figure is the last complete 1-s window, which may hold a stretch this
             * thread waited for a CPU (held_share measured again then): a window missed while
             * starved is run again, up to 4 times; a miss on a quiet box still fails */
            int32_t a = s->achieved_bp;
            double starved = 0;
            for (int attempt = 1; attempt < 4 && !(a > (share - 3) * 100 && a < (share + 3) * 100); attempt++) {
                run(0.0005, 1.1, &starved);
                printf("  published achieved %d bp against %d%%, %.1f%% waiting for a CPU (attempt %d)\n", a, share,
                       100 * starved, attempt);
                a = __atomic_load_n(&s->achieved_bp, __ATOMIC_RELAXED);
                if (starved <= 0.02) break;
            }
            CHECK(holds(a / 100.0, a / 100.0, share, starved > 0.02 ? starved : 0), "published achieved %d bp (%.1f%% starved)", a,
                  100 * starved);
            CHECK(s->throttled_total_ns > 0, "throttled time counted");
        } else {
            CHECK(s->paced == 0, "100 %% is not paced");
        }
    }
    CHECK(found, "slice record present while running");
    if (share > 0 && share < 100) {
        /* a process of the slice rewrites its record's share (since version 5 only they can write it): the
         * pacer takes its share from its config and the roster, never from the record (issue 15) */
        int ms = -1, mp = -1;
        CHECK(gs_devstate_lock(&ds) == 0 &&
                  gs_devstate_join_locked(&ds, "pacer-test", (uint32_t)share * 100u, GS_CTL_HARD, 1, 0, 1, getpid(), 999, &ms, &mp) == 0,
              "a slice-mate joins: %s", ds.why);
        gs_devstate_unlock(&ds);
        if (ms >= 0) __atomic_store_n(&gs_ds_slice(&ds, ms)->share_bp, (uint32_t)(100 - share) * 100u, __ATOMIC_RELAXED);
        double kept = held_share(share, 1.0, "after a slice-mate rewrote the record");
        printf("  record rewritten %d%% -> %d%%: achieved %.2f%% (kept)\n", share, 100 - share, kept);
        /* a live share change (what a resize does: gpuslice.enforcer.policy.write_policies): root's roster
         * says 100 - share, and the pacer follows it within the roster's recheck (100 ms) */
        char folder[1200], file[1300];
        snprintf(folder, sizeof folder, "%s/%s.policy", dir, uuid);
        snprintf(file, sizeof file, "%s/pacer-test", folder);
        CHECK(mkdir(folder, 0755) == 0 && chmod(folder, 0755) == 0, "roster folder %s", folder);
        FILE *f = fopen(file, "w");
        CHECK(f != NULL, "roster file %s", file);
        if (f) {
            fprintf(f, "version=1\ngrant=pacer-test\ncompute=%d\nmode=hard\npriority=0\n", 100 - share);
            fclose(f);
            chmod(file, 0644);
        }
        double moved = held_share(100 - share, 1.0, "after a live change");
        printf("  live change %d%% -> %d%% through the roster: achieved %.2f%%\n", share, 100 - share, moved);
        unlink(file);
        rmdir(folder);
        if (gs_devstate_lock(&ds) == 0) {
            gs_devstate_leave_locked(&ds, mp);
            gs_devstate_unlock(&ds);
        }
    }
    gs_devstate_close(&ds);
    gs_pacer_shutdown();
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "reopen");
    int left = 0;
    for (int i = 0; i < gs_ds_nprocs(&ds); i++) left += (gs_ds_proc(&ds, i)->flags & GS_DS_PROC_IN_USE) != 0;
    CHECK(left == 0, "shutdown gave the process record back (%d left)", left);
    gs_devstate_close(&ds);
    return 0;
}

/* Through the launch hooks (launch.c) in a child that runs under a paced slice: a _ptsz launch on
 * stream 0 runs on the per-thread default stream, so its events and its capture check must name
 * CU_STREAM_PER_THREAD (0x2), not 0 (the legacy stream). The double records both. */
static void ptsz_child(const char *dir)
{
    char path[300], text[600];
    snprintf(path, sizeof path, "%s/ptsz.slice", dir);
    snprintf(text, sizeof text, "version=1\ngrant=ptsz\ncompute=30\nregion=%s/ptsz.region\ndevice_state_dir=%s\n", dir, dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    setenv("GPUSLICE_SLICE", path, 1);
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        CHECK(0, "double: no context");
        return;
    }
    void *const PT = (void *)0x2, *const OTHER = (void *)0x5150;
    /* every launch below has a kernel shape of its own (grid x): the first launches of a shape are
     * always measured (costmodel.h), so each must record an event pair */
    struct { const char *what; int ptsz; void *stream, *expect; } cases[] = {
        {"cuLaunchKernel_ptsz, stream 0", 1, NULL, PT},
        {"cuLaunchKernel, stream 0", 0, NULL, NULL},
        {"cuLaunchKernel_ptsz, a created stream", 1, OTHER, OTHER},
    };
    for (unsigned k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        unsigned long r0 = gsdouble_event_records, l0 = gsdouble_launches;
        unsigned gx = 1 + k;
        gsdouble_last_event_stream = gsdouble_last_capture_query = (void *)-2;
        CUresult r = cases[k].ptsz ? cuLaunchKernel_ptsz(NULL, gx, 1, 1, 1, 1, 1, 0, (CUstream)cases[k].stream, NULL, NULL)
                                   : cuLaunchKernel(NULL, gx, 1, 1, 1, 1, 1, 0, (CUstream)cases[k].stream, NULL, NULL);
        CHECK(r == CUDA_SUCCESS && gsdouble_launches == l0 + 1, "%s: launched (%d)", cases[k].what, r);
        CHECK(gsdouble_event_records == r0 + 2, "%s: a paced launch of a new shape records an event pair (%lu)",
              cases[k].what, gsdouble_event_records - r0);
        CHECK(gsdouble_last_event_stream == cases[k].expect, "%s: events recorded on stream %p, expected %p",
              cases[k].what, gsdouble_last_event_stream, cases[k].expect);
        CHECK(gsdouble_last_capture_query == cases[k].expect, "%s: capture checked on stream %p, expected %p",
              cases[k].what, gsdouble_last_capture_query, cases[k].expect);
    }
    /* the other _ptsz entry points name the same stream */
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 4;
    gsdouble_last_event_stream = (void *)-2;
    CHECK(cuLaunchKernelEx_ptsz(&cfg, NULL, NULL, NULL) == CUDA_SUCCESS && gsdouble_last_event_stream == PT,
          "cuLaunchKernelEx_ptsz, stream 0: events on %p", gsdouble_last_event_stream);
    gsdouble_last_event_stream = (void *)-2;
    CHECK(cuLaunchCooperativeKernel_ptsz(NULL, 5, 1, 1, 1, 1, 1, 0, NULL, NULL) == CUDA_SUCCESS && gsdouble_last_event_stream == PT,
          "cuLaunchCooperativeKernel_ptsz, stream 0: events on %p", gsdouble_last_event_stream);
    gsdouble_last_event_stream = (void *)-2;
    CHECK(cuGraphLaunch_ptsz(NULL, NULL) == CUDA_SUCCESS && gsdouble_last_event_stream == PT,
          "cuGraphLaunch_ptsz, stream 0: events on %p", gsdouble_last_event_stream);
    /* the per-thread stream is being captured into a graph (global mode, the default; as by another thread of the
     * program in the double's model): its launches are neither paced nor timed (an event record would join the
     * graph); the legacy stream's are refused by the driver (blocked by the capture: CAPTURE_IMPLICIT); a
     * non-blocking stream's still are. This thread stays in global mode, the default, which the enforcer must leave
     * as it found it. */
    gsdouble_capture_stream = PT;
    unsigned long r0 = gsdouble_event_records, l0 = gsdouble_launches;
    CHECK(cuLaunchKernel_ptsz(NULL, 6, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS && gsdouble_launches == l0 + 1,
          "launch under capture passes");
    CHECK(gsdouble_event_records == r0, "no event recorded into a capturing per-thread stream (%lu)", gsdouble_event_records - r0);
    CHECK(cuLaunchKernel(NULL, 7, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT &&
              gsdouble_event_records == r0,
          "the legacy stream, blocked by the capture: refused by the driver, nothing recorded (%lu)",
          gsdouble_event_records - r0);
    CHECK(cuLaunchKernel(NULL, 8, 1, 1, 1, 1, 1, 0, (CUstream)OTHER, NULL, NULL) == CUDA_SUCCESS && gsdouble_event_records == r0 + 2,
          "a non-blocking stream, not capturing, is still timed (%lu)", gsdouble_event_records - r0);
    /* meanwhile this paced process goes on launching on that stream: its launching thread's harvests and its
     * poller's look at their events in relaxed mode only (pacer.c query_state): a look in global mode would fail
     * and invalidate the program's capture (PyTorch's torch.cuda.graph captures in that mode) */
    unsigned long v0 = gsdouble_capture_violations, looks0 = gsdouble_event_looks;
    for (int i = 0; i < 64; i++) cuLaunchKernel(NULL, 9 + (unsigned)i, 1, 1, 1, 1, 1, 0, (CUstream)OTHER, NULL, NULL);
    for (int ms = 0; ms < 2000 && __atomic_load_n(&gsdouble_event_looks, __ATOMIC_RELAXED) < looks0 + 64; ms++) usleep(1000);
    CHECK(gsdouble_event_looks >= looks0 + 64, "events looked at during the capture (%lu)", gsdouble_event_looks - looks0);
    CHECK(gsdouble_capture_violations == v0, "no look the capture forbids (%lu)", gsdouble_capture_violations - v0);
    int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS && mode == CU_STREAM_CAPTURE_MODE_GLOBAL,
          "the launching thread's capture mode is as it was (%d)", mode);
    gsdouble_capture_stream = (void *)-1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int64_t mono_ns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int last_path; /* launch_cost beside a neighbour: the path our record showed (-1 none) */

/* ns per launch (before + after) of the pacer as configured by `slice`, over n launches of one
 * kernel shape, `cpu` seconds of CPU work apart (left out of the result); *pairs: event records per
 * launch. beside: a device state in which a high-priority slice stays active (its record refreshed
 * every 1000 launches), or NULL. */
static double launch_cost(const char *dir, const char *slice, int n, double cpu, struct gs_devstate *beside,
                          int hi_slice, double *pairs)
{
    char err[256];
    struct gs_config cfg;
    if (gs_config_parse_text(slice, strlen(slice), &cfg, err, sizeof err) != 0 || gs_pacer_init(&cfg) != 0) {
        CHECK(0, "config for a cost check: %s", err);
        return 0;
    }
    (void)dir;
    /* the neighbour is active before the first launch, which decides the path (kept for 10 ms) */
    if (beside) __atomic_store_n(&gs_ds_slice(beside, hi_slice)->last_active_ns, mono_ns_now(), __ATOMIC_RELAXED);
    for (int i = 0; i < 64; i++) { /* set-up, and the shape's first (measured) launches */
        gs_pacer_before_launch(0, NULL, 7);
        gs_pacer_after_launch(0, NULL, 0);
    }
    unsigned long r0 = gsdouble_event_records;
    /* the calls are timed themselves (the CPU work between them is not: subtracting a loop of it
     * alone went negative on a loaded box); the median of 100 batches leaves out batches that waited
     * for a CPU */
    enum { BATCHES = 100 };
    double per[BATCHES];
    for (int b = 0; b < BATCHES; b++) {
        double in_calls = 0;
        for (int i = b * (n / BATCHES); i < (b + 1) * (n / BATCHES); i++) {
            if (beside && i % 1000 == 0) __atomic_store_n(&gs_ds_slice(beside, hi_slice)->last_active_ns, mono_ns_now(), __ATOMIC_RELAXED);
            double t = now_s();
            gs_pacer_before_launch(0, NULL, 7);
            gs_pacer_after_launch(0, NULL, 0);
            in_calls += now_s() - t;
            if (cpu > 0) spin(cpu);
        }
        per[b] = in_calls / (n / BATCHES) * 1e9;
    }
    qsort(per, BATCHES, sizeof per[0], cmp_double);
    double ns = per[BATCHES / 2];
    if (pairs) *pairs = (double)(gsdouble_event_records - r0) / 2.0 / n;
    /* the path our process record shows beside that neighbour (before the record is given back) */
    last_path = -1;
    if (beside && gs_devstate_lock(beside) == 0) { /* our pacer's file, as the neighbour's scan finds it */
        gs_devstate_scan_locked(beside, 0, 1);
        gs_devstate_unlock(beside);
    }
    for (int i = 0; beside && i < gs_ds_nprocs(beside); i++) {
        const struct gs_ds_proc *pr = gs_ds_proc(beside, i);
        if ((pr->flags & GS_DS_PROC_IN_USE) && pr->pid == (int32_t)getpid() && gs_ds_proc_slice(i) != hi_slice) last_path = pr->path;
    }
    gs_pacer_shutdown();
    return ns;
}

/* the unpaced path's cost per launch (before + after), which is what a 100 % or memory-only slice
 * pays; then the free path (a paced launch-bound process: one atomic charge, an event pair for 1
 * launch in 16 of a shape) and the measured path (lock, event pair, harvest on every launch: the
 * turns path), what a paced slice pays on the CPU. The double's events cost ~20 ns,
 * a real cuEventRecord ~1-2 us more each. Share 99 so the gate is never what is measured. */
static void check_launch_costs(const char *dir)
{
    char text[512], err[256];
    snprintf(text, sizeof text, "version=1\ncompute=100\ngrant=cost\npriority=0\ndevice_state_dir=%s\n", dir);
    double ns = launch_cost(dir, text, 1000000, 0, NULL, 0, NULL);
    printf("  unpaced path: %.0f ns per launch (this build)\n", ns);
    /* generous for sanitizer builds; a plain -O2 build measures ~20-40 ns */
    CHECK(ns < 1500, "unpaced launch path costs %.0f ns", ns);

    /* 2 us of CPU between launches, as in a launch-bound loop: back-to-back launches of the double's
     * empty kernels would offer a load near 1 (the pair spans the launch call) and might take turns */
    double pairs = 0, free_ns = 0;
    snprintf(text, sizeof text, "version=1\ncompute=99\ngrant=cost-free\npriority=1\ndevice_state_dir=%s\n", dir);
    /* The double's kernels take no time, so its event pairs time the CPU: a thread descheduled inside
     * one makes a pair of milliseconds, the offered load jumps above 1.5 for a window and the process
     * takes the turns path (every launch measured). Measured again, up to 3 times, while this thread
     * waited for a CPU (a loaded box: 0.103-0.146 pairs per launch seen there, before and after issue
     * 12's change); a quiet box must measure 1 in 16 at once. */
    for (int attempt = 1; attempt <= 3; attempt++) {
        double d0 = run_delay_s(), t0 = now_s();
        free_ns = launch_cost(dir, text, 200000, 2e-6, NULL, 0, &pairs);
        double starved = (run_delay_s() - d0) / (now_s() - t0);
        if ((pairs > 0.03 && pairs < 0.1) || starved <= 0.02) break;
        printf("  free path: %.3f pairs per launch while waiting for a CPU %.1f%% of the time (attempt %d)\n", pairs,
               100 * starved, attempt);
    }
    printf("  free path: %.0f ns per launch, %.3f event pairs per launch (this build, the double's events)\n", free_ns, pairs);
    CHECK(free_ns < 3000, "free launch path costs %.0f ns", free_ns);
    CHECK(pairs > 0.03 && pairs < 0.1, "free path measures about 1 launch in 16 of a shape (%.3f)", pairs);

    /* a (preemptive) high-priority slice is on the device: this low-priority process takes the yield
     * path (issue 13), lock-free like the free path: a gate that reads the neighbour's record, its
     * credit, and 1 launch in 16 of a shape measured; nothing held while the neighbour is not queued */
    struct gs_devstate ds;
    char uuid[64];
    double_uuid(uuid, sizeof uuid);
    int hs = -1, hp = -1;
    if (gs_devstate_open(&ds, dir, uuid, err, sizeof err) != 0 || gs_devstate_lock(&ds) != 0) {
        CHECK(0, "device state for the measured cost check: %s", err);
        return;
    }
    CHECK(gs_devstate_join_locked(&ds, "cost-high", 10000, 0, 1, 0, 0, (int32_t)getpid(), 999, &hs, &hp) == 0, "high slice");
    gs_devstate_unlock(&ds);
    snprintf(text, sizeof text, "version=1\ncompute=99\ngrant=cost-paced\npriority=1\ndevice_state_dir=%s\n", dir);
    double measured_ns = launch_cost(dir, text, 200000, 0, &ds, hs, &pairs);
    printf("  yield path: %.0f ns per launch, %.3f event pairs per launch (this build, the double's events)\n",
           measured_ns, pairs);
    CHECK(last_path == GS_DS_PATH_YIELD, "beside a preemptive high-priority slice the path is yield (%d)", last_path);
    CHECK(measured_ns < 3000, "yield launch path costs %.0f ns", measured_ns);
    CHECK(pairs > 0.03 && pairs < 0.1, "yield path measures about 1 launch in 16 of a shape, as free (%.3f)", pairs);
    if (gs_devstate_lock(&ds) == 0) {
        gs_devstate_leave_locked(&ds, hp);
        gs_devstate_unlock(&ds);
    }
    gs_devstate_close(&ds);
}

/* Kubernetes mounts the device-state folder read-only, each granted slice's own file read-write on top of it
 * (a pod must write no host folder: no ephemeral-storage limit counts a bind mount's bytes; attacker's review,
 * stop 28). In a mount namespace of its own the child builds that layout and checks that the pacer takes it,
 * sizes the (empty) file through its mount and paces, and that nothing can be made in the folders. Needs root
 * for the mounts (CI runs the suite as root); without it the case is reported as not run. Exit codes name
 * the step that failed. */
static int readonly_folder_child(const char *base, uid_t as)
{
    char dir[160], slices[256], file[320], text[512], err[256], uuid[64];
    double_uuid(uuid, sizeof uuid);
    snprintf(dir, sizeof dir, "%s/ro-%u", base, (unsigned)as);
    snprintf(slices, sizeof slices, "%s/%s%s", dir, uuid, GS_DS_FOLDER_SUFFIX);
    snprintf(file, sizeof file, "%s/ro-test", slices);
    if (mkdir(dir, 0755) != 0 || mkdir(slices, 0755) != 0) return 10;
    int fd = open(file, O_CREAT | O_WRONLY, 0666);
    if (fd < 0 || fchmod(fd, 0666) != 0) return 11; /* as the device plugin makes it: any uid of the pod */
    close(fd);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return 12;
    if (mount(dir, dir, NULL, MS_BIND, NULL) != 0 || mount(file, file, NULL, MS_BIND, NULL) != 0 ||
        mount(NULL, dir, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0)
        return 13;
    if (as != 0 && (setgid(as) != 0 || setuid(as) != 0)) return 12; /* a pod's runAsUser */
    char other[300], other2[400];
    snprintf(other, sizeof other, "%s/junk", dir);
    snprintf(other2, sizeof other2, "%s/junk", slices);
    if (open(other, O_CREAT | O_WRONLY, 0666) >= 0 || (errno != EROFS && errno != EACCES)) return 14;
    if (open(other2, O_CREAT | O_WRONLY, 0666) >= 0 || (errno != EROFS && errno != EACCES)) return 14;
    snprintf(text, sizeof text, "version=1\ncompute=50\nmode=hard\ngrant=ro-test\npriority=0\ndevice_state_dir=%s\n", dir);
    struct gs_config cfg;
    if (gs_config_parse_text(text, strlen(text), &cfg, err, sizeof err) != 0 || gs_pacer_init(&cfg) != 0) return 15;
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 16;
    run(0.0005, 0.3, NULL);
    struct stat st;
    if (stat(file, &st) != 0 || st.st_size != GS_DS_FILE_SIZE) return 17;
    struct gs_devstate ds;
    if (gs_devstate_open(&ds, dir, uuid, err, sizeof err) != 0) return 18;
    int found = 0;
    for (int i = 0; i < gs_ds_nslices(&ds); i++)
        found |= (gs_ds_slice(&ds, i)->flags & GS_DS_SLICE_IN_USE) && !strcmp(gs_ds_slice(&ds, i)->grant, "ro-test") &&
                 gs_ds_slice(&ds, i)->paced && gs_ds_slice(&ds, i)->launches > 0;
    gs_devstate_close(&ds);
    gs_pacer_shutdown();
    return found ? 0 : 19;
}

static void readonly_folder(const char *base)
{
    if (geteuid() != 0) {
        printf("test_pacer: read-only device-state folder case not run (needs root)\n");
        return;
    }
    /* as root, and as a pod's non-root runAsUser (to whom the root-owned 0755 folder answers EACCES, not EROFS) */
    for (uid_t as = 0; as <= 65534; as += 65534) {
        fflush(NULL);
        pid_t kid = fork();
        if (kid == 0) _exit(readonly_folder_child(base, as));
        int st = 0;
        waitpid(kid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "uid %u: a read-only device-state folder with the pacing file mounted read-write on it: taken and paced "
              "(child exit %d: 10-13 set-up, 14 the folder took a file, 15 pacer refused it, 16 context, 17 file not "
              "sized, 18 state, 19 not published)", (unsigned)as, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            printf("  read-only device-state folder, pacing file mounted read-write, uid %u: paced\n", (unsigned)as);
    }
}

int main(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/gs-test-pacer-%d", (int)getpid());
    /* first, before this process touches a hooked call (the enforcer decides once per process) */
    {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "note: mkdir %s failed\n", dir);
        fflush(NULL);
        pid_t kid = fork();
        if (kid == 0) {
            ptsz_child(dir);
            fflush(NULL);
            _exit(failures ? 1 : 0);
        }
        int st = 0;
        waitpid(kid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "_ptsz launches through the hooks (child status 0x%x)", st);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) printf("  _ptsz launches: events and capture check on the per-thread stream\n");
        readonly_folder(dir); /* a fresh process too: gs_pacer_init runs once per process */
    }
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "double: no context\n");
        return 1;
    }
    scenario(dir, 30);
    scenario(dir, 70);
    scenario(dir, 100);
    check_launch_costs(dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    printf("test_pacer: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
