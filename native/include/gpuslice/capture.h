/* The enforcer's own driver calls while the application may be capturing a CUDA graph (src/base/capture.c).
 * While any thread captures in global mode (the default of PyTorch's torch.cuda.graph), "potentially unsafe"
 * calls from every thread of the process -- an event query or elapsed time, a stream or context synchronize --
 * fail and invalidate the capture. The enforcer makes such calls on its own initiative (the pacer's looks at its
 * events, a pool allocation undone at the limit), so it makes them in the calling thread's relaxed mode and sets
 * the thread's own mode back after. A look at an event recorded inside a capture stays forbidden in any mode:
 * the enforcer records none into a capturing stream. */
#ifndef GPUSLICE_CAPTURE_H
#define GPUSLICE_CAPTURE_H
#include <stdint.h>

#include "gpuslice/cuda_types.h"

struct gs_capture_mode {
    int mode; /* the thread's mode before, to set back */
    int set;  /* whether it was changed */
};

/* The calling thread in relaxed mode (a no-op on a thread made relaxed for good, or without the driver call). */
struct gs_capture_mode gs_capture_relax(void);
/* Its own mode back (logs once if the driver refuses). */
void gs_capture_restore(struct gs_capture_mode *m);
/* For a thread of the enforcer's own (the pacer's poller): relaxed once, for the rest of its life. */
void gs_capture_relax_for_good(void);
/* Whether `stream` is being captured, as cuStreamIsCapturing says (CUstreamCaptureStatus: 0 none, 1 active,
 * 2 invalidated); -1 when the driver answers an error (the legacy stream while a blocking stream captures), 0 when
 * it has no such function. Each caller decides what an error means for it. */
int gs_capture_status(CUstream stream);
/* The same, with the capture sequence's id (unique over the process's life) in *id while the status is active: two
 * answers of one id are one capture, not one that ended and another that began between them. Asked with
 * cuStreamGetCaptureInfo_v3 or _v2 (CUDA 12.3+ / 11.3+); without either, the status alone and *id 0. */
int gs_capture_info(CUstream stream, uint64_t *id);
#endif
