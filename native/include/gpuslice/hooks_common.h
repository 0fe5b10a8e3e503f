/* Shared prologue of the hooks: decide once whether the enforcer is active, and what to do if not. */
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

/* Reserve `bytes` on `ord`, run `call`; on success record (kind, key) -> bytes, else give back. */
#define GS_ACCOUNTED(what, ord, bytes, kind, keyexpr, call)                    \
    do {                                                                       \
        CUresult gs_rr_ = gs_mem_reserve((ord), (bytes), (what));              \
        if (gs_rr_ == GS_PASS_UNCOUNTED) return (call);                        \
        if (gs_rr_ != CUDA_SUCCESS) return gs_rr_;                             \
        gs_rr_ = (call);                                                       \
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
#endif
