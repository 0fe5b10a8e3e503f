/* The rule that turns NVML's process list into the slice's (see nvml_view.h for why). */
#include "gpuslice/nvml_view.h"

static int slice_index(const struct gs_slice_proc *slice, int m, uint32_t pid)
{
    for (int j = 0; j < m; j++)
        if (slice[j].pid == pid) return j;
    return -1;
}

unsigned gs_nvml_view(const uint32_t *nvml_pids, unsigned n, const struct gs_slice_proc *slice, int m,
                      int may_substitute, struct gs_nvml_pick *out, unsigned max)
{
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        int j = slice_index(slice, m, nvml_pids[i]);
        if (j < 0) continue;
        if (k < max) out[k] = (struct gs_nvml_pick){(int)i, nvml_pids[i], slice[j].bytes};
        k++;
    }
    if (k || !n || m <= 0 || !may_substitute) return k;
    for (int j = 0; j < m; j++, k++)
        if (k < max) out[k] = (struct gs_nvml_pick){-1, slice[j].pid, slice[j].bytes};
    return k;
}
