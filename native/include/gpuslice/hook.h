/* How the enforcer hands out its hooks: exported symbols, dlsym on libcuda handles, cuGetProcAddress
 * (src/hooks/dispatch.c). Each hook file defines its hooks and its part of the table from one
 * X-macro table of its own; dispatch.c knows the parts, nobody below the hooks knows dispatch.c. */
#ifndef GPUSLICE_HOOK_H
#define GPUSLICE_HOOK_H
#include "gpuslice/cuda_types.h"
#include "gpuslice/real.h"

/* Our hook for an exported driver/NVML name, or NULL when we do not hook it. */
void *gs_hook_for(const char *name);

/* Hook to hand out for a pointer `real` that the driver returned for `symbol`: ours if `real` is the
 * real version of a function we hook, else `real` unchanged. */
void *gs_hook_for_real(const char *symbol, void *real);

/* Number of hooks served through cuGetProcAddress / dlsym (diagnostics, tests). */
extern unsigned long gs_stat_procaddr_hooked, gs_stat_dlsym_hooked, gs_stat_procaddr_unexported;

/* One hooked symbol: the exported name and our function. Each hook file exports a NULL-terminated
 * table, made with GS_HOOK_ROW from the same X-macro table that defines its hooks; dispatch.c
 * knows the tables (gs_hook_tables). */
struct gs_hook {
    const char *name;
    void *fn;
};
extern const struct gs_hook gs_hooks_memory[], gs_hooks_array[], gs_hooks_vmm[], gs_hooks_pool[],
    gs_hooks_context[], gs_hooks_launch[], gs_hooks_nvml[], gs_hooks_procaddr[], gs_hooks_graph[];
/* The table entry of hook `name`; GS_HOOK_ROW for an X-macro row, which names the hook first,
 * whatever else it carries. */
#define GS_HOOK_ENTRY(name) {#name, (void *)name},
#define GS_HOOK_ROW(name, ...) GS_HOOK_ENTRY(name)

/* Cache the real function `name` (same name as the hook), found with `lookup` (gs_real or
 * gs_real_nvml), in a per-call-site static. Statement expression + typeof: GNU C, accepted by gcc
 * and clang in -std=c11 mode. */
#define GS_REAL_FROM(lookup, name) __extension__({                                      \
    static __typeof__(&name) gs_r_;                                                     \
    __typeof__(&name) gs_f_ = __atomic_load_n(&gs_r_, __ATOMIC_RELAXED);                \
    if (!gs_f_) {                                                                       \
        gs_f_ = (__typeof__(&name))lookup(#name);                                       \
        __atomic_store_n(&gs_r_, gs_f_, __ATOMIC_RELAXED);                              \
    }                                                                                   \
    gs_f_;                                                                              \
})
#define GS_REAL(name) GS_REAL_FROM(gs_real, name)
#define GS_EXPORT __attribute__((visibility("default")))
#endif
