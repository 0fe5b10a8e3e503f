/* Array hooks (CUDA arrays, 3D/layered/cubemap arrays, mipmapped arrays; _v2 and the legacy 32-bit
 * descriptors). The driver does not say what an array costs, so it is estimated from the
 * descriptor: element size x channels x extent, every mip level summed. */
#define _GNU_SOURCE
#include <stdint.h>

#include "gpuslice/hooks_common.h"
#include "gpuslice/log.h"

static uint64_t format_bytes(int format)
{
    switch (format) {
    case 0x01: case 0x08: return 1;             /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2;  /* (un)signed int16, half */
    case 0x03: case 0x0a: case 0x20: return 4;  /* (un)signed int32, float */
    default: return 4;                          /* other/new formats: at most 4 bytes per channel */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels)
{
    uint64_t n = (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1);
    return n * format_bytes(format) * (channels ? channels : 1);
}

static uint64_t mipmapped_bytes(size_t w, size_t h, size_t d, int format, unsigned channels, unsigned flags,
                                unsigned levels)
{
    /* Width and height halve per level. Depth halves only for a true 3D array: for a layered array
     * it counts layers and for a cubemap it counts faces (6, or 6 x layers), which every level keeps. */
    int depth_shrinks = !(flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP));
    uint64_t b = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        b += array_bytes(w, h, d, format, channels);
        if (w <= 1 && h <= 1 && (d <= 1 || !depth_shrinks)) break; /* the driver refuses more levels anyway */
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        if (depth_shrinks) d = d > 1 ? d / 2 : d;
    }
    return b;
}

/* Array creation in its two generations: the _v2 functions and the legacy ones with 32-bit
 * descriptor fields, which libcuda still exports under the plain names. One row per generation:
 *   X(descriptor, 3D descriptor, create, create 3D) */
#define ARRAY_GENERATIONS(X)                                                                          \
    X(CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, cuArrayCreate_v2, cuArray3DCreate_v2)           \
    X(CUDA_ARRAY_DESCRIPTOR_v1, CUDA_ARRAY3D_DESCRIPTOR_v1, cuArrayCreate, cuArray3DCreate)

/* `depth`: an expression of `desc` (a 2D array has depth 1). */
#define ARRAY_CREATE_HOOK(name, DESC, what, depth)                                                    \
    GS_EXPORT CUresult name(CUarray *arr, const DESC *desc)                                           \
    {                                                                                                 \
        __typeof__(&name) real = GS_REAL(name);                                                       \
        GS_PROLOGUE(real(arr, desc));                                                                 \
        ORD_OR_PASS(real(arr, desc));                                                                 \
        if (!desc || !arr) return real(arr, desc);                                                    \
        uint64_t b = array_bytes(desc->Width, desc->Height, depth, desc->Format, desc->NumChannels);  \
        GS_ACCOUNTED(what, ord, b, GS_K_ARRAY, (uintptr_t)*arr, real(arr, desc));                     \
    }
#define GENERATION_HOOKS(DESC, DESC_3D, create, create_3d)                                            \
    ARRAY_CREATE_HOOK(create, DESC, "cuArrayCreate", 1)                                               \
    ARRAY_CREATE_HOOK(create_3d, DESC_3D, "cuArray3DCreate", desc->Depth)
ARRAY_GENERATIONS(GENERATION_HOOKS)

GS_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    __typeof__(&cuArrayDestroy) real = GS_REAL(cuArrayDestroy);
    GS_PROLOGUE(real(arr));
    GS_FREED(GS_K_ARRAY, (uintptr_t)arr, real(arr));
}

GS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int levels)
{
    __typeof__(&cuMipmappedArrayCreate) real = GS_REAL(cuMipmappedArrayCreate);
    GS_PROLOGUE(real(arr, desc, levels));
    ORD_OR_PASS(real(arr, desc, levels));
    if (!desc || !arr) return real(arr, desc, levels);
    uint64_t b = mipmapped_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels,
                                    desc->Flags, levels);
    GS_ACCOUNTED("cuMipmappedArrayCreate", ord, b, GS_K_MIPMAP, (uintptr_t)*arr, real(arr, desc, levels));
}

GS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    __typeof__(&cuMipmappedArrayDestroy) real = GS_REAL(cuMipmappedArrayDestroy);
    GS_PROLOGUE(real(arr));
    GS_FREED(GS_K_MIPMAP, (uintptr_t)arr, real(arr));
}

#define GENERATION_ROWS(DESC, DESC_3D, create, create_3d) GS_HOOK_ENTRY(create) GS_HOOK_ENTRY(create_3d)
const struct gs_hook gs_hooks_array[] = {
    ARRAY_GENERATIONS(GENERATION_ROWS)
    GS_HOOK_ENTRY(cuArrayDestroy)
    GS_HOOK_ENTRY(cuMipmappedArrayCreate)
    GS_HOOK_ENTRY(cuMipmappedArrayDestroy)
    {0, 0},
};
