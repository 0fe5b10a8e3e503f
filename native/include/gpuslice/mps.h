/* The spatial engine's client side (core layer): a spatial slice's processes are clients of their
 * device's MPS control daemon, which the node side runs (gpuslice.host.mps). Before the driver starts
 * (the first hooked call comes before the real cuInit), the enforcer makes the process's MPS settings
 * the slice's: the daemon's pipe directory, the compute share as the client's active-thread percentage,
 * the memory limit as its pinned device-memory limit, and a low-priority preemptive slice as a
 * below-normal client (MPS then runs the normal clients' work first: on the H200 a decode server beside a
 * below-normal trainer kept p50 1.16x / p99 0.96x alone, against 1.70x / 1.19x time-sliced with
 * `preemptive`; bench/results/2026-11-29-h200-coloc-steps3-mps.md). The environment may only lower the
 * threads, the pinned limit and the priority
 * (as everywhere in the slice contract); the pipe directory is the slice's whatever the environment
 * says, so a container cannot leave its device's daemon by changing its environment. */
#ifndef GPUSLICE_MPS_H
#define GPUSLICE_MPS_H
#include "gpuslice/config.h"

/* What to set: an empty string leaves that variable as the environment has it. */
struct gs_mps_env {
    char pipe_dir[GS_PATH_LEN];   /* CUDA_MPS_PIPE_DIRECTORY */
    char threads[8];              /* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 1..99 */
    char pinned[48];              /* CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, "0=<MiB>M" */
    char priority[4];             /* CUDA_MPS_CLIENT_PRIORITY: "1" (below normal) for a low-priority slice
                                     that yields (colocation=preemptive); the environment cannot raise it */
};

/* The client settings of a spatial slice given the current environment (read through get). Pure:
 * the unit tests drive it with a table. Returns the number of variables to set (0 for a time-sliced
 * slice). */
int gs_mps_client_env(const struct gs_config *c, gs_env_fn get, void *arg, struct gs_mps_env *out);

/* gs_mps_client_env on the real environment, then setenv what differs; logs what the client runs with. */
void gs_mps_apply(const struct gs_config *c);

#endif
