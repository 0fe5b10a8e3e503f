/* The slice's view of an NVML process list (pure: no driver, no region access; nvml.c feeds it).
 *
 * NVML reports pids as the driver sees them: the host's pid namespace. The region records the pids
 * of the slice's own namespace (its container). So:
 *  - if some pid NVML lists is a live process of the slice, the namespaces agree: keep exactly the
 *    listed processes that belong to the slice, each with the bytes the slice accounts for it;
 *  - if none matches although NVML lists processes and the slice has processes holding memory or a
 *    context on the device, the pids cannot be compared (the slice runs in its own pid namespace):
 *    report the slice's processes from the region, with their own pids and accounted bytes -- for
 *    the lists where they belong (compute, or MPS compute while MPS serves the device; never the
 *    graphics list, whose entries in that case are the host's);
 *  - otherwise the list is empty. */
#ifndef GPUSLICE_NVML_VIEW_H
#define GPUSLICE_NVML_VIEW_H
#include <stdint.h>

#include "gpuslice/memory.h"

struct gs_nvml_pick {
    int src;        /* index into NVML's list, or -1: a slice process NVML could not name */
    uint32_t pid;
    uint64_t bytes; /* what the slice accounts for this process on the device */
};

/* nvml_pids[n]: what NVML listed. slice[m]: the slice's live processes on the device
 * (gs_mem_slice_procs). may_substitute: whether this list may show the slice's processes when the
 * pids cannot be compared. Writes at most max picks; returns how many there are in all. */
unsigned gs_nvml_view(const uint32_t *nvml_pids, unsigned n, const struct gs_slice_proc *slice, int m,
                      int may_substitute, struct gs_nvml_pick *out, unsigned max);
#endif
