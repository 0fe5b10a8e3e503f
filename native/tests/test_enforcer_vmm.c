/* VMM (cuMemCreate / cuMemMap / cuMemUnmap / cuMemRelease) over the CPU double, which frees a
 * handle's memory as CUDA does: once it is released AND no mapping of it remains. The enforcer must
 * give the bytes back at that moment, not at cuMemRelease: create -> map -> release, repeated, was
 * an escape from the limit. Also run with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <dlfcn.h>

#define GRAN (2 * MiB)

static CUmemGenericAllocationHandle create(size_t size, CUresult *r)
{
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    *r = cuMemCreate(&h, size, &prop, 0);
    return h;
}

/* The escape: each round maps a new handle and releases it while mapped. Only the limit's worth of
 * rounds may succeed, and the driver must hold exactly what the slice counts. */
static void s_release_while_mapped_holds_memory(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 64 * MiB, CTX);
    up(0);
    CUdeviceptr va;
    CHECK_EQ(cuMemAddressReserve(&va, 1024 * MiB, 0, 0, 0), CUDA_SUCCESS);
    int rounds = 0;
    for (; rounds < 64; rounds++) {
        CUresult r;
        CUmemGenericAllocationHandle h = create(16 * MiB, &r);
        if (r != CUDA_SUCCESS) {
            CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
            break;
        }
        CHECK_EQ(cuMemMap(va + (CUdeviceptr)rounds * 16 * MiB, 16 * MiB, 0, h, 0), CUDA_SUCCESS);
        CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS); /* still mapped: the memory stays */
    }
    CHECK_EQ(rounds, 4); /* 64 MiB of 16 MiB handles, then refused */
    CHECK_EQ(gsdouble_used(0), 64 * MiB);
    CHECK_EQ(t_used(0), CTX + 64 * MiB);
    /* Unmapping gives them back one by one, as the driver frees them. */
    CHECK_EQ(cuMemUnmap(va, 16 * MiB), CUDA_SUCCESS);
    CHECK_EQ(gsdouble_used(0), 48 * MiB);
    CHECK_EQ(t_used(0), CTX + 48 * MiB);
    /* One unmap may cover several adjacent mappings. */
    CHECK_EQ(cuMemUnmap(va + 16 * MiB, 48 * MiB), CUDA_SUCCESS);
    CHECK_EQ(gsdouble_used(0), 0);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(cuMemAddressFree(va, 1024 * MiB), CUDA_SUCCESS);
}

/* The other order (unmap, then release) and a handle mapped twice: the bytes go with the last of
 * release and unmap, whichever it is. */
static void s_unmap_then_release_and_double_mapping(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr va;
    CHECK_EQ(cuMemAddressReserve(&va, 256 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CUresult r;
    CUmemGenericAllocationHandle h = create(32 * MiB, &r);
    CHECK_EQ(r, CUDA_SUCCESS);
    CHECK_EQ(cuMemMap(va, 32 * MiB, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemMap(va + 64 * MiB, 32 * MiB, 0, h, 0), CUDA_SUCCESS); /* the same memory twice */
    CHECK_EQ(t_used(0), CTX + 32 * MiB);                                /* counted once */
    CHECK_EQ(cuMemUnmap(va, 32 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 32 * MiB); /* one mapping left */
    CHECK_EQ(gsdouble_used(0), 32 * MiB);
    CHECK_EQ(cuMemUnmap(va + 64 * MiB, 32 * MiB), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
    /* unmap first, then release: the release gives back */
    h = create(32 * MiB, &r);
    CHECK_EQ(cuMemMap(va, 32 * MiB, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemUnmap(va, 32 * MiB), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 32 * MiB);
    CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    /* a failed unmap (nothing mapped there) changes nothing */
    CHECK(cuMemUnmap(va, 32 * MiB) != CUDA_SUCCESS, "unmapping nothing fails");
    CHECK_EQ(t_used(0), CTX);
}

/* PyTorch expandable_segments grows a segment by mapping 2 MiB pages and shrinks it by unmapping and
 * releasing them; many rounds must leave nothing behind. */
static void s_expandable_segments_pattern(void)
{
    t_slice("memory_limit=%llu\ncontext_overhead=%llu\n", CTX + 40 * MiB, CTX);
    up(0);
    CUdeviceptr va;
    CHECK_EQ(cuMemAddressReserve(&va, 512 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle hs[32];
    for (int round = 0; round < 20; round++) {
        int n = 0;
        CUresult r = CUDA_SUCCESS;
        while (n < 32) {
            hs[n] = create(GRAN, &r);
            if (r != CUDA_SUCCESS) break;
            CHECK_EQ(cuMemMap(va + (CUdeviceptr)n * GRAN, GRAN, 0, hs[n], 0), CUDA_SUCCESS);
            n++;
        }
        CHECK_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
        CHECK_EQ(n, 20);
        CHECK_EQ(cuMemUnmap(va, (size_t)n * GRAN), CUDA_SUCCESS);
        for (int k = 0; k < n; k++) CHECK_EQ(cuMemRelease(hs[k]), CUDA_SUCCESS);
        CHECK_EQ(t_used(0), CTX);
    }
    CHECK_EQ(gsdouble_used(0), 0);
}

/* cuMemMap/cuMemUnmap reached through dlsym and cuGetProcAddress are the hooks too. */
static void s_vmm_lookups_hooked(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(h != NULL, "dlopen libcuda double");
    CHECK(dlsym(h, "cuMemMap") == (void *)cuMemMap, "dlsym(libcuda, cuMemMap) is the hook");
    CHECK(dlsym(h, "cuMemUnmap") == (void *)cuMemUnmap, "dlsym(libcuda, cuMemUnmap) is the hook");
    void *pm = NULL, *pu = NULL;
    CHECK_EQ(cuGetProcAddress_v2("cuMemMap", &pm, 12000, 0, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuGetProcAddress_v2("cuMemUnmap", &pu, 12000, 0, NULL), CUDA_SUCCESS);
    CHECK(pm == (void *)cuMemMap && pu == (void *)cuMemUnmap, "cuGetProcAddress hands out the VMM hooks");
    if (h) dlclose(h);
}

/* cuMemRetainAllocationHandle adds a reference that needs its own cuMemRelease: the memory lives
 * until every reference is released and the last mapping is gone, and the slice counts it that long
 * (a retain, then two releases while mapped, must not give the bytes back twice or early). */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
static void s_retained_handle_needs_every_release(void)
{
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUdeviceptr va;
    CHECK_EQ(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CUresult r;
    CUmemGenericAllocationHandle h = create(32 * MiB, &r), again = 0;
    CHECK_EQ(r, CUDA_SUCCESS);
    CHECK_EQ(cuMemMap(va, 32 * MiB, 0, h, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)va), CUDA_SUCCESS);
    CHECK_EQ(again, h);
    CHECK_EQ(cuMemUnmap(va, 32 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cuMemRelease(again), CUDA_SUCCESS); /* the retained reference: the original one remains */
    CHECK_EQ(gsdouble_used(0), 32 * MiB);
    CHECK_EQ(t_used(0), CTX + 32 * MiB);
    CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS);     /* the last reference, nothing mapped: freed */
    CHECK_EQ(gsdouble_used(0), 0);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(cuMemAddressFree(va, 64 * MiB), CUDA_SUCCESS);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_release_while_mapped_holds_memory);
    SCENARIO(s_unmap_then_release_and_double_mapping);
    SCENARIO(s_expandable_segments_pattern);
    SCENARIO(s_vmm_lookups_hooked);
    SCENARIO(s_retained_handle_needs_every_release);
    fprintf(stderr, "test_enforcer_vmm%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
