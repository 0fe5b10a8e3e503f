/* The real driver and NVML functions, found without going through our own hooks. Everything that
 * calls the driver itself -- the hooks, the accounting, the pacer -- gets its functions here; this
 * file depends on nothing else of the enforcer (src/base/real.c). */
#ifndef GPUSLICE_REAL_H
#define GPUSLICE_REAL_H

/* The real (unhooked) driver function `name` from libcuda.so.1, or NULL. Cached; thread-safe.
 * This is what the pacer uses for cuCtxGetDevice, cuEventCreate, cuStreamQuery, ... */
void *gs_real(const char *name);
/* Same for NVML (libnvidia-ml.so.1). */
void *gs_real_nvml(const char *name);

/* The glibc dlsym, never our wrapper. */
void *gs_libc_dlsym(void *handle, const char *name);

/* dlsym runs before sanitizer runtimes are initialised (they look up their interceptors through
 * it), so the code on its pass-through path must not be instrumented. */
#define GS_NO_SANITIZE __attribute__((no_sanitize_address, no_sanitize_undefined))

/* For the dlsym trampoline (src/hooks/dispatch.c), which must tail-jump into glibc's dlsym: the
 * pointer, and the look-up that fills it (safe to call before the sanitizers are up). */
extern __attribute__((visibility("hidden"))) void *(*gs_libc_dlsym_ptr)(void *, const char *);
GS_NO_SANITIZE void gs_resolve_libc_dlsym(void);
#endif
