/* Launch hooks: hand every kernel/graph launch to the compute pacer (pacer.c, owned by the compute
 * part) before and after the real launch. The device passed is the current context's ordinal. */
#define _GNU_SOURCE
#include "gpuslice/hooks_common.h"
#include "gpuslice/pacer.h"

#define PACED(stream, call)                                                    \
    do {                                                                       \
        int dev_ = gs_current_ordinal();                                       \
        gs_pacer_before_launch(dev_, (void *)(stream));                        \
        CUresult r_ = (call);                                                  \
        gs_pacer_after_launch(dev_, (void *)(stream), r_);                     \
        return r_;                                                             \
    } while (0)

/* SM: the stream the pacer is told about. A _ptsz launch on stream 0 runs on the calling thread's
 * per-thread default stream, not the legacy one: GS_PTSZ_STREAM names it (CU_STREAM_PER_THREAD). */
#define AS_IS(s) ((void *)(s))

#define LAUNCH_KERNEL(name, SM)                                                                    \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,   \
                            void **extra)                                                          \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                     \
        PACED(SM(s), real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                    \
    }
LAUNCH_KERNEL(cuLaunchKernel, AS_IS)
LAUNCH_KERNEL(cuLaunchKernel_ptsz, GS_PTSZ_STREAM)

#define LAUNCH_EX(name, SM)                                                                        \
    GS_EXPORT CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)  \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(cfg, f, params, extra));                                                  \
        PACED(SM(cfg ? cfg->hStream : NULL), real(cfg, f, params, extra));                         \
    }
LAUNCH_EX(cuLaunchKernelEx, AS_IS)
LAUNCH_EX(cuLaunchKernelEx_ptsz, GS_PTSZ_STREAM)

#define LAUNCH_COOP(name, SM)                                                                      \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)   \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                            \
        PACED(SM(s), real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                           \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel, AS_IS)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz, GS_PTSZ_STREAM)

#define GRAPH_LAUNCH(name, SM)                                                                     \
    GS_EXPORT CUresult name(CUgraphExec g, CUstream s)                                             \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(g, s));                                                                   \
        PACED(SM(s), real(g, s));                                                                  \
    }
GRAPH_LAUNCH(cuGraphLaunch, AS_IS)
GRAPH_LAUNCH(cuGraphLaunch_ptsz, GS_PTSZ_STREAM)

const struct gs_hook gs_hooks_launch[] = {
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuGraphLaunch", (void *)cuGraphLaunch},
    {"cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz},
    {0, 0},
};
