/* Handing out the hooks, the top of the enforcer: the table of every hook, and the two ways it is
 * consulted besides direct linking -- the dlsym wrapper and cuGetProcAddress. It knows every hook
 * file's part of the table (hook.h); no other file calls into it.
 *
 * Three ways a program reaches a driver function, all covered:
 *  (a) direct linking against libcuda.so.1: our exported function of the same name interposes
 *      (LD_PRELOAD or /etc/ld.so.preload puts us first in the global scope);
 *  (b) dlopen("libcuda.so.1") + dlsym(handle, "cuMemAlloc_v2") (CuPy, JAX, Triton, ctypes): our
 *      dlsym sees a hooked name whose real definition lives in libcuda and returns our hook;
 *  (c) cuGetProcAddress[_v2] (cudart 11.3+): it maps the driver's answer back to a hook by comparing
 *      it with the real exported versions of the requested name (below).
 *
 * dlsym itself is replaced by a small assembly trampoline so that, when we pass a call through,
 * glibc's dlsym sees the *original caller's* return address: dlsym(RTLD_NEXT, ...) depends on it,
 * and a C wrapper would turn every RTLD_NEXT lookup in the process into "next after gpuslice",
 * breaking (or sending into endless recursion) other interposers such as malloc shims. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "gpuslice/hook.h"
#include "gpuslice/log.h"

unsigned long gs_stat_procaddr_hooked, gs_stat_dlsym_hooked, gs_stat_procaddr_unexported;

/* ------------------------------------------------------------------ the table */
/* Order matters only among the versions of one name: gs_hook_for_real hands out the first whose real
 * address the driver returned (each file lists a _v2 before its legacy twin). */
static const struct gs_hook *const gs_hook_tables[] = {gs_hooks_memory,  gs_hooks_array,  gs_hooks_vmm,
                                                       gs_hooks_pool,    gs_hooks_context, gs_hooks_launch,
                                                       gs_hooks_nvml,    gs_hooks_procaddr, gs_hooks_graph};
#define NTABLES (sizeof gs_hook_tables / sizeof gs_hook_tables[0])

void *gs_hook_for(const char *name)
{
    for (size_t t = 0; t < NTABLES; t++)
        for (const struct gs_hook *h = gs_hook_tables[t]; h->name; h++)
            if (!strcmp(h->name, name)) return h->fn;
    return NULL;
}

/* "cuMemAllocAsync_ptsz" -> "cuMemAllocAsync", "cuCtxCreate_v3" -> "cuCtxCreate". */
static size_t base_len(const char *name)
{
    size_t n = strlen(name);
    if (n > 5 && (!strcmp(name + n - 5, "_ptsz") || !strcmp(name + n - 5, "_ptds"))) n -= 5;
    size_t d = n;
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9') d--;
    if (d < n && d >= 2 && name[d - 1] == 'v' && name[d - 2] == '_') n = d - 2;
    return n;
}

/* Names the driver answers with a function of another name: CUDA 12 headers spell cuGraphInstantiate
 * as cuGraphInstantiateWithFlags, so a lookup of "cuGraphInstantiate" at 12000 returns that one. */
static int answered_as(const char *symbol, const char *hook)
{
    return !strcmp(symbol, "cuGraphInstantiate") && !strcmp(hook, "cuGraphInstantiateWithFlags");
}

void *gs_hook_for_real(const char *symbol, void *real)
{
    if (!symbol || !real || symbol[0] != 'c' || symbol[1] != 'u') return real;
    size_t slen = strlen(symbol);
    int candidates = 0;
    for (size_t t = 0; t < NTABLES; t++) {
        for (const struct gs_hook *h = gs_hook_tables[t]; h->name; h++) {
            if (h->name[0] != 'c') continue;
            if (strcmp(h->name, symbol) && !(base_len(h->name) == slen && !strncmp(h->name, symbol, slen)) &&
                !answered_as(symbol, h->name))
                continue;
            candidates++;
            /* The driver may answer a base name with any of its versions (by cudaVersion and the
             * per-thread-stream flag): hook exactly the version whose real address it returned. */
            if (gs_real(h->name) == real) {
                __atomic_add_fetch(&gs_stat_procaddr_hooked, 1, __ATOMIC_RELAXED);
                return h->fn;
            }
        }
    }
    if (candidates) {
        __atomic_add_fetch(&gs_stat_procaddr_unexported, 1, __ATOMIC_RELAXED);
        GS_WARN("cuGetProcAddress(%s) returned a function that matches no exported version we hook; not intercepted",
                symbol);
    }
    return real;
}

/* ------------------------------------------------------------------ cuGetProcAddress */
/* cudart (11.3+) resolves the whole driver API through these, and first looks up cuGetProcAddress
 * *itself* through cuGetProcAddress_v2 (measured: ~1,300 look-ups per PyTorch start). We let the
 * driver answer, then swap in our hook when the answer is the real version of a function we hook
 * -- including the self-lookup, so later look-ups come back here. Neither needs the enforcer
 * initialised: they only translate addresses.
 *   X(name, parameters, arguments): the two versions differ only in the _v2 status argument. */
#define PROCADDR_HOOKS(X)                                                                             \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int cuda_version, cuuint64_t flags),        \
      (symbol, pfn, cuda_version, flags))                                                            \
    X(cuGetProcAddress_v2,                                                                            \
      (const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,                           \
       CUdriverProcAddressQueryResult *status),                                                      \
      (symbol, pfn, cuda_version, flags, status))

static CUresult hooked_answer(CUresult r, const char *symbol, void **pfn)
{
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = gs_hook_for_real(symbol, *pfn);
    return r;
}

#define PROCADDR_HOOK(name, params, args)                                      \
    GS_EXPORT CUresult name params                                             \
    {                                                                          \
        __typeof__(&name) real = GS_REAL(name);                                \
        if (!real) return CUDA_ERROR_NOT_FOUND;                                \
        return hooked_answer(real args, symbol, pfn);                          \
    }
PROCADDR_HOOKS(PROCADDR_HOOK)

const struct gs_hook gs_hooks_procaddr[] = {PROCADDR_HOOKS(GS_HOOK_ROW){0, 0}};

/* ------------------------------------------------------------------ dlsym */
#define GS_DLSYM_PASS ((void *)-1)

static int object_is(void *addr, const char *prefix)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname) return 0;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return strncmp(base, prefix, strlen(prefix)) == 0;
}

/* Decide what dlsym(handle, name) returns: GS_DLSYM_PASS = let glibc answer (the common case: any
 * name not ours costs two character compares), else the pointer to return. */
GS_NO_SANITIZE __attribute__((visibility("hidden"))) void *gs_dlsym_lookup(void *handle, const char *name)
{
    gs_resolve_libc_dlsym();
    if (!name || handle == RTLD_NEXT) return GS_DLSYM_PASS;
    int is_cu = name[0] == 'c' && name[1] == 'u';
    if (!is_cu && strncmp(name, "nvml", 4)) return GS_DLSYM_PASS;
    void *hook = gs_hook_for(name);
    if (!hook) return GS_DLSYM_PASS;
    const char *lib = is_cu ? "libcuda.so" : "libnvidia-ml.so";
    void *real = gs_libc_dlsym_ptr(handle, name);
    if (!real) return GS_DLSYM_PASS; /* let glibc answer, and set dlerror() */
    if (real == hook) {
        /* A global lookup found our own export. Say "not there" unless the real library is loaded,
         * so that a program merely probing for CUDA is not fooled into thinking it exists. */
        void *h = dlopen(is_cu ? "libcuda.so.1" : "libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!h) return NULL;
        dlclose(h);
        return hook;
    }
    if (!object_is(real, lib)) return GS_DLSYM_PASS;
    __atomic_add_fetch(&gs_stat_dlsym_hooked, 1, __ATOMIC_RELAXED);
    return hook;
}

#if defined(__x86_64__)
/* dlsym(handle, name): ask gs_dlsym_lookup; on GS_DLSYM_PASS tail-jump into glibc's dlsym with the
 * caller's return address still on the stack. Stack: entry rsp = 8 mod 16; two pushes and 8 bytes
 * realign it for the call. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call gs_dlsym_lookup\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  cmpq $-1, %rax\n"
        "  je 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *gs_libc_dlsym_ptr(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
/* Same on aarch64: restore x30 (the caller's return address) before branching to glibc. Not yet run
 * on aarch64 hardware. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,%function\n"
        "dlsym:\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl gs_dlsym_lookup\n"
        "  mov x2, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  cmn x2, #1\n"
        "  b.eq 1f\n"
        "  mov x0, x2\n"
        "  ret\n"
        "1:\n"
        "  adrp x16, gs_libc_dlsym_ptr\n"
        "  ldr x16, [x16, :lo12:gs_libc_dlsym_ptr]\n"
        "  br x16\n"
        ".size dlsym, .-dlsym\n");
#else
#error "gpuslice: the dlsym trampoline exists for x86_64 and aarch64 only"
#endif
