/* Memory accounting: reserve against the slice's limit in the region before the driver allocates,
 * give back on failure or free; and the per-process table of live allocations (pointer/handle ->
 * size, device) so frees know what to give back. */
#ifndef GPUSLICE_MEMORY_H
#define GPUSLICE_MEMORY_H
#include <stdint.h>
#include "gpuslice/cuda_types.h"

enum gs_alloc_kind { GS_K_DPTR = 1, GS_K_HANDLE = 2, GS_K_ARRAY = 3, GS_K_MIPMAP = 4, GS_K_CTX = 5 };

/* Region device index for a CUDA ordinal (cached), or -1 (then the allocation is outside the slice). */
int gs_mem_dev_index(int ordinal);
/* Ordinal of the current context's device, or -1. */
int gs_current_ordinal(void);

/* gs_mem_reserve's answer when accounting itself failed and the slice says fail_open=1: call the
 * driver, but do not track (nothing was counted). */
#define GS_PASS_UNCOUNTED (-1)

/* Reserve bytes on ordinal. CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY past the limit (after
 * reclaiming dead processes once; counts the refusal; applies oom_policy=kill). */
CUresult gs_mem_reserve(int ordinal, uint64_t bytes, const char *what);
void gs_mem_release(int ordinal, uint64_t bytes);
/* Context accounting: adds/removes the configured per-context overhead and the context count. */
CUresult gs_mem_ctx_add(int ordinal);
void gs_mem_ctx_remove(int ordinal);

/* Live allocations of this process. */
void gs_track_add(int kind, uint64_t key, int ordinal, uint64_t bytes);
/* 1 and fills ordinal/bytes if found (and removes it), else 0. */
int gs_track_take(int kind, uint64_t key, int *ordinal, uint64_t *bytes);
/* Forget (and give back) every allocation made in context ctx: the driver freed them with it. */
void gs_track_drop_ctx(void *ctx);
/* Limit and slice usage for ordinal (used includes contexts). 0 on success, -1 if not in slice. */
int gs_mem_query(int ordinal, uint64_t *limit, uint64_t *used);
int gs_mem_query_uuid(const char *uuid, uint64_t *limit, uint64_t *used);
/* Pid -> bytes this slice accounts for that process on the region device of uuid; 0 if not ours. */
int gs_mem_proc_usage(const char *uuid, uint32_t pid, uint64_t *bytes);

/* Called from gs_init / fork child. */
int gs_mem_init(void);
void gs_mem_after_fork_child(void);
void gs_ctx_after_fork_child(void);
/* Format a CUuuid as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
void gs_format_uuid(const CUuuid *u, char out[64]);
#endif
