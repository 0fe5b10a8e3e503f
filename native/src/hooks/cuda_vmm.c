/* Virtual memory management (PyTorch expandable_segments, JAX): physical memory is created by
 * cuMemCreate and mapped into reserved address ranges by cuMemMap. CUDA frees it only when the
 * handle has been released (cuMemRelease) AND no mapping of it remains (cuMemUnmap): releasing a
 * still-mapped handle keeps the memory. Giving the bytes back at cuMemRelease would let
 * create -> map -> release, repeated, take unlimited memory; so the bytes go back when the last of
 * the two happens.
 *
 * Books (one mutex): mapping start -> (size, handle); handle -> (mappings, released, ordinal+bytes
 * once released). What cuMemCreate counted stays in the common allocation table until release. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "gpuslice/fork.h"
#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"
#include "gpuslice/u64map.h"

static pthread_mutex_t g_vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_u64map g_maps;    /* mapping start -> a: size, b: handle */
static struct gs_u64map g_handles; /* handle -> a: live mappings, b: 1 once released, c: bytes | ordinal << 48 */
static struct gs_u64map g_retains; /* handle -> a: references added by cuMemRetainAllocationHandle */

#define PACK(ord, bytes) ((uint64_t)(bytes) | ((uint64_t)(uint16_t)(ord) << 48))
#define BYTES_OF(c) ((c) & ((1ull << 48) - 1))
#define ORD_OF(c) ((int)(uint16_t)((c) >> 48))

/* The child holds none of the parent's mappings or handles (CUDA state does not survive fork). */
static void after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_vmm_lock = fresh;
    gs_u64map_clear(&g_maps);
    gs_u64map_clear(&g_handles);
    gs_u64map_clear(&g_retains);
}
GS_ON_FORK_CHILD(after_fork_child);

GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    __typeof__(&cuMemCreate) real = GS_REAL(cuMemCreate);
    GS_PROLOGUE(real(handle, size, prop, flags));
    /* Host (NUMA) physical memory made through VMM is not device memory: not the slice's business. */
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return real(handle, size, prop, flags);
    int ord = prop->location.id;
    if (ord < 0) return real(handle, size, prop, flags);
    GS_ACCOUNTED("cuMemCreate", ord, size, GS_K_HANDLE, *handle, real(handle, size, prop, flags));
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    __typeof__(&cuMemRelease) real = GS_REAL(cuMemRelease);
    GS_PROLOGUE(real(handle));
    pthread_mutex_lock(&g_vmm_lock);
    /* A reference that cuMemRetainAllocationHandle added goes first: the allocation lives on. */
    struct gs_u64val *ret = gs_u64map_get(&g_retains, handle);
    if (ret && ret->a > 0) {
        CUresult rr = real(handle);
        if (rr == CUDA_SUCCESS && --ret->a == 0) gs_u64map_take(&g_retains, handle, NULL);
        pthread_mutex_unlock(&g_vmm_lock);
        return rr;
    }
    int ord;
    uint64_t bytes;
    int had = gs_track_take(GS_K_HANDLE, handle, &ord, &bytes);
    CUresult r = real(handle);
    if (had && r != CUDA_SUCCESS) {
        gs_track_add(GS_K_HANDLE, handle, ord, bytes);
    } else if (had) {
        struct gs_u64val *h = gs_u64map_get(&g_handles, handle);
        if (h && h->a > 0) {
            /* Still mapped: the driver keeps the memory until the last cuMemUnmap. */
            h->b = 1;
            h->c = PACK(ord, bytes);
            had = 0;
        } else {
            gs_u64map_take(&g_handles, handle, NULL);
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    if (had && r == CUDA_SUCCESS) gs_mem_release(ord, bytes);
    return r;
}

GS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags)
{
    __typeof__(&cuMemMap) real = GS_REAL(cuMemMap);
    GS_PROLOGUE(real(ptr, size, offset, handle, flags));
    pthread_mutex_lock(&g_vmm_lock);
    CUresult r = real(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS) {
        struct gs_u64val *h = gs_u64map_get(&g_handles, handle);
        struct gs_u64val nh = h ? *h : (struct gs_u64val){0, 0, 0};
        nh.a++;
        /* Without these records an unmap could not tell when a released handle's memory goes: it then
         * stays counted until exit, which errs on the safe side of the limit. */
        if (gs_u64map_put(&g_handles, handle, nh) ||
            gs_u64map_put(&g_maps, ptr, (struct gs_u64val){size, handle, 0}))
            GS_WARN("cuMemMap: out of host memory for the mapping table; memory of handle %llu stays counted",
                    (unsigned long long)handle);
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return r;
}

/* Forget the mappings that cover [ptr, ptr+size) (cuMemUnmap takes whole mappings, possibly several
 * adjacent ones); add up what released handles thereby give back, per ordinal. */
static void unmapped(CUdeviceptr ptr, size_t size, uint64_t freed[64])
{
    CUdeviceptr at = ptr, end = ptr + size;
    struct gs_u64val m;
    while (at < end && gs_u64map_take(&g_maps, at, &m)) {
        struct gs_u64val *h = gs_u64map_get(&g_handles, m.b);
        if (h && h->a > 0 && --h->a == 0) {
            if (h->b) {
                int ord = ORD_OF(h->c);
                if (ord >= 0 && ord < 64) freed[ord] += BYTES_OF(h->c);
            }
            gs_u64map_take(&g_handles, m.b, NULL);
        }
        if (!m.a) break;
        at += m.a;
    }
}

GS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    __typeof__(&cuMemUnmap) real = GS_REAL(cuMemUnmap);
    GS_PROLOGUE(real(ptr, size));
    uint64_t freed[64] = {0};
    pthread_mutex_lock(&g_vmm_lock);
    CUresult r = real(ptr, size);
    if (r == CUDA_SUCCESS) unmapped(ptr, size, freed);
    pthread_mutex_unlock(&g_vmm_lock);
    for (int o = 0; o < 64; o++)
        if (freed[o]) gs_mem_release(o, freed[o]);
    return r;
}

/* The driver hands out the handle of a mapped allocation with one more reference, which needs its
 * own cuMemRelease: count it, so that release is not taken for the one that frees the memory. */
GS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    __typeof__(&cuMemRetainAllocationHandle) real = GS_REAL(cuMemRetainAllocationHandle);
    GS_PROLOGUE(real(handle, addr));
    pthread_mutex_lock(&g_vmm_lock);
    CUresult r = real(handle, addr);
    if (r == CUDA_SUCCESS && handle) {
        struct gs_u64val *ret = gs_u64map_get(&g_retains, *handle);
        struct gs_u64val v = ret ? *ret : (struct gs_u64val){0, 0, 0};
        v.a++;
        /* without the record a later release would give the bytes back early: say so */
        if (gs_u64map_put(&g_retains, *handle, v))
            GS_WARN("cuMemRetainAllocationHandle: out of host memory for the handle table");
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return r;
}

const struct gs_hook gs_hooks_vmm[] = {
    GS_HOOK_ENTRY(cuMemRetainAllocationHandle)
    GS_HOOK_ENTRY(cuMemCreate)
    GS_HOOK_ENTRY(cuMemRelease)
    GS_HOOK_ENTRY(cuMemMap)
    GS_HOOK_ENTRY(cuMemUnmap)
    {0, 0},
};
