/* Interception machinery: how the enforcer finds the real driver / NVML functions and how it hands
 * out its own hooks (exported symbols, dlsym on libcuda handles, cuGetProcAddress). */
#ifndef GPUSLICE_HOOK_H
#define GPUSLICE_HOOK_H
#include "gpuslice/cuda_types.h"

/* The real (unhooked) driver function `name` from libcuda.so.1, or NULL. Cached; thread-safe.
 * This is what the pacer uses for cuCtxGetDevice, cuEventCreate, cuStreamQuery, ... */
void *gs_real(const char *name);
/* Same for NVML (libnvidia-ml.so.1). */
void *gs_real_nvml(const char *name);

/* The glibc dlsym, never our wrapper. */
void *gs_libc_dlsym(void *handle, const char *name);

/* Our hook for an exported driver/NVML name, or NULL when we do not hook it. */
void *gs_hook_for(const char *name);

/* Hook to hand out for a pointer `real` that the driver returned for `symbol`: ours if `real` is the
 * real version of a function we hook, else `real` unchanged. */
void *gs_hook_for_real(const char *symbol, void *real);

/* Enforcer state, decided once by gs_init(). */
enum gs_state { GS_STATE_UNINIT = 0, GS_STATE_PASSTHROUGH = 1, GS_STATE_ACTIVE = 2, GS_STATE_BROKEN = 3 };
/* Load config, open the region, start the pacer. Idempotent, cheap after the first call. */
int gs_init(void);
/* Number of hooks served through cuGetProcAddress / dlsym (diagnostics, tests). */
extern unsigned long gs_stat_procaddr_hooked, gs_stat_dlsym_hooked, gs_stat_procaddr_unexported;
#endif

/* One hooked symbol: the exported name and our function. Each hook file exports a NULL-terminated
 * table; hook.c knows the tables (see gs_hook_tables in hook.c). */
struct gs_hook {
    const char *name;
    void *fn;
};
extern const struct gs_hook gs_hooks_memory[], gs_hooks_array[], gs_hooks_vmm[], gs_hooks_pool[], gs_hooks_legacy[],
    gs_hooks_context[], gs_hooks_launch[], gs_hooks_nvml[], gs_hooks_procaddr[];

/* Cache the real function `name` (same name as the hook) in a per-call-site static. Statement
 * expression + typeof: GNU C, accepted by gcc and clang in -std=c11 mode. */
#define GS_REAL(name) __extension__({                                                   \
    static __typeof__(&name) gs_r_;                                                     \
    __typeof__(&name) gs_f_ = __atomic_load_n(&gs_r_, __ATOMIC_RELAXED);                \
    if (!gs_f_) {                                                                       \
        gs_f_ = (__typeof__(&name))gs_real(#name);                                      \
        __atomic_store_n(&gs_r_, gs_f_, __ATOMIC_RELAXED);                              \
    }                                                                                   \
    gs_f_;                                                                              \
})
#define GS_EXPORT __attribute__((visibility("default")))
