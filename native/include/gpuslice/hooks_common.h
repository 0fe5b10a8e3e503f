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

/* An allocation with no current context fails in the driver; account it on no device. */
#define ORD_OR_PASS(call)                  \
    int ord = gs_current_ordinal();        \
    if (ord < 0) return (call)

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

/* Pitched allocation shared by cuMemAllocPitch_v2 and the legacy cuMemAllocPitch: reserve the
 * estimate, `call(args, &ptr, &pitch)`, settle to pitch x height (`fr(args, ptr)` frees on refusal). */
CUresult gs_pitched(int ord, uint64_t width, uint64_t height, CUresult (*call)(void *, uint64_t *, uint64_t *),
                    void *args, CUresult (*fr)(void *, uint64_t));
/* Memory queries: clamp the driver's answer for the current device / device dev to the slice. */
void gs_clamp_mem_info(uint64_t *free_b, uint64_t *total_b);
void gs_clamp_total_mem(int dev, uint64_t *bytes);
/* Bytes of an array from its descriptor fields (element size x channels x extent; mip levels). */
uint64_t gs_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels);
uint64_t gs_mipmapped_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned flags,
                            unsigned levels);
#endif
