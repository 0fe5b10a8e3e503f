/* pacer.c end to end over the CPU driver double: config text -> gs_pacer_init -> launches through
 * gs_pacer_before/after_launch with real CUDA-event calls (the double's events time host intervals,
 * so a "kernel" here is the time between before and after). Checks the achieved duty cycle against
 * the share, the per-device state file the pacer publishes, and the unpaced 100 % path. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

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

/* Run launches of `kern` seconds each for `secs`; return the achieved share in percent. */
static double run(double kern, double secs)
{
    double busy = 0, t0 = now_s();
    while (now_s() - t0 < secs) {
        gs_pacer_before_launch(0, NULL);
        double k0 = now_s();
        spin(kern);
        busy += now_s() - k0;
        gs_pacer_after_launch(0, NULL, 0);
    }
    return 100.0 * busy / (now_s() - t0);
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
    double warm = run(0.0005, 0.3);
    (void)warm;
    double got = run(0.0005, 1.5);
    printf("  share %3d%%: achieved %.2f%% (500 us kernels, synchronous double)\n", share, got);
    if (share > 0 && share < 100) CHECK(got > share - 3 && got < share + 3, "share %d: achieved %.2f", share, got);
    else CHECK(got > 90, "unpaced: achieved %.2f", got);
    /* what the pacer published */
    struct gs_devstate ds;
    char uuid[64];
    unsigned char b[16];
    for (int k = 0; k < 16; k++) b[k] = (unsigned char)(k * 17);
    b[0] = 0xA0; /* the double's uuid of device 0 */
    snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "state file %s/%s.dev: %s", dir, uuid, err);
    int found = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        struct gs_ds_slice *s = &ds.slices[i];
        if (!(s->flags & GS_DS_SLICE_IN_USE) || strcmp(s->grant, "pacer-test")) continue;
        found = 1;
        CHECK(s->share_bp == (uint32_t)share * 100, "published share %u", s->share_bp);
        if (share > 0 && share < 100) {
            CHECK(s->paced == 1 && s->launches > 100, "paced, launches counted (%llu)", (unsigned long long)s->launches);
            CHECK(s->achieved_bp > (share - 3) * 100 && s->achieved_bp < (share + 3) * 100, "published achieved %d bp", s->achieved_bp);
            CHECK(s->throttled_total_ns > 0, "throttled time counted");
        } else {
            CHECK(s->paced == 0, "100 %% is not paced");
        }
    }
    CHECK(found, "slice record present while running");
    if (share > 0 && share < 100) {
        /* a live share change (what gpuslice.node.compute.set_share and the benchmark do): the
         * pacer must follow it within its recompute interval */
        for (int i = 0; i < GS_DS_MAX_SLICES; i++)
            if ((ds.slices[i].flags & GS_DS_SLICE_IN_USE) && !strcmp(ds.slices[i].grant, "pacer-test"))
                __atomic_store_n(&ds.slices[i].share_bp, (uint32_t)(100 - share) * 100u, __ATOMIC_RELAXED);
        run(0.0005, 0.3);
        double moved = run(0.0005, 1.0);
        printf("  live change %d%% -> %d%%: achieved %.2f%%\n", share, 100 - share, moved);
        CHECK(moved > 100 - share - 3 && moved < 100 - share + 3, "after a live change to %d: %.2f", 100 - share, moved);
    }
    gs_devstate_close(&ds);
    gs_pacer_shutdown();
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "reopen");
    int left = 0;
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) left += (ds.procs[i].flags & GS_DS_PROC_IN_USE) != 0;
    CHECK(left == 0, "shutdown gave the process record back (%d left)", left);
    gs_devstate_close(&ds);
    return 0;
}

int main(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/gs-test-pacer-%d", (int)getpid());
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "double: no context\n");
        return 1;
    }
    scenario(dir, 30);
    scenario(dir, 70);
    scenario(dir, 100);
    /* the unpaced path's cost per launch (before + after), which is what a 100 % slice pays */
    {
        char text[512], err[256];
        struct gs_config cfg;
        snprintf(text, sizeof text, "version=1\ncompute=100\ngrant=cost\npriority=0\ndevice_state_dir=%s\n", dir);
        if (gs_config_parse_text(text, strlen(text), &cfg, err, sizeof err) == 0 && gs_pacer_init(&cfg) == 0) {
            gs_pacer_before_launch(0, NULL); /* set-up */
            gs_pacer_after_launch(0, NULL, 0);
            enum { N = 1000000 };
            double t0 = now_s();
            for (int i = 0; i < N; i++) {
                gs_pacer_before_launch(0, NULL);
                gs_pacer_after_launch(0, NULL, 0);
            }
            double ns = (now_s() - t0) / N * 1e9;
            printf("  unpaced path: %.0f ns per launch (this build)\n", ns);
            /* generous for sanitizer builds; a plain -O2 build measures ~20-40 ns */
            CHECK(ns < 1500, "unpaced launch path costs %.0f ns", ns);
            gs_pacer_shutdown();
        } else {
            CHECK(0, "config for the cost check: %s", err);
        }
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    printf("test_pacer: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
