/* Added cost per intercepted driver call, in ns: cuMemAlloc_v2+cuMemFree_v2 pairs, cuLaunchKernel
 * of an empty kernel (JIT-compiled from PTX by the driver, so no CUDA toolkit is needed), and an
 * unhooked call (cuCtxGetDevice) as the floor. Run it three ways and compare:
 *   plain; LD_PRELOAD=libgpuslice.so without a slice (pass-through); with a slice (enforcing).
 * Resolves the driver through dlopen+dlsym, so the dlsym path of the enforcer is the one measured
 * (the same hooks serve direct linking and cuGetProcAddress).
 * Build: cc -O2 -std=c11 bench/enforcer_overhead.c -o enforcer_overhead -ldl
 * Output: "name ns_per_call" lines. Works over the CPU double too (launch: no PTX JIT there). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static const char ptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
#define SYM(name, ret, args) ret(*name) args = (ret(*) args)dlsym(h, #name); if (!name) { fprintf(stderr, "no %s\n", #name); return 1; }
    SYM(cuInit, CUresult, (unsigned));
    SYM(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice));
    SYM(cuCtxSetCurrent, CUresult, (CUcontext));
    SYM(cuCtxGetDevice, CUresult, (CUdevice *));
    SYM(cuCtxSynchronize, CUresult, (void));
    SYM(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t));
    SYM(cuMemFree_v2, CUresult, (CUdeviceptr));
    SYM(cuLaunchKernel, CUresult, (void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **));
    CUresult (*cuModuleLoadData)(void **, const void *) = (CUresult(*)(void **, const void *))dlsym(h, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(void **, void *, const char *) = (CUresult(*)(void **, void *, const char *))dlsym(h, "cuModuleGetFunction");
    CUcontext ctx;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDevicePrimaryCtxRetain(&ctx, 0)) || (r = cuCtxSetCurrent(ctx))) {
        fprintf(stderr, "init failed: %d\n", r);
        return 1;
    }
    CUdevice d;
    double t = now_ns();
    for (int i = 0; i < iters * 10; i++) cuCtxGetDevice(&d);
    printf("cuCtxGetDevice_unhooked %.1f\n", (now_ns() - t) / (iters * 10));
    CUdeviceptr p;
    for (int i = 0; i < 100; i++) { cuMemAlloc_v2(&p, 1 << 20); cuMemFree_v2(p); } /* warm the driver's pools */
    t = now_ns();
    for (int i = 0; i < iters; i++) {
        if ((r = cuMemAlloc_v2(&p, 1 << 20))) { fprintf(stderr, "alloc: %d\n", r); return 1; }
        cuMemFree_v2(p);
    }
    printf("cuMemAlloc_v2+cuMemFree_v2_1MiB %.1f\n", (now_ns() - t) / iters);
    void *mod = NULL, *fn = NULL;
    if (cuModuleLoadData && cuModuleGetFunction && cuModuleLoadData(&mod, ptx) == 0 && cuModuleGetFunction(&fn, mod, "noop") == 0) {
        for (int i = 0; i < 1000; i++) cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        cuCtxSynchronize();
        double best = 1e18;
        for (int rep = 0; rep < 5; rep++) { /* launch-queue depth limits: time batches, keep the best */
            t = now_ns();
            for (int i = 0; i < 1000; i++) cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            double dt = (now_ns() - t) / 1000;
            cuCtxSynchronize();
            if (dt < best) best = dt;
        }
        printf("cuLaunchKernel_empty %.1f\n", best);
    } else {
        printf("cuLaunchKernel_empty n/a\n");
    }
    return 0;
}
