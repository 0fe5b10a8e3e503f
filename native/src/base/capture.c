/* The calling thread's stream-capture mode around the enforcer's own driver calls (gpuslice/capture.h). */
#include <pthread.h>

#include "gpuslice/capture.h"
#include "gpuslice/cuda_types.h"
#include "gpuslice/log.h"
#include "gpuslice/real.h"

typedef CUresult (*fn_exchange)(int *);

static _Thread_local int tl_relaxed_for_good;

static fn_exchange exchange(void)
{
    static fn_exchange fn;
    fn_exchange f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (fn_exchange)gs_real("cuThreadExchangeStreamCaptureMode"); /* CUDA 10.1+; NULL: nothing to do */
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

struct gs_capture_mode gs_capture_relax(void)
{
    struct gs_capture_mode m = {CU_STREAM_CAPTURE_MODE_RELAXED, 0};
    fn_exchange f = tl_relaxed_for_good ? NULL : exchange();
    m.set = f && f(&m.mode) == CUDA_SUCCESS;
    return m;
}

void gs_capture_restore(struct gs_capture_mode *m)
{
    static int warned;
    fn_exchange f = exchange();
    if (!m->set || !f || f(&m->mode) == CUDA_SUCCESS) return;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        GS_WARN("a thread's CUDA graph capture mode could not be set back after one of the enforcer's calls; it "
                "stays relaxed");
}

int gs_capture_status(CUstream stream)
{
    static CUresult (*fn)(CUstream, int *);
    CUresult (*f)(CUstream, int *) = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (CUresult(*)(CUstream, int *))gs_real("cuStreamIsCapturing");
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    int st = 0;
    if (!f) return 0;
    return f(stream, &st) == CUDA_SUCCESS ? st : -1;
}

void gs_capture_relax_for_good(void)
{
    fn_exchange f = exchange();
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tl_relaxed_for_good = f && f(&mode) == CUDA_SUCCESS;
}

typedef CUresult (*fn_info_v3)(CUstream, int *, uint64_t *, void *, void *, void *, size_t *);
typedef CUresult (*fn_info_v2)(CUstream, int *, uint64_t *, void *, void *, size_t *);
static fn_info_v3 g_info_v3;
static fn_info_v2 g_info_v2;
static pthread_once_t g_info_once = PTHREAD_ONCE_INIT;

static void find_info(void)
{
    g_info_v3 = (fn_info_v3)gs_real("cuStreamGetCaptureInfo_v3");
    if (!g_info_v3) g_info_v2 = (fn_info_v2)gs_real("cuStreamGetCaptureInfo_v2");
}

int gs_capture_info(CUstream stream, uint64_t *id)
{
    pthread_once(&g_info_once, find_info);
    *id = 0;
    if (!g_info_v3 && !g_info_v2) return gs_capture_status(stream);
    int st = 0;
    uint64_t got = 0;
    CUresult r = g_info_v3 ? g_info_v3(stream, &st, &got, NULL, NULL, NULL, NULL)
                           : g_info_v2(stream, &st, &got, NULL, NULL, NULL);
    if (r != CUDA_SUCCESS) return -1;
    if (st == 1) *id = got;
    return st;
}
