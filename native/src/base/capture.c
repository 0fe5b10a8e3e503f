/* The calling thread's stream-capture mode around the enforcer's own driver calls (gpuslice/capture.h). */
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
