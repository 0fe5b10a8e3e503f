/* Shared prologue of the hooks: decide once whether the enforcer is active, and what to do if not;
 * the accounting macros every hook file uses; and what hook files offer each other. */
#ifndef GPUSLICE_HOOKS_COMMON_H
#define GPUSLICE_HOOKS_COMMON_H
#include "gpuslice/hook.h"
#include "gpuslice/memory.h"
#include "gpuslice/state.h"

/* `real` must be in scope. Not in a slice (or fail-open): pass through. Broken config: refuse. */
#define GS_PROLOGUE(passthrough_call)                                          \
    do {                                                                       \
        if (!real) return CUDA_ERROR_NOT_FOUND;                                \
        int gs_st_ = gs_state_now();                                           \
        if (gs_st_ == GS_STATE_BROKEN) return CUDA_ERROR_NOT_INITIALIZED;      \
        if (gs_st_ != GS_STATE_ACTIVE) return (passthrough_call);              \
    } while (0)

/* Define hook `name` with `params`: its real function, the prologue, then `what(real args)` -- a
 * statement (a macro of the hook file) that sees `real` and the parameters and returns. A hook
 * file's X-macro table of rows X(name, parameters, arguments, what) defines all its hooks with
 * TABLE(GS_HOOK_DEFINE) and its part of the dispatch table with TABLE(GS_HOOK_ROW), so the versions
 * of one function are one row each, never copies. */
#define GS_HOOK_DEFINE(name, params, args, what)                               \
    GS_EXPORT CUresult name params                                             \
    {                                                                          \
        __typeof__(&name) real = GS_REAL(name);                                \
        GS_PROLOGUE(real args);                                                \
        what(real args);                                                       \
    }

/* An allocation with no current context fails in the driver; account it on no device. */
#define ORD_OR_PASS(call)                  \
    int ord = gs_current_ordinal();        \
    if (ord < 0) return (call)

/* Reserve `bytes` on `ord`, run `call`; on success record (kind, key) -> bytes, else give back. A
 * driver refusal of what the slice had room for (the device is full) may wait and try `call` again
 * (oom_policy=wait, src/accounting/oomwait.c). */
#define GS_ACCOUNTED(what, ord, bytes, kind, keyexpr, call)                    \
    do {                                                                       \
        CUresult gs_rr_ = gs_mem_reserve((ord), (bytes), (what));              \
        if (gs_rr_ == GS_PASS_UNCOUNTED) return (call);                        \
        if (gs_rr_ != CUDA_SUCCESS) return gs_rr_;                             \
        gs_rr_ = (call);                                                       \
        if (gs_rr_ == CUDA_ERROR_OUT_OF_MEMORY) {                              \
            struct gs_oom_wait gs_w_ = GS_OOM_WAIT_INIT;                       \
            while (gs_rr_ == CUDA_ERROR_OUT_OF_MEMORY && gs_mem_device_full_wait((ord), (bytes), &gs_w_)) \
                gs_rr_ = (call);                                               \
            gs_mem_wait_end(&gs_w_);                                           \
        }                                                                      \
        if (gs_rr_ == CUDA_SUCCESS) gs_track_add((kind), (uint64_t)(keyexpr), (ord), (bytes)); \
        else gs_mem_release((ord), (bytes));                                   \
        return gs_rr_;                                                         \
    } while (0)

/* Forget (kind, key) before `call` frees it (so that a concurrent allocation that gets the same
 * address cannot be confused with it), give the bytes back on success, re-record on failure. */
#define GS_FREED(kind, keyexpr, call)                                          \
    do {                                                                       \
        int gs_o_;                                                             \
        uint64_t gs_b_;                                                        \
        int gs_had_ = gs_track_take((kind), (uint64_t)(keyexpr), &gs_o_, &gs_b_); \
        CUresult gs_fr_ = (call);                                              \
        if (gs_had_) {                                                         \
            if (gs_fr_ == CUDA_SUCCESS) gs_mem_release(gs_o_, gs_b_);          \
            else gs_track_add((kind), (uint64_t)(keyexpr), gs_o_, gs_b_);      \
        }                                                                      \
        return gs_fr_;                                                         \
    } while (0)

/* Stream-ordered pools (src/hooks/cuda_pool.c), for the other hooks. gs_pool_free_sync frees ptr
 * with the real cuMemFree-like `real` if ptr is a pool allocation we track (cudaFree of
 * cudaMallocAsync memory), else returns GS_POOL_NOT_MINE. gs_pool_forget_device gives back and
 * forgets the pools of a device whose primary context went. gs_pool_capture_ended brings every pool's
 * charge (and the current pool of the capturing stream's device) in line once a capture ended (its allocations
 * and frees read no pool while it ran). */
/* CUDA graph memory (src/hooks/cuda_graph.c): the launch hooks report each graph launch, whose first
 * launch may back the graph's memory nodes with device memory. */
void gs_graph_launched(CUgraphExec exec, CUstream s, CUresult r);
/* A capture ended on a stream of this device (a stream-ordered allocation captured there is backed on it): its
 * graph memory is read there too. */
void gs_graph_watch_device(int ordinal);
/* The device's primary context went: no more reads there for captured allocations (gs_graph_watch_device). */
void gs_graph_forget_device(int ordinal);
#define GS_POOL_NOT_MINE (-2)
CUresult gs_pool_free_sync(CUdeviceptr ptr, void *real);
void gs_pool_forget_device(int ordinal);
void gs_pool_capture_ended(int ordinal);
/* The device of a stream's context (the current one for the legacy and per-thread streams); -1 without one. */
int gs_stream_device(CUstream s);
#endif
