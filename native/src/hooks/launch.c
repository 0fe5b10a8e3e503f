/* Launch hooks: hand every kernel/graph launch to the compute pacer (src/pacing/, owned by the
 * compute part) before and after the real launch; a graph launch also goes to the graph memory books
 * (src/hooks/cuda_graph.c). The device passed is the current context's ordinal;
 * the key names the launch's kernel shape (function, grid, block, shared memory; a graph by its
 * executable), whose cost the pacer learns (costmodel.h). */
#define _GNU_SOURCE
#include "gpuslice/costmodel.h"
#include "gpuslice/hooks_common.h"
#include "gpuslice/pacer.h"

#define PACED(stream, key, call)                                               \
    do {                                                                       \
        int dev_ = gs_current_ordinal();                                       \
        gs_pacer_before_launch(dev_, (void *)(stream), (key));                 \
        CUresult r_ = (call);                                                  \
        gs_pacer_after_launch(dev_, (void *)(stream), r_);                     \
        return r_;                                                             \
    } while (0)

/* Every launch entry point, each next to its per-thread-stream twin:
 *   X(name, generator, SM) -- SM maps the launch's stream to the one the pacer is told about. A
 * _ptsz launch on stream 0 runs on the calling thread's per-thread default stream, not the legacy
 * one: GS_PTSZ_STREAM names it (CU_STREAM_PER_THREAD). */
#define LAUNCH_HOOKS(X)                                                                            \
    X(cuLaunchKernel, LAUNCH_KERNEL, AS_IS)                                                        \
    X(cuLaunchKernel_ptsz, LAUNCH_KERNEL, GS_PTSZ_STREAM)                                          \
    X(cuLaunchKernelEx, LAUNCH_EX, AS_IS)                                                          \
    X(cuLaunchKernelEx_ptsz, LAUNCH_EX, GS_PTSZ_STREAM)                                            \
    X(cuLaunchCooperativeKernel, LAUNCH_COOP, AS_IS)                                               \
    X(cuLaunchCooperativeKernel_ptsz, LAUNCH_COOP, GS_PTSZ_STREAM)                                 \
    X(cuGraphLaunch, GRAPH_LAUNCH, AS_IS)                                                          \
    X(cuGraphLaunch_ptsz, GRAPH_LAUNCH, GS_PTSZ_STREAM)
#define AS_IS(s) ((void *)(s))

#define LAUNCH_KERNEL(name, SM)                                                                    \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,   \
                            void **extra)                                                          \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                     \
        PACED(SM(s), gs_cost_key(f, gx, gy, gz, bx, by, bz, shmem),                                 \
              real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));                           \
    }

#define LAUNCH_EX(name, SM)                                                                        \
    GS_EXPORT CUresult name(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)  \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(cfg, f, params, extra));                                                  \
        PACED(SM(cfg ? cfg->hStream : NULL),                                                       \
              cfg ? gs_cost_key(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX,          \
                                cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes)                 \
                  : gs_cost_key(f, 0, 0, 0, 0, 0, 0, 0),                                           \
              real(cfg, f, params, extra));                                                        \
    }

#define LAUNCH_COOP(name, SM)                                                                      \
    GS_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,      \
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)   \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                            \
        PACED(SM(s), gs_cost_key(f, gx, gy, gz, bx, by, bz, shmem),                                 \
              real(f, gx, gy, gz, bx, by, bz, shmem, s, params));                                  \
    }

#define GRAPH_LAUNCH(name, SM)                                                                     \
    GS_EXPORT CUresult name(CUgraphExec g, CUstream s)                                             \
    {                                                                                              \
        __typeof__(&name) real = GS_REAL(name);                                                    \
        GS_PROLOGUE(real(g, s));                                                                   \
        PACED(SM(s), gs_cost_key(g, 0, 0, 0, 0, 0, 0, 1), gs_graph_counted(g, SM(s), real(g, s))); \
    }

/* A graph's first launch may back its memory nodes: cuda_graph.c counts them. */
static inline CUresult gs_graph_counted(CUgraphExec g, void *stream, CUresult r)
{
    gs_graph_launched(g, (CUstream)stream, r);
    return r;
}

#define LAUNCH_HOOK(name, generator, SM) generator(name, SM)
LAUNCH_HOOKS(LAUNCH_HOOK)

const struct gs_hook gs_hooks_launch[] = {LAUNCH_HOOKS(GS_HOOK_ROW){0, 0}};
