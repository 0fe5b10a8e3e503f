/* A busy process of a slice for the Python region tests: THREADS threads allocate and free random
 * sizes through the driver double for SECONDS, with the enforcer LD_PRELOADed, so the region is
 * being written while Python reads it. Prints "ready" once it holds a context, and at the end the
 * number of refusals it saw. Usage: region_writer SECONDS THREADS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gpuslice/cuda_types.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static double g_end;
static unsigned long g_refused;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    CUcontext c;
    if (cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return (void *)1;
    CUdeviceptr live[16] = {0};
    while (now() < g_end) {
        int i = rand_r(&seed) % 16;
        if (live[i]) {
            cuMemFree_v2(live[i]);
            live[i] = 0;
        } else if (cuMemAlloc_v2(&live[i], ((size_t)(rand_r(&seed) % 32) + 1) << 20) != CUDA_SUCCESS) {
            live[i] = 0;
            __atomic_add_fetch(&g_refused, 1, __ATOMIC_RELAXED);
        }
    }
    for (int i = 0; i < 16; i++)
        if (live[i]) cuMemFree_v2(live[i]);
    return NULL;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2;
    int n = argc > 2 ? atoi(argv[2]) : 4;
    if (n < 1 || n > 64) n = 4;
    if (cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "cuInit refused\n");
        return 2;
    }
    CUcontext c;
    if (cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 2;
    printf("ready\n");
    fflush(stdout);
    /* Give sibling writers started right after us time to attach before anyone fills the slice. */
    usleep(300000);
    g_end = now() + secs;
    pthread_t th[64];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    printf("refused %lu\n", g_refused);
    return 0;
}
