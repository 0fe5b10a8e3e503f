/* gpuslice pacer: measure what a timing-event pair adds to its kernel (see gpuslice/pairbias.h). */
#include "gpuslice/pairbias.h"
#include "gpuslice/capture.h"
#include "gpuslice/cuda_types.h"
#include "gpuslice/real.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void *PBev;
typedef void *PBmod;
typedef CUresult (*fn_mod_load)(PBmod *, const void *);
typedef CUresult (*fn_mod_unload)(PBmod);
typedef CUresult (*fn_mod_fn)(CUfunction *, PBmod, const char *);
typedef CUresult (*fn_stream_create)(CUstream *, unsigned);
typedef CUresult (*fn_stream_destroy)(CUstream);
typedef CUresult (*fn_ev_create)(PBev *, unsigned);
typedef CUresult (*fn_ev_destroy)(PBev);
typedef CUresult (*fn_ev_record)(PBev, CUstream);
typedef CUresult (*fn_ev_query)(PBev);
typedef CUresult (*fn_ev_elapsed)(float *, PBev, PBev);
typedef CUresult (*fn_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

/* Two kernels, written in PTX so that no CUDA toolkit is needed to build the enforcer: the driver
 * compiles them for whatever GPU it runs (sm_75 is the oldest architecture CUDA 13 still supports). */
static const char PTX[] =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry gs_pb_spin(.param .u64 cycles)\n{\n"
    "  .reg .pred p;\n  .reg .u64 t0, t1, d, c;\n"
    "  ld.param.u64 c, [cycles];\n  mov.u64 t0, %clock64;\n"
    "SPIN:\n  mov.u64 t1, %clock64;\n  sub.u64 d, t1, t0;\n  setp.lt.u64 p, d, c;\n  @p bra SPIN;\n  ret;\n}\n"
    ".visible .entry gs_pb_nop()\n{\n  ret;\n}\n";

#define NEV (2 + 2 * GS_PB_KERNELS)
/* 4 M cycles: 2-4 ms at 1-2 GHz, many times what queueing the 98 calls below takes */
#define HOLD_CYCLES 4000000ULL

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int64_t gs_pair_bias_from(int64_t marginal_total, const int64_t pairs[GS_PB_KERNELS])
{
    int64_t s[GS_PB_KERNELS];
    for (int i = 0; i < GS_PB_KERNELS; i++) s[i] = pairs[i];
    qsort(s, GS_PB_KERNELS, sizeof s[0], cmp64);
    int keep = GS_PB_KERNELS - GS_PB_KERNELS / 4;
    int64_t sum = 0;
    for (int i = 0; i < keep; i++) sum += s[i];
    int64_t bias = sum / keep - marginal_total / GS_PB_KERNELS;
    if (bias < 0) return 0;
    return bias > GS_PB_MAX_NS ? -1 : bias;
}

struct pb_fns {
    fn_mod_load load;
    fn_mod_unload unload;
    fn_mod_fn get;
    fn_stream_create sc;
    fn_stream_destroy sd;
    fn_ev_create ec;
    fn_ev_destroy ed;
    fn_ev_record er;
    fn_ev_query eq;
    fn_ev_elapsed el;
    fn_launch launch;
};

static int fns(struct pb_fns *f)
{
    f->load = (fn_mod_load)gs_real("cuModuleLoadData");
    f->unload = (fn_mod_unload)gs_real("cuModuleUnload");
    f->get = (fn_mod_fn)gs_real("cuModuleGetFunction");
    f->sc = (fn_stream_create)gs_real("cuStreamCreate");
    f->sd = (fn_stream_destroy)gs_real("cuStreamDestroy_v2");
    f->ec = (fn_ev_create)gs_real("cuEventCreate");
    f->ed = (fn_ev_destroy)gs_real("cuEventDestroy_v2");
    f->er = (fn_ev_record)gs_real("cuEventRecord");
    f->eq = (fn_ev_query)gs_real("cuEventQuery");
    f->el = (fn_ev_elapsed)gs_real("cuEventElapsedTime");
    f->launch = (fn_launch)gs_real("cuLaunchKernel");
    return f->load && f->unload && f->get && f->sc && f->sd && f->ec && f->ed && f->er && f->eq && f->el && f->launch
               ? 0
               : -1;
}

static int64_t ns_between(const struct pb_fns *f, PBev a, PBev b)
{
    float ms = 0;
    return f->el(&ms, a, b) == 0 ? (int64_t)(ms * 1e6f) : -1;
}

/* Queue the measurement behind the hold; 0, or -1 (a call failed: why says which). */
static int queue_all(const struct pb_fns *f, CUstream st, CUfunction spin, CUfunction nop, PBev *ev, char *why,
                     unsigned long whylen)
{
    unsigned long long cycles = HOLD_CYCLES;
    void *args[] = {&cycles};
    if (f->launch(spin, 1, 1, 1, 1, 1, 1, 0, st, args, NULL) != 0) {
        snprintf(why, whylen, "the hold kernel did not launch");
        return -1;
    }
    int bad = f->er(ev[0], st) != 0;
    for (int i = 0; i < GS_PB_KERNELS; i++) bad |= f->launch(nop, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL) != 0;
    bad |= f->er(ev[1], st) != 0;
    for (int i = 0; i < GS_PB_KERNELS; i++) {
        bad |= f->er(ev[2 + 2 * i], st) != 0;
        bad |= f->launch(nop, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL) != 0;
        bad |= f->er(ev[3 + 2 * i], st) != 0;
    }
    if (bad) snprintf(why, whylen, "a record or launch failed");
    return bad ? -1 : 0;
}

/* Until `e` is done, at most GS_PB_WAIT_NS: 0 done, -1 not (an error, or still running at the deadline). Never
 * cuEventSynchronize: the application's first launch waits here, and a GPU busy with other contexts (or
 * at its idle clock: the hold is 4 M cycles, ~12 ms at 345 MHz) must not hold it for long. */
#ifndef GS_PB_WAIT_NS /* a build with a shorter cut gives up with its kernels queued (bench/gpu/pairbias_checks.py) */
#define GS_PB_WAIT_NS 100000000LL
#endif
static int wait_done(const struct pb_fns *f, PBev e)
{
    struct timespec t0, now, nap = {0, 20000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        CUresult r = f->eq(e);
        if (r == 0) return 0;
        if (r != CUDA_ERROR_NOT_READY) return -1; /* the only "not yet" */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000000000LL + (now.tv_nsec - t0.tv_nsec) > GS_PB_WAIT_NS) return -1;
        nanosleep(&nap, NULL);
    }
}

/* *pending: work of ours may still be queued (the module must then stay loaded: unloading a module whose
 * kernels are queued is not documented as safe; the stream and events may go, the driver frees them when
 * their work completes). */
static int64_t measure_on(const struct pb_fns *f, CUstream st, CUfunction spin, CUfunction nop, PBev *ev, char *why,
                          unsigned long whylen, int *pending)
{
    /* once first: the first launch of a module's kernel loads it (not what a pair costs) */
    *pending = 1;
    if (f->launch(nop, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL) != 0 || f->er(ev[0], st) != 0 || wait_done(f, ev[0]) != 0) {
        snprintf(why, whylen, "the first launch failed or did not finish within 100 ms");
        return -1;
    }
    if (queue_all(f, st, spin, nop, ev, why, whylen) != 0) return -1;
    /* still held: every record was queued before the GPU reached it (none waited for the CPU) */
    int held = f->eq(ev[0]) == CUDA_ERROR_NOT_READY;
    if (wait_done(f, ev[NEV - 1]) != 0) {
        snprintf(why, whylen, "the measurement did not complete within 100 ms");
        return -1;
    }
    *pending = 0;
    if (!held) {
        snprintf(why, whylen, "the hold ended before the measurement was queued (a busy CPU, or no real GPU)");
        return -1;
    }
    int64_t marginal = ns_between(f, ev[0], ev[1]), pairs[GS_PB_KERNELS];
    for (int i = 0; i < GS_PB_KERNELS; i++) {
        pairs[i] = ns_between(f, ev[2 + 2 * i], ev[3 + 2 * i]);
        if (pairs[i] < 0 || marginal < 0) {
            snprintf(why, whylen, "an elapsed time could not be read");
            return -1;
        }
    }
    int64_t bias = gs_pair_bias_from(marginal, pairs);
    if (bias < 0) snprintf(why, whylen, "a bias above %lld ns was measured (a disturbed measurement)", GS_PB_MAX_NS);
    return bias;
}

/* Load the kernels, measure on a private stream, free what can be freed. */
static int64_t measure_module(const struct pb_fns *f, char *why, unsigned long whylen)
{
    PBmod mod = NULL;
    CUfunction spin = NULL, nop = NULL;
    if (f->load(&mod, PTX) != 0 || f->get(&spin, mod, "gs_pb_spin") != 0 || f->get(&nop, mod, "gs_pb_nop") != 0) {
        if (mod) f->unload(mod);
        snprintf(why, whylen, "the measuring kernels did not load");
        return -1;
    }
    CUstream st = NULL;
    PBev ev[NEV] = {0};
    int64_t bias = -1;
    int n = 0, pending = 0;
    if (f->sc(&st, 1 /* CU_STREAM_NON_BLOCKING: never waits for the legacy stream's work */) != 0) {
        snprintf(why, whylen, "no stream");
        goto out;
    }
    for (; n < NEV; n++)
        if (f->ec(&ev[n], 0) != 0) {
            snprintf(why, whylen, "no timing events");
            goto out;
        }
    bias = measure_on(f, st, spin, nop, ev, why, whylen, &pending);
out:
    for (int i = 0; i < n; i++) f->ed(ev[i]);
    if (st) f->sd(st);
    if (!pending) f->unload(mod); /* else left loaded (a few KB, once): its kernels may still be queued */
    return bias;
}

int64_t gs_pair_bias_measure(char *why, unsigned long whylen)
{
    struct pb_fns f;
    if (fns(&f) != 0) {
        snprintf(why, whylen, "the driver lacks a function the measurement needs");
        return -1;
    }
    /* Relaxed capture mode on this thread while it measures (gpuslice/capture.h): a CUDA graph being captured
     * (this thread's own launch may be its first, or another thread's in global mode) must not see the module
     * load and the waits below as unsafe calls, which would invalidate the user's capture. */
    struct gs_capture_mode m = gs_capture_relax();
    if (!m.set) {
        snprintf(why, whylen, "the capture mode could not be set");
        return -1;
    }
    int64_t bias = measure_module(&f, why, whylen);
    gs_capture_restore(&m);
    return bias;
}
