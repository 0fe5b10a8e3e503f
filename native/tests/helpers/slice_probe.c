/* A slice process driven line by line from stdin, for the Python tests that act as a tenant
 * (tests/security/): with the enforcer LD_PRELOADed over the CPU driver double it answers
 *   init            -> "init <CUresult>"        cuInit + the primary context of device 0
 *   alloc <bytes>   -> "alloc <CUresult>"       cuMemAlloc_v2 of that size (kept until exit)
 *   launch          -> "launch <CUresult>"      one cuLaunchKernel (the compute pacer opens its
 *                                               device state file on the first launch)
 *   pid             -> "pid <pid>"
 *   env <NAME>      -> "env <value>"            getenv (after init: what the enforcer set, e.g. MPS's
 *                                               variables of a spatial slice); "(unset)" when unset
 * and exits 0 at end of input. Usage: slice_probe (no arguments). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuslice/cuda_types.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);

int main(void)
{
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strcmp(line, "init")) {
            CUcontext c;
            CUresult r = cuInit(0);
            if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&c, 0);
            if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(c);
            printf("init %d\n", (int)r);
        } else if (!strncmp(line, "alloc ", 6)) {
            CUdeviceptr p = 0;
            printf("alloc %d\n", (int)cuMemAlloc_v2(&p, (size_t)strtoull(line + 6, NULL, 10)));
        } else if (!strcmp(line, "launch")) {
            printf("launch %d\n", (int)cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        } else if (!strncmp(line, "env ", 4)) {
            const char *v = getenv(line + 4);
            printf("env %s\n", v ? v : "(unset)");
        } else if (!strcmp(line, "pid")) {
            printf("pid %d\n", (int)getpid());
        } else {
            printf("unknown %s\n", line);
        }
    }
    return 0;
}
