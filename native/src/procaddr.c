/* cuGetProcAddress / cuGetProcAddress_v2: cudart (11.3+) resolves the whole driver API through
 * these, and first looks up cuGetProcAddress *itself* through cuGetProcAddress_v2 (measured: ~1,300
 * look-ups per PyTorch start). We let the driver answer, then swap in our hook when the answer is the
 * real version of a function we hook -- including the self-lookup, so later look-ups come back here.
 * Neither needs the enforcer initialised: they only translate addresses. */
#define _GNU_SOURCE
#include "gpuslice/hooks_common.h"

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    __typeof__(&cuGetProcAddress) real = GS_REAL(cuGetProcAddress);
    if (!real) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cuda_version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = gs_hook_for_real(symbol, *pfn);
    return r;
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    __typeof__(&cuGetProcAddress_v2) real = GS_REAL(cuGetProcAddress_v2);
    if (!real) return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cuda_version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = gs_hook_for_real(symbol, *pfn);
    return r;
}

const struct gs_hook gs_hooks_procaddr[] = {
    {"cuGetProcAddress", (void *)cuGetProcAddress},
    {"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2},
    {0, 0},
};
