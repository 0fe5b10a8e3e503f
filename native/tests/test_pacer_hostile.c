/* pacer.c against a neighbour that keeps rewriting this slice's record in the shared device state
 * (credit at -2^40 ns, share and rate at 1 basis point: values no gpuslice writer produces). Before the
 * hold cap such a launch waited forever (the credit never refilled); now a paced launch is held at most
 * what its own configured share can owe (pacer.c hold_cap_ns: 90 % -> 3.2 s), then goes, counted.
 * Over the CPU driver double, under ASan/UBSan; alarm() turns a hang into a failure. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
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
#include "double/double_common.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static struct gs_devstate ds;
static int victim = -1, stop;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "FAIL: a launch was held forever by a rewritten device state (alarm)\n";
    if (write(2, m, sizeof m - 1)) _exit(3);
    _exit(3);
}

static void *scribbler(void *arg)
{
    (void)arg;
    struct gs_ds_slice *s = &ds.slices[victim];
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&s->credit_ns, -(1LL << 40), __ATOMIC_RELAXED); /* 18 min of debt: forever at 1 bp */
        __atomic_store_n(&s->share_bp, 1u, __ATOMIC_RELAXED);
        __atomic_store_n(&s->rate_bp, 1u, __ATOMIC_RELAXED);
        usleep(200);
    }
    return NULL;
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(60);
    char dir[64], text[256], err[256], uuid[64];
    snprintf(dir, sizeof dir, "/tmp/gs-pacer-hostile-%d", (int)getpid());
    snprintf(text, sizeof text, "version=1\ncompute=90\nmode=hard\ngrant=victim\ndevice_state_dir=%s\n", dir);
    struct gs_config cfg;
    CUcontext c;
    if (gs_config_parse_text(text, strlen(text), &cfg, err, sizeof err) != 0 || gs_pacer_init(&cfg) != 0 || cuInit(0) ||
        cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "set-up failed: %s\n", err);
        return 1;
    }
    for (int i = 0; i < 32; i++) { /* joins the state, learns the shape */
        gs_pacer_before_launch(0, NULL, 7);
        gs_pacer_after_launch(0, NULL, 0);
    }
    dbl_uuid_string(0, uuid); /* the double's device 0 */
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "open the state as the neighbour: %s", err);
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if ((ds.slices[i].flags & GS_DS_SLICE_IN_USE) && strcmp(ds.slices[i].grant, "victim") == 0) victim = i;
    CHECK(victim >= 0, "the victim's slice record");
    if (victim < 0) return 1;
    pthread_t t;
    pthread_create(&t, NULL, scribbler, NULL);
    usleep(5000);
    double cap = (double)(GS_CTL_DEBT_MAX_NS + GS_CTL_LOOKAHEAD_NS) / 0.9e9 + 1.0;
    double t0 = now_s();
    gs_pacer_before_launch(0, NULL, 7);
    gs_pacer_after_launch(0, NULL, 0);
    double held = now_s() - t0;
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    printf("  a launch beside a scribbling neighbour was held %.2f s (cap %.2f s)\n", held, cap);
    CHECK(held < cap + 3.0, "held %.2f s, the cap is %.2f s", held, cap);
    CHECK(gs_pacer_held_too_long() == 1, "counted once: %llu", (unsigned long long)gs_pacer_held_too_long());
    /* the neighbour stopped; the share it wrote stays (a live share change is anyone's to make: what
     * set_live does for `gpuslice resize`) until it is set again, as here; the credit it wrote is brought
     * back into range at the next lock, and launches are paced again, not held */
    __atomic_store_n(&ds.slices[victim].share_bp, 9000u, __ATOMIC_RELAXED);
    t0 = now_s();
    for (int i = 0; i < 20; i++) {
        gs_pacer_before_launch(0, NULL, 7);
        gs_pacer_after_launch(0, NULL, 0);
    }
    CHECK(now_s() - t0 < cap, "after the neighbour stopped, 20 launches took %.2f s", now_s() - t0);
    CHECK(ds.slices[victim].credit_ns >= -GS_CTL_DEBT_MAX_NS, "the credit is back in range: %lld",
          (long long)ds.slices[victim].credit_ns);
    gs_devstate_close(&ds);
    gs_pacer_shutdown();
    char path[160];
    snprintf(path, sizeof path, "%s/%s.dev", dir, uuid); /* the folder holds this one file */
    unlink(path);
    rmdir(dir);
    printf("test_pacer_hostile: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
