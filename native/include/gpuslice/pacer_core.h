/* gpuslice pacer engine: one per (process, device). It measures the process's GPU time with an
 * event pair per busy period, publishes it in the per-device state, runs the controller and tells
 * the launch hook how long to hold a launch back. It never sleeps and never calls CUDA itself: GPU
 * operations come through gs_gpu_ops (CUDA events in pacer.c, a simulated device in the tests),
 * time comes in as an argument. All state changes happen under the device state lock. */
#ifndef GPUSLICE_PACER_CORE_H
#define GPUSLICE_PACER_CORE_H
#include <stdint.h>
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"

/* Launches measured at once per process and device: each launch gets an event pair (start recorded
 * before it, end after it on the same stream). When all 256 are outstanding the next launch waits
 * for the oldest to finish (a paced slice never has that much queued; see README-compute.md). */
#define GS_ENG_RING 256

struct gs_gpu_ops {
    int (*record_start)(void *ctx, int idx, void *stream);  /* 0 ok */
    int (*record_end)(void *ctx, int idx, void *stream);    /* 0 ok */
    int (*query_end)(void *ctx, int idx);                   /* 1 done, 0 pending, <0 error */
    int64_t (*elapsed)(void *ctx, int idx);                 /* ns start..end of pair idx; <0 error */
    /* optional (NULL = never): 1 when `stream` is being captured into a graph; such launches do
     * not run now, so they are neither paced nor timed (an event would join the graph) */
    int (*capturing)(void *ctx, void *stream);
    /* optional (NULL = no drain tracking): one reusable event re-recorded after each launch of a
     * light high-priority process, and whether its latest record has completed (1 done, 0 pending,
     * <0 error). It tells low-priority neighbours that the process's queue is not yet drained (a
     * CUDA graph launch, a batch of long kernels) at the cost of one record per launch. */
    int (*record_drain)(void *ctx, void *stream);
    int (*query_drain)(void *ctx);
};

enum { GS_RING_FREE = 0, GS_RING_RESERVED = 1, GS_RING_RECORDED = 2, GS_RING_VOID = 3 };

struct gs_engine {
    struct gs_devstate *ds;
    int slice, proc;
    const struct gs_gpu_ops *ops;
    void *ops_ctx;
    int light_base;       /* unpaced high-priority (or mode off): needs no measurement for itself */
    int light;            /* now publishing activity only, no events (light_base and no low-priority
                             neighbour that must know when our queue is empty) */
    int64_t light_check_ns;
    int drain_wanted;     /* light, high priority, a low-priority slice active: track queue drain */
    int drain_pending;    /* a drain record may still be running (atomic; launch threads + poller) */
    uint32_t drain_gen;   /* bumped after each drain record (atomic), see gs_engine_poll */
    uint8_t ring[GS_ENG_RING];
    int head, tail, outstanding;   /* pairs handed out: [tail, head) */
    int64_t cost_ns;      /* mean GPU time per launch (EWMA of measured pairs), 0 = unknown */
    int64_t cost_dev_ns;  /* mean absolute deviation (EWMA): neighbours are told a late-biased end
                             (mean + 2 dev), because entering early costs an overlap, late only a
                             short idle gap bounded by the poll */
    int64_t cost_avg_ns;  /* long-run mean GPU time per launch (EWMA 1/64), for the P term: the
                             fast mean follows phases of a loop (20 launches of 500 us, then 200 of
                             10 us), so right after the big ones it predicted each small launch at
                             ~400 us, held them back, and the GPU waited for the CPU to launch them
                             (simulation: a 90 % slice of such a loop reached 80 %) */
    int64_t last_reap_ns;
    uint32_t rate_bp;     /* cached allocation (recomputed every ms) */
    int others;           /* other processes on the device (recounted every ms): 0 = skip the scans */
    int64_t rate_at_ns;
    uint64_t measured, event_errors;
    /* identity of our process record, and what to join again with if a reaper of another PID
     * namespace freed it as stale (see devstate.h) */
    char grant[128];
    uint32_t share_bp;
    int mode, weight, priority, paced;
    int32_t pid;
    uint32_t id;
    int64_t joined_ns, beat_ns;
    uint64_t rejoins;
};

/* share_bp: 0..10000; mode: GS_CTL_*; returns 0 or -1 (device state full). */
int gs_engine_init(struct gs_engine *e, struct gs_devstate *ds, const char *grant, uint32_t share_bp,
                   int mode, int weight, int priority, int32_t pid, uint32_t id,
                   const struct gs_gpu_ops *ops, void *ops_ctx, int64_t now);
/* Before a launch on `stream`: 0 = launch now (*slot is the event pair to hand to gs_engine_after,
 * -1 = not measured); >0 = sleep that many ns and ask again. slept_ns: how long the caller slept
 * since its previous call for this same launch (0 the first time). */
int64_t gs_engine_before(struct gs_engine *e, int64_t now, void *stream, int64_t slept_ns, int *slot);
/* After the launch (ok = the driver accepted it): records the pair's end event, or with slot -1 on the
 * light path the drain event when neighbours need it. Reads no clock: it runs on every launch. */
void gs_engine_after(struct gs_engine *e, void *stream, int slot, int ok);
/* Periodic: detect completion, accrue, refill, publish, heartbeat (see gs_engine_poll_delay). */
void gs_engine_poll(struct gs_engine *e, int64_t now);
/* How long the poller may sleep after gs_engine_poll(e, now): POLL while work is queued, or while
 * a measured process beside neighbours launched within POLL_ACTIVE; IDLE_POLL otherwise. pacer.c's
 * poller and the simulation in tests/test_controller.c both poll by this. */
int64_t gs_engine_poll_delay(const struct gs_engine *e, int64_t now);
void gs_engine_fini(struct gs_engine *e);
/* The rate the controller currently allots this engine's slice (basis points). */
uint32_t gs_engine_rate(struct gs_engine *e, int64_t now);
#endif
