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

#define LAUNCH_KERNEL(name)                                                                        \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,   \
                            void **extra)                                                          \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                     \
        PACED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                        \
    }
LAUNCH_KERNEL(cuLaunchKernel)
LAUNCH_KERNEL(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name)                                                                            \
    GS_EXPORT CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)  \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(cfg, f, params, extra));                                                  \
        PACED(cfg ? cfg->hStream : NULL, real(cfg, f, params, extra));                             \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name)                                                                          \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)   \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                            \
        PACED(s, real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                               \
    }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

#define GRAPH_LAUNCH(name)                                                                         \
    GS_EXPORT CUresult name(CUgraphExec g, CUstream s)                                             \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(g, s));                                                                   \
        PACED(s, real(g, s));                                                                      \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

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
