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

/* The SMs a yielding client may take beside a high-priority neighbour. A low-priority preemptive spatial
 * slice with no compute share of its own (compute=0; 100 says "every SM") that starts while the device's
 * roster lists a high-priority preemptive slice gets this active-thread percentage. Why: MPS's client
 * priority orders only waiting work, and a running trainer's blocks still hold the SMs a server's next
 * kernel needs. On the H200 a decoder of ~1,300 tiny kernels a request kept paired p50 1.04x (median of 6
 * repeats) beside a trainer capped at 60, against 1.11x beside one on every SM in the same ABBA run
 * (bench/results/2026-11-29-h200-coloc-yieldcap-decode.md); a later run read the opposite order (1.06 / 1.23
 * capped, 0.98 / 0.86 on every SM, 2026-11-30-h200-coloc-current-launch-decode.md): over ten capped repeats in
 * four runs the decoder read 1.02-1.37 (median 1.05), so the cap's gain for it is inside the VM's spread.
 * Launch-bound and GPU-bound servers met their goals either way. The price: MPS fixes the percentage when the
 * client starts, so it holds while the server idles. The co-location bench's trainer (CPU-paced) lost nothing
 * measurable alone at 60; one that fills the SMs (batch 64) kept 0.71 of its speed
 * (2026-11-29-h200-coloc-trainer-cap.md). It is decided at each process's start from the roster as it is then: a trainer started before the server is not capped,
 * and a capped one stays capped after the server leaves (so do the children it starts later: they inherit
 * the lowered variable, which the environment may keep). A slice opts out with compute=100; GPUSLICE_COMPUTE
 * may lower the cap, never raise it (config.h granted_compute). Only a high-priority slice of the same MPS
 * daemon counts: MPS serves each user (in Kubernetes each user and namespace) from a daemon of its own, and
 * the daemons on one device are time-sliced, so another daemon's server never waits for our blocks' SMs.
 * The roster entry names a spatial slice's daemon (policy.h mps_id; the local agent and the device plugin
 * write it); an entry that names none counts (the DRA driver grants only time-sliced slices). */
#define GS_MPS_YIELD_THREADS 60

/* Whether a spatial slice's processes run the pacer, for the yield only (the spatial yield gate): a
 * preemptive slice (the default colocation) whose process asks for it with GPUSLICE_SPATIAL_YIELD=1 in its
 * environment. Such a process is never paced to a share (MPS's active-thread percentage is a spatial
 * slice's share: pacer.c gives it none), but a high-priority one records its queue's drains for yielding
 * neighbours that also asked, and a low-priority one holds its launches while such a neighbour's queue has a
 * backlog, keeping at most YIELD_QUEUE of its own work queued in front of the next request (the time-sliced
 * engine's yield path, README-compute.md "Co-location"). Under MPS a server's kernels then wait for no
 * context switch, only for the trainer's blocks already running.
 * Why opt-in, measured on the H200 (bench/results/2026-11-29-h200-coloc-spatialgate-*.md): beside the capped
 * trainer a decoder of ~1,300 tiny kernels a request kept paired p50 0.96x / p99 0.98x with the gate against
 * 1.06x / 1.01x without it (p99 against alone 1.14x against 1.58x), but the server's drain records cost
 * ResNet-50 servers (batch 1 and 32) 1-2 ms a request whether the trainer ran or not, most of it the poller's
 * wakes and event queries (no drain records at all took it all off and left the trainer held after every
 * server launch). The poller's timing since (controller.h DRAIN_HOT, DRAIN_AGE) took the gated launch-bound
 * server from 1.75x to 1.02-1.08x alone and the decoder from 1.18x to 1.06x
 * (bench/results/2026-11-29-h200-coloc-drainhot-*.md, 2026-11-30-h200-coloc-drainage5-launch.md); beside a
 * batch-32 server it still cost ~0.6-1.2 ms a request and the trainer a third (-drainage5-gpubound.md). A
 * later paired run (2026-11-30-h200-coloc-current-gpubound-decode.md) found that cost only while the trainer
 * runs (not the records: a record between GPU-bound kernels costs the GPU nothing measurable,
 * 2026-11-30-h200-drain-cost-gpubound.md), the batch-32 trainer at 0.62 of its idle bound against 0.97 with the
 * cap alone, and the decoder held to paired 1.03 / 1.01 (1.04 / 1.29 capped) with its trainer at 0.77 against
 * 1.12. On an H100 (2026-12-06-h100-coloc-yieldsplit-decode.md, one 3-repeat run) its trainer slept 30 % of
 * its time for the decoder's backlog (0.66 of its idle bound), and the decoder read no better than ungated (p50
 * 1.13x alone gated, 1.01x ungated; inconclusive, one repeat slow in its rest slots too). So it stays opt-in.
 * The environment may turn it on, never off: a low-priority process only holds
 * itself, and a high-priority one makes only neighbours that asked too hold. A `shared`
 * slice yields to nobody and is asked by nobody: never. Unlike the yield cap the gate does not look at
 * daemons: an asking trainer yields to an asking server of another MPS daemon too (the daemons are
 * time-sliced against each other, where holding back is what the time-sliced engine does). A gate that cannot
 * start (init.c) is a warning, never a refusal: it holds no limit. */
int gs_mps_yield_paced(const struct gs_config *c);

/* What to set: an empty string leaves that variable as the environment has it. */
struct gs_mps_env {
    char pipe_dir[GS_PATH_LEN];   /* CUDA_MPS_PIPE_DIRECTORY */
    char threads[8];              /* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, 1..99 */
    char pinned[48];              /* CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, "0=<MiB>M" */
    char priority[4];             /* CUDA_MPS_CLIENT_PRIORITY: "1" (below normal) for a low-priority slice
                                     that yields (colocation=preemptive); the environment cannot raise it */
};

/* The client settings of a spatial slice given the current environment (read through get) and whether a
 * high-priority preemptive slice shares its device (beside_high: gs_mps_high_neighbour). Pure: the unit
 * tests drive it with a table. Returns the number of variables to set (0 for a time-sliced slice). */
int gs_mps_client_env(const struct gs_config *c, int beside_high, gs_env_fn get, void *arg, struct gs_mps_env *out);

/* Whether a spatial slice that yields (low priority, not colocation=shared, no compute share of its own)
 * starts beside a high-priority preemptive slice, as its device's roster (policy.h: root's, never a
 * tenant's record) lists the device now: 1 and that slice's grant in `grant`, else 0 (and no roster is
 * read). */
int gs_mps_high_neighbour(const struct gs_config *c, char *grant, size_t len);

/* gs_mps_client_env on the real environment, then setenv what differs; logs what the client runs with. */
void gs_mps_apply(const struct gs_config *c);

/* Again just before the real cuInit (the driver reads the MPS variables then): a process that changed
 * them after gs_mps_apply (its first hooked call may come before cuInit) gets the slice's values back,
 * with gs_mps_apply's decision on the yield cap. A program that reaches the driver without the enforcer
 * is outside every rule of the slice contract (native/README.md). */
void gs_mps_hold(const struct gs_config *c);

#endif
