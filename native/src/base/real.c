/* Finding the real driver and NVML functions: libcuda.so.1 / libnvidia-ml.so.1 opened once, each
 * name looked up with glibc's own dlsym -- never our dlsym wrapper (src/hooks/dispatch.c), which
 * would hand back our hooks. Depends on nothing else of the enforcer, so everything that calls the
 * driver itself (hooks, accounting, pacer) may use it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "gpuslice/real.h"

/* glibc's dlsym, found with dlvsym (which we do not wrap). Hidden: the trampoline jumps through it. */
__attribute__((visibility("hidden"))) void *(*gs_libc_dlsym_ptr)(void *, const char *);

GS_NO_SANITIZE void gs_resolve_libc_dlsym(void)
{
    if (__atomic_load_n(&gs_libc_dlsym_ptr, __ATOMIC_ACQUIRE)) return;
    /* glibc >= 2.34 defines dlsym@@GLIBC_2.34 in libc; older ones dlsym@@GLIBC_2.2.5 in libdl. */
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
    void *p = NULL;
    for (int i = 0; !p && versions[i]; i++) p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&gs_libc_dlsym_ptr, (void *(*)(void *, const char *))p, __ATOMIC_RELEASE);
}

void *gs_libc_dlsym(void *handle, const char *name)
{
    gs_resolve_libc_dlsym();
    return gs_libc_dlsym_ptr ? gs_libc_dlsym_ptr(handle, name) : NULL;
}

static void *g_cuda, *g_nvml;

static void *open_lib(void **slot, const char *soname, const char *fallback)
{
    void *h = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (h) return h;
    h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h && fallback) h = dlopen(fallback, RTLD_NOW | RTLD_LOCAL);
    if (!h) return NULL;
    void *expected = NULL;
    if (!__atomic_compare_exchange_n(slot, &expected, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        dlclose(h); /* another thread won; drop our extra reference */
        h = expected;
    }
    return h;
}

void *gs_real(const char *name)
{
    void *h = open_lib(&g_cuda, "libcuda.so.1", "libcuda.so");
    return h ? gs_libc_dlsym(h, name) : NULL;
}

void *gs_real_nvml(const char *name)
{
    void *h = open_lib(&g_nvml, "libnvidia-ml.so.1", "libnvidia-ml.so");
    return h ? gs_libc_dlsym(h, name) : NULL;
}
