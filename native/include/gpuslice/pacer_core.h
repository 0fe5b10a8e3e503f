/* gpuslice pacer engine: one per (process, device). It charges the process's launches to its slice's
 * credit (learned per-kernel costs, corrected by sampled event pairs), publishes them in the
 * per-device state, runs the controller and tells the launch hook how long to hold a launch back. It
 * never sleeps and never calls CUDA itself: GPU operations come through gs_gpu_ops (CUDA events in
 * pacer.c, a simulated device in the tests), time comes in as an argument.
 *
 * Paths (README-compute.md, "Paths"), re-decided every 10 ms:
 *   light     not paced (no share, 100 %, mode off): two relaxed stores per launch, never waits;
 *   free      paced, launch-bound: one atomic charge per launch against the slice's credit, no lock,
 *             an event pair for 1 launch in 16 of each kernel shape; waits only while over its share;
 *   turns     paced, offered load above 1 (it would keep the device busy alone): every launch under
 *             the state lock with an event pair, taking turns with the other turn-taking processes
 *             so two saturating loops do not preempt each other every hardware time slice;
 *   yield     a low-priority preemptive process while a preemptive high-priority process is on the
 *             device (coloc.c): holds back while that one is queued, and otherwise keeps at most
 *             YIELD_QUEUE of predicted work in flight; its own share (if any) is held as on free.
 * Co-location modes (config.h's enum gs_colocation) decide who yields: see coloc.c. */
#ifndef GPUSLICE_PACER_CORE_H
#define GPUSLICE_PACER_CORE_H
#include <stdint.h>
#include "gpuslice/config.h"
#include "gpuslice/controller.h"
#include "gpuslice/costmodel.h"
#include "gpuslice/devstate.h"
#include "gpuslice/policy.h"

/* Launches measured at once per process and device: each measured launch gets an event pair (start
 * recorded before it, end after it on the same stream). When all 256 are outstanding the next
 * measured launch waits for the oldest to finish; a sampled (free) launch goes unmeasured instead. */
#define GS_ENG_RING 256
/* The most a pair started on an empty queue loses as its launch gap (its start record to its launch's
 * return). A launch call takes 3-10 us (plus the state lock on a sampled launch); a longer one blocked
 * (a full launch queue, a synchronous driver), and the start event may have run anywhere inside that
 * block: taking all of it off would charge a kernel that ran meanwhile nothing. */
#define GS_ENG_GAP_MAX_NS 20000LL

struct gs_gpu_ops {
    int (*record_start)(void *ctx, int idx, void *stream);  /* 0 ok */
    int (*record_end)(void *ctx, int idx, void *stream);    /* 0 ok */
    int (*query_end)(void *ctx, int idx);                   /* 1 done, 0 pending, <0 error */
    int64_t (*elapsed)(void *ctx, int idx);                 /* ns start..end of pair idx; <0 error */
    /* optional (NULL = never): 1 when `stream` is being captured into a graph; such launches do
     * not run now, so they are neither paced nor timed (an event would join the graph), and no drain
     * is recorded after them. The queries above and below look in the thread's relaxed capture mode
     * (pacer.c), so another thread's capture in global mode is not invalidated by them */
    int (*capturing)(void *ctx, void *stream);
    /* optional (NULL = no drain tracking): one reusable event re-recorded after each launch of a
     * light high-priority process, and whether its latest record has completed (1 done, 0 pending,
     * <0 error). It tells low-priority neighbours that the process's queue is not yet drained (a
     * CUDA graph launch, a batch of long kernels) at the cost of one record per launch. */
    int (*record_drain)(void *ctx, void *stream);
    int (*query_drain)(void *ctx);
    /* optional (NULL = the yield path predicts its queue from costs alone): completion markers of a
     * yield-path process, GS_ENG_MARKS reusable events; query 1 done, 0 pending, <0 error */
    int (*record_mark)(void *ctx, int idx, void *stream);
    int (*query_mark)(void *ctx, int idx);
    /* optional: wake the poller now (it may be in a 5-ms idle sleep). Called when a launch arms a
     * drain record while none was pending and the poller said it sleeps longer than DRAIN_POLL
     * (poller_cold): the start of a request after idle time, whose queue neighbours must see within
     * DRAIN_POLL, not IDLE_POLL. Within DRAIN_HOT of a launch the poller ticks on its own timer:
     * a wake per launch cost the launching thread more than the record (controller.h DRAIN_HOT) */
    void (*wake)(void *ctx);
    /* optional (NULL = every pair is taken as started behind queued work): whether pair idx's start
     * event has completed (1 done, 0 pending, <0 error), asked right after its kernel was launched,
     * and the clock the engine's `now` comes from. A start already done then ran on an empty queue:
     * the pair also holds the time the kernel took to reach the GPU after it (the launch call), which
     * the engine takes off (see account_pair in pacer_core.c). */
    int (*query_start)(void *ctx, int idx);
    int64_t (*now)(void *ctx);
};

/* completion markers of the yield path (coloc.c) */
#define GS_ENG_MARKS 64
/* high-priority processes a yield-path engine watches (found at each path recheck) */
#define GS_ENG_WATCH 8

enum { GS_RING_FREE = 0, GS_RING_RESERVED = 1, GS_RING_RECORDED = 2, GS_RING_VOID = 3 };

/* Why the yield gate held a launch (gs_coloc_yield_gate), the first four from gs_eng_high_queued: a
 * high-priority neighbour's measured busy flag; its poller's look saw a backlog (pending DRAIN_SHORT, or
 * DRAIN_BACKLOG_LAUNCHES launches behind the last drained look); its launch after a quiet spell, not yet
 * looked at (DRAIN_LATE); an enforcer that publishes no looks (YIELD_GAP after each launch). Then our own
 * queue at YIELD_QUEUE. */
enum gs_yield_why { GS_YW_NONE, GS_YW_BUSY, GS_YW_BACKLOG, GS_YW_LATE, GS_YW_NO_LOOKS, GS_YW_OWN_QUEUE, GS_YW_N };

/* What gs_engine_before hands to gs_engine_after for one launch. The caller keeps one ticket for
 * all the gs_engine_before calls of one launch (it sums the sleeps). */
struct gs_ticket {
    int slot;            /* event pair, -1 = not measured */
    int64_t charged;     /* charged to the credit at launch (refunded if the launch fails) */
    int64_t slept_total; /* slept for this launch so far */
    int yield;           /* went on the yield path: gs_engine_after may record a completion marker */
    int yield_held;      /* this call's wait is the yield gate's (neighbours' queues or our own), not the credit's */
    int yield_why;       /* and why (enum gs_yield_why): the next call counts the sleep that followed to it */
    int captured;        /* into a stream being captured into a CUDA graph: 1 yes, 0 no, -1 not asked (the light
                            path of a process nobody yields to). Such a launch runs only with the graph: it is
                            neither paced, timed, a queue for neighbours nor followed by a drain record */
};

struct gs_engine {
    struct gs_devstate *ds;
    int slice, proc;
    const struct gs_gpu_ops *ops;
    void *ops_ctx;
    int light_base;       /* unpaced (share 0/100 %, mode off): needs no measurement for itself */
    int path;             /* GS_DS_PATH_*, re-decided every PATH_RECHECK (atomic: launch threads read it) */
    int turns;            /* paced and saturating (offered load): takes turns when measured */
    int64_t path_check_ns;
    int drain_wanted;     /* high priority, a low-priority preemptive/tidal neighbour: track queue drain */
    int drain_pending;    /* a drain record may still be running (atomic; launch threads + poller) */
    uint32_t drain_gen;   /* bumped after each drain record (atomic), see gs_engine_poll */
    int64_t drain_since_ns; /* the poller has seen the drain pending since (0: not), coloc.c */
    uint32_t drain_done_gen; /* drain_gen at its last "drained" look */
    int drain_backlog;      /* a backlog published (drain_backlog_ns) */
    int poller_cold;        /* the poller is going to sleep longer than DRAIN_POLL: a launch that arms a
                               drain record wakes it (atomic, seq_cst against drain_pending) */
    uint8_t ring[GS_ENG_RING];
    uint64_t ring_key[GS_ENG_RING];   /* kernel shape of each pair (0 = none: charge as measured) */
    int64_t ring_charged[GS_ENG_RING]; /* charged at its launch */
    int64_t ring_launch_ns[GS_ENG_RING];
    int64_t ring_rs_ns[GS_ENG_RING];  /* when its start event was recorded (ops->now, else the launch) */
    int64_t ring_gap_ns[GS_ENG_RING]; /* its start ran on an empty queue: launch call time inside it */
    int head, tail, outstanding;   /* pairs handed out: [tail, head) */
    struct gs_costmodel cm;
    int64_t cost_ns;      /* mean GPU time per measured launch (EWMA of pairs), 0 = unknown */
    int64_t cost_dev_ns;  /* mean absolute deviation (EWMA): neighbours are told a late-biased end
                             (mean + 2 dev), because entering early costs an overlap, late only a
                             short idle gap bounded by the poll */
    int64_t cost_avg_ns;  /* long-run mean GPU time per launch (EWMA 1/64): the charge of a launch
                             whose kernel shape is not known yet. The fast mean follows phases of a
                             loop (20 launches of 500 us, then 200 of 10 us), so right after the big
                             ones it would charge each small launch ~400 us (simulation: a 90 %
                             slice of such a loop reached 80 %) */
    /* offered load (see controller.h): GPU time asked and CPU time between launches, summed by the
     * launching threads, turned into offered_bp by the poller every LOAD_WINDOW */
    int64_t ol_cost, ol_cpu, ol_launches, ol_start_ns;
    int64_t last_before_ns, last_after_ns; /* the previous launch: when it went, when its call returned */
    uint32_t offered_bp;
    /* published by the poller under the lock (launching threads only add to these) */
    int64_t pub_charged, pub_launches, pub_throttled;
    int64_t last_reap_ns;
    uint32_t rate_bp;     /* cached allocation (recomputed every ms) */
    int others;           /* other processes on the device (recounted every ms): 0 = skip the scans */
    int64_t rate_at_ns;
    uint64_t measured, sampled_clean, sampled_dirty, event_errors;
    uint64_t sampled_gap;  /* pairs whose start ran on an empty queue (the launch gap taken off) */
    int64_t gap_total_ns;  /* the launch-gap time taken off those pairs */
    /* where the charge came from (gs_engine_stats; issue 12's N=8 over-charge could not be split
     * without them): launches and what they were charged when made (lock-free adds); measured pairs,
     * by kind, with what they were charged at launch and what they finally cost (under the lock) */
    uint64_t st_launches;
    int64_t st_launch_charged_ns;
    int64_t st_clean_launch_ns, st_clean_cost_ns;   /* clean pairs: charged at launch, measured (less gap) */
    int64_t st_dirty_launch_ns, st_dirty_raw_ns, st_dirty_cost_ns; /* dirty: at launch, pair (less the bias), learned */
    uint64_t st_dirty_keyless;                      /* dirty pairs without a shape: charged raw */
    /* what a timing-event pair adds to its kernel on this device, taken off every pair (pairbias.h;
     * 0 = not measured: pairs are charged raw). Set by the caller (atomic store) once measured, after the
     * engine is in use: pairs harvested before are charged raw. */
    int64_t pair_bias_ns;
    uint32_t unknown_seen; /* launches of shapes the full table cannot hold (sampled 1 in 16) */
    /* identity of our process record, and what to join again with if a reaper of another PID
     * namespace freed it as stale (see devstate.h) */
    char grant[128];
    uint32_t share_bp;
    int mode, weight, priority, paced;
    int32_t pid;
    uint32_t id;
    int64_t joined_ns, beat_ns;
    uint64_t rejoins;
    /* co-location (coloc.c): the slice's mode, and on the yield path the predicted end of this
     * process's queued work, re-anchored by completion markers */
    int colocation;                    /* enum gs_colocation */
    int watch[GS_ENG_WATCH], nwatch;   /* proc records of preemptive high-priority neighbours */
    int64_t yq_end;                    /* predicted end of the work launched on the yield path */
    int64_t mark_end[GS_ENG_MARKS];    /* yq_end when marker i was recorded */
    int mhead, mcount, mark_busy;      /* ring [mhead - mcount, mhead); mark_busy: spin flag */
    int64_t mark_last_end;             /* yq_end at the newest marker */
    int yield_held;                    /* the last gate held a launch for a high-priority neighbour */
    uint64_t yield_entries, marks_late, marks_early;
    /* the time launch threads slept in the yield gate, by why (enum gs_yield_why; gs_engine_stats): where
     * a yielding trainer's lost throughput went (issue 13: 0.72 of its idle bound under the spatial gate,
     * its cause not measured before these) */
    int64_t st_yield_ns[GS_YW_N];
    /* tidal: the schedule (n = 0: follow the high-priority slices' idle time) */
    struct gs_tidal tidal;
    int tidal_base_pct;                /* hours no span covers; floor of the idle-following share */
    int tidal_hour;                    /* the current UTC hour, set by the caller (pacer.c, the plant) */
    uint32_t tidal_busy_ppm;           /* EWMA of the high-priority slices' queued fraction */
    int64_t tidal_seen_ns, tidal_set_ns;
    /* the device's policy roster (policy.h): pol[pol_cur] is the set in use, the other one is where the
     * next read goes; every slice's policy, our own included, comes from it when it is present, never
     * from a record a tenant can write. pol_pack[i]: slice record i's policy as neighbours' scans see it
     * (gs_pol_pack; 0 = not worked out yet: gs_eng_pol works it out), refreshed every recount. */
    struct gs_policy_set pol[2];
    int pol_cur;                       /* atomic: launch threads read pol[pol_cur] */
    int pol_reading;                   /* atomic flag: one thread reads the folder at a time */
    int64_t pol_checked_ns;
    uint64_t pol_pack[GS_DS_MAX_SLICES];
    uint32_t pol_own_listed;           /* our grant is in the roster (atomic) */
    /* pol_canon[i]: the record that speaks for record i's grant in the allocation (i itself, an earlier
     * record of the same grant, or ours); set with the packs, read by gs_engine_rate (poller only) */
    int8_t pol_canon[GS_DS_MAX_SLICES];
    /* the slice's credit [0] and its refill clock [1]: in the slice's own region when it has one
     * (gs_engine_set_credit_home; only the slice's processes can write it), else in its slice record,
     * which every tenant on the device can write (a neighbour kept it at maximum debt: issue 15) */
    int64_t *credit_home;
    int pol_packed;                    /* pol_pack holds values (the poller's) */
};

/* share_bp: 0..10000; mode: GS_CTL_*; returns 0 or -1 (device state full). The engine starts
 * preemptive; gs_engine_set_colocation, right after, says otherwise (and readies a low-priority
 * preemptive one for the yield path). */
int gs_engine_init(struct gs_engine *e, struct gs_devstate *ds, const char *grant, uint32_t share_bp,
                   int mode, int weight, int priority, int32_t pid, uint32_t id,
                   const struct gs_gpu_ops *ops, void *ops_ctx, int64_t now);
/* Right after gs_engine_init, before the first launch: colocation (enum gs_colocation) and for tidal
 * its schedule (NULL or n = 0: follow the high-priority slices' idle time) and base_pct (hours no
 * span covers, the floor of the idle-following share; 0 = none). A tidal slice is paced from here
 * on, whatever its compute share; a low-priority preemptive one learns kernel costs for the yield
 * path. 0, or -1 when the state lock failed (the slice keeps its defaults). */
int gs_engine_set_colocation(struct gs_engine *e, int colocation, const struct gs_tidal *tidal, int base_pct);
/* Right after gs_engine_init: keep the slice's credit in home[0] and its refill clock in home[1] (two
 * aligned int64s every process of the slice maps, and no other slice can write: the slice's region,
 * pacer.c) instead of the slice record. When no other process of the slice is on the device, both
 * start at 0, as a new slice record's do. 0, or -1 when the state lock failed (the record keeps it). */
int gs_engine_set_credit_home(struct gs_engine *e, int64_t *home);
/* Before a launch of kernel shape `key` (gs_cost_key; 0 = unknown) on `stream`: 0 = launch now
 * (*t goes to gs_engine_after); >0 = sleep that many ns and ask again. slept_ns: how long the caller
 * slept since its previous call for this same launch (0 the first time). */
int64_t gs_engine_before(struct gs_engine *e, int64_t now, void *stream, uint64_t key, int64_t slept_ns,
                         struct gs_ticket *t);
/* After the launch (ok = the driver accepted it): records the pair's end event, or on the light path
 * the drain event when neighbours need it; refunds a refused launch. now: the clock after the launch
 * for a paced engine (its offered load leaves out time blocked in the driver); 0 when not read (the
 * light path reads no clock here: it runs on every launch). */
void gs_engine_after(struct gs_engine *e, int64_t now, void *stream, const struct gs_ticket *t, int ok);
/* Periodic: detect completion, charge, refill, publish, heartbeat (see gs_engine_poll_delay). */
void gs_engine_poll(struct gs_engine *e, int64_t now);
/* How long the poller may sleep after gs_engine_poll(e, now): POLL while work is queued, or while
 * a paced process beside neighbours launched within POLL_ACTIVE; DRAIN_SPIN..DRAIN_POLL while a drain
 * record is pending, or on the light path within DRAIN_HOT of a launch that records them; IDLE_POLL
 * otherwise. A sleep longer than DRAIN_POLL sets poller_cold (the next armed record wakes the poller).
 * pacer.c's poller and the plant in tests/plant.h both poll by this. */
int64_t gs_engine_poll_delay(struct gs_engine *e, int64_t now);
void gs_engine_fini(struct gs_engine *e);
/* The engine's charge counters as one JSON object into buf (what gpuslice_pacer_stats hands a
 * caller; README-compute.md "Charge counters"). Returns what snprintf returns. */
int gs_engine_stats(const struct gs_engine *e, char *buf, size_t len);
/* The rate the controller currently allots this engine's slice (basis points). Under the state lock, right
 * after gs_eng_policy_locked: it counts the records packed there, one entry per grant. */
uint32_t gs_engine_rate(struct gs_engine *e, int64_t now);

/* ---- shared by pacer_core.c, pairs.c and turns.c (not for callers) ---- */
/* What a harvest knows of the other processes (looked up at its first pair) */
struct gs_eng_others {
    int known, busy;     /* busy: one has measured work outstanding */
    int64_t last_launch; /* the latest launch of any of them */
};
/* Under the lock: a completed pair i of ns: update the engine's means and the shape's cost, and
 * return what the launch really cost (pairs.c). */
int64_t gs_eng_account_pair(struct gs_engine *e, int i, int64_t ns, struct gs_eng_others *o);
int gs_eng_want_live(const struct gs_ds_proc *p, int64_t now);
/* Under the state lock: how long a measured launch must wait now (0: go): a low-priority process
 * yields to high-priority work, a paced one to its credit, a turn-taking one takes its turn. */
int64_t gs_eng_wait_locked(struct gs_engine *e, struct gs_ds_proc *me, int64_t now);
/* The policy of slice record i as this engine must take it (policy.h): our own slice's is the engine's
 * (from our root-written config or the roster); another slice's comes from the roster when there is
 * one (a slice the roster does not list counts as low priority, weight 1 and share 0: it takes nothing
 * from anyone's guarantee); without a roster, from its record (range-checked). Lock-free. */
struct gs_pol gs_eng_pol(struct gs_engine *e, int i);
/* The slice's credit and refill clock, wherever they are kept (gs_engine_set_credit_home). */
int64_t *gs_eng_credit(struct gs_engine *e);
int64_t *gs_eng_credit_last(struct gs_engine *e);
/* Both as a controller bucket, for a gate (gs_ctl_gate). */
struct gs_ctl_bucket gs_eng_bucket(struct gs_engine *e);
/* Poller: read the roster again when GS_POL_RECHECK_NS passed and its folder changed (no lock held). */
void gs_eng_policy_refresh(struct gs_engine *e, int64_t now);
/* Under the state lock, at each recount: our own policy from the roster (when it lists us), written back
 * into our slice record `s`, and every other slice's packed into pol_pack. */
void gs_eng_policy_locked(struct gs_engine *e, struct gs_ds_slice *s);
/* An engine that stops recounting (the light path's beat) drops its packs: gs_eng_pol looks up instead. */
void gs_eng_policy_forget(struct gs_engine *e);
/* Lock-free: the path this engine's launches take now (re-decided every PATH_RECHECK). */
int gs_eng_path(struct gs_engine *e, int64_t now);
/* ---- coloc.c ---- */
/* Is this (high-priority) process record queued: measured work outstanding, or (GS_DS_PROC_DRAINS)
 * its poller's latest look saw its drain pending, or (older enforcers) launched within YIELD_GAP?
 * GS_YW_NONE (0) if not, else why (enum gs_yield_why: BUSY .. NO_LOOKS). */
int gs_eng_high_queued(const struct gs_ds_proc *p, int64_t now);
/* Path recheck: the watch list of a low preemptive engine, drain_wanted of a high one. Returns 1 when
 * a low preemptive engine has a preemptive high-priority neighbour (the yield path). */
int gs_coloc_recheck(struct gs_engine *e, int64_t now);
/* Lock-free gate of a yield-path launch: 0 = go, else ns to wait (high queued, or own queue full), and
 * *why (enum gs_yield_why) the reason of the longest wait. */
int64_t gs_coloc_yield_gate(struct gs_engine *e, int64_t now, int *why);
/* A yield-path launch of predicted cost charge_ns went (lock-free). */
void gs_coloc_yield_commit(struct gs_engine *e, int64_t now, int64_t charge_ns);
/* After a yield-path launch on `stream`: record a completion marker when one is due. */
void gs_coloc_after(struct gs_engine *e, void *stream);
/* From the poll: a high-priority process's pending drain record, published as drain_seen_ns. */
void gs_coloc_drain_poll(struct gs_engine *e, int64_t now);
/* How long the poller may sleep while a drain record is pending (DRAIN_SPIN .. DRAIN_POLL, and at least
 * until the latest launch is DRAIN_AGE old: gs_coloc_drain_poll does not look at a younger record). */
int64_t gs_coloc_drain_delay(const struct gs_engine *e, int64_t now);
/* Harvest completed markers, re-anchoring the predicted queue end (launch threads and the poller). */
void gs_coloc_harvest(struct gs_engine *e, int64_t now);
/* Under the state lock, from the poll: a tidal slice's share (sample the high-priority slices'
 * queued state, recompute every TIDAL_EVERY). */
void gs_coloc_tidal_locked(struct gs_engine *e, struct gs_ds_slice *s, int64_t now);
#endif
