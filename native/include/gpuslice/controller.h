/* gpuslice compute controller: pure arithmetic, no I/O, no clock, no CUDA.
 *
 * Everything here is a function of the numbers passed in, so CI drives it with a simulated device
 * clock (native/tests/test_controller.c). Times are int64 nanoseconds on one monotonic clock;
 * shares and rates are basis points (10000 = the whole device). See native/README-compute.md.
 *
 * The loop, per slice and per device:
 *   credit(t) = clamp( credit + rate * dt - charged , -GS_CTL_DEBT_MAX_NS, GS_CTL_BURST_NS )
 * "charged" is the GPU time of the slice's launches, charged when they are made at their kernel
 * shape's learned cost and corrected by sampled event pairs (costmodel.h, pacer_core.c). credit is
 * the integral of the error (allowed - used): the I term. A launch is let through when
 *   credit + LOOKAHEAD >= 0
 * and since queued work is charged already, this acts on the error that is coming (the P term of a
 * design that charged at completion), so the queue cannot run far ahead of the allowance and the
 * 1-s windows stay tight. The clamp at +BURST is the anti-windup: time a slice leaves unused is not
 * banked beyond one burst. */
#ifndef GPUSLICE_CONTROLLER_H
#define GPUSLICE_CONTROLLER_H
#include <stdint.h>

#define GS_BP_FULL 10000

/* Modes of the controller (mapped from gs_config's enum by pacer.c). */
enum { GS_CTL_HARD = 0, GS_CTL_SOFT = 1, GS_CTL_OFF = 2 };

/* Constants, and why (README-compute.md has the long form):
 * BURST 10 ms: a paced slice may run ahead by at most 10 ms of GPU time, 1 % of a 1-s window, so a
 *   window can not exceed its share by more than 1 point from banked credit; still larger than the
 *   launch-to-start latency (~10-50 us) so the GPU does not idle while a woken thread relaunches.
 * DEBT_MAX 2 s: one pathological kernel (or a clock jump) can not block a slice for minutes.
 * ACTIVE 100 ms: a slice that launched within this counts as contending; an idle neighbour's share
 *   flows to soft slices after at most 100 ms.
 * WAIT_MIN/MAX: sleep granularity of a throttled launch (50 .. 250 us): short enough that the
 *   credit is used within 1 % of a burst, long enough not to burn a CPU core. */
#define GS_CTL_BURST_NS       10000000LL
#define GS_CTL_DEBT_MAX_NS  2000000000LL
#define GS_CTL_WANT_CAP_NS    40000000LL
/* LOOKAHEAD 4 ms: a launch may go while credit + LOOKAHEAD covers the work already queued. Without
 * it a credit-limited process keeps ~one kernel queued: on the H100 a ResNet-50 trainer set to 90 %
 * reached 82 % (the GPU waited on Python between kernels) and two slices handed the device back
 * and forth after every kernel. The debt is repaid by the I term; a 1-s window moves by <= 0.4. */
#define GS_CTL_LOOKAHEAD_NS    4000000LL
/* TURN_MIN 2 ms: a process starts a turn beside rivals only with credit for 2 ms of work, so turns
 * are not a kernel long (in the simulation with 100 us context switches, sibling processes of one
 * slice otherwise switched ~900 times a second and lost 19 % of the device). */
#define GS_CTL_TURN_MIN_NS     2000000LL
#define GS_CTL_ACTIVE_NS     100000000LL
/* Co-location (README-compute.md, "Co-location"): a low-priority preemptive process beside a preemptive
 * high-priority one takes the yield path. These may be overridden with -D (bench/gpu/coloc.py builds
 * variants to measure them; a normal build uses these values).
 * YIELD_GAP 200 us: a high-priority process counts as queued for this long after its last launch, so a
 *   low-priority process enters only gaps longer than this: between requests, not between the kernels
 *   of one (a launch-bound request's CPU gaps are 5-50 us; a decoder's sampling step between tokens
 *   ~50-150 us). Each entry costs the request a context switch when it comes back (H100, plain
 *   time-slicing: a ResNet-18 request of ~65 kernels beside a trainer took 0.7 ms longer, ~10 us a
 *   kernel; 2026-11-23-h100-compute.txt). Was 0.5 ms (PRIO_HOLD), which left a trainer beside a
 *   loop with 2 ms think times a quarter of each gap less.
 * YIELD_QUEUE 150 us: while a preemptive high-priority process is on the device and not queued, a
 *   low-priority process launches only while at most this much of its predicted GPU work is in
 *   flight: a new request waits behind at most this, plus the low-priority kernel last launched, plus
 *   a context switch (or a hardware time slice, if shorter). It is 3 x the ~50 us a throttled thread
 *   needs to wake and relaunch, so the device does not run dry while the high one is idle. In the
 *   plant (tests/test_coloc.c, trainer kernels of 20-400 us) 100/150/200/300 us gave a GPU-bound
 *   request p50 1.021/1.025/1.027/1.041 x alone and the trainer the same throughput.
 * DRAIN_POLL 100 us / DRAIN_SPIN 10 us: a high-priority process with low-priority preemptive or tidal
 *   neighbours looks at its pending drain event after half the time it has been pending, between these,
 *   and publishes each look (GS_DS_PROC_DRAINS; devstate.h). Neighbours hold only while the latest look
 *   saw a backlog (issue 13 item 1: the idle time inside a request is handed out; YIELD_GAP after every
 *   launch left a trainer beside ResNet-50 b1 0.32x its speed on the H100). DRAIN_FRESH = 2 x DRAIN_POLL:
 *   how long a sighting counts for an enforcer without looks.
 * DRAIN_SHORT 50 us: pending this long (or a second launch behind a pending one) is a backlog; one short
 *   kernel is not (holding for it: plant ResNet-50-b1-like trainer 0.49 of the idle bound, not 0.80).
 * DRAIN_LATE 50 us: a launch after this long without a look (a request's start, a stalled poller)
 *   counts queued until looked at, up to YIELD_GAP.
 * DRAIN_HOT 1 ms: for this long after its last launch such a process's poller (light path) ticks every
 *   DRAIN_SPIN on its own timer, so a launch that arms a drain record wakes it only when it sleeps longer
 *   than DRAIN_POLL (a request's first launch after idle time). A FUTEX_WAKE per armed record cost the
 *   launching thread more than the record: on the H200 a launch-bound loop of 150 launches paid 187-254 us
 *   a request for the wakes alone and 33-52 us for the records (bench/drain_cost.c,
 *   2026-11-29-h200-drain-cost.md).
 * DRAIN_AGE 5 us: the poller does not look at a record younger than this (its query, of work the GPU has
 *   likely not reached, cost the launching thread most: bench/drain_cost.c). 15 us took a ResNet-50-b1
 *   server under the spatial gate from 1.29x to 1.16x alone on the H200 but the trainer lost 6-10 %, and
 *   in the plant (tests/test_coloc.c, slice-FIFO device, launches 20 us apart) 10 us and more leave looks
 *   only behind a second launch, which then reads as a backlog: trainer 0.94 -> 0.73 of its idle bound. */
#ifndef GS_CTL_YIELD_GAP_NS
#define GS_CTL_YIELD_GAP_NS     200000LL
#endif
#ifndef GS_CTL_YIELD_QUEUE_NS
#define GS_CTL_YIELD_QUEUE_NS   150000LL
#endif
#ifndef GS_CTL_DRAIN_POLL_NS
#define GS_CTL_DRAIN_POLL_NS    100000LL
#endif
#define GS_CTL_DRAIN_FRESH_NS   (2 * GS_CTL_DRAIN_POLL_NS)
#ifndef GS_CTL_DRAIN_SPIN_NS
#define GS_CTL_DRAIN_SPIN_NS     10000LL
#endif
#ifndef GS_CTL_DRAIN_SHORT_NS
#define GS_CTL_DRAIN_SHORT_NS    50000LL
#endif
/* DRAIN_BACKLOG_LAUNCHES: this many launches since the last "drained" look, the drain still pending, is
 * a backlog too (before DRAIN_SHORT has passed) */
#ifndef GS_CTL_DRAIN_BACKLOG_LAUNCHES
#define GS_CTL_DRAIN_BACKLOG_LAUNCHES 2u
#endif
#ifndef GS_CTL_DRAIN_LATE_NS
#define GS_CTL_DRAIN_LATE_NS     50000LL
#endif
#ifndef GS_CTL_DRAIN_AGE_NS
#define GS_CTL_DRAIN_AGE_NS       5000LL
#endif
#ifndef GS_CTL_DRAIN_HOT_NS
#define GS_CTL_DRAIN_HOT_NS    1000000LL
#endif
/* a yield-path process records a completion marker after each YIELD_MARK of predicted work (and after
 * any launch while none is pending): markers re-anchor the prediction of its queue (late or early) */
#define GS_CTL_YIELD_MARK_NS    (GS_CTL_YIELD_QUEUE_NS / 2)
/* a launch of a kernel shape whose cost is not known yet counts this much in the queue */
#define GS_CTL_YIELD_UNKNOWN_NS (GS_CTL_YIELD_QUEUE_NS / 4)
/* how long a queued high-priority process's measured busy flag is believed without a fresh poll (a
 * stopped process must not hold its neighbours forever) */
#define GS_CTL_BUSY_STALE_NS  20000000LL
/* YIELD_HOLD_MAX 2 s: the longest one launch waits on the yield path for high-priority neighbours' queues
 * (pacer.c). What it waits on is what neighbours publish in the shared device state, which a tenant can
 * forge (priority high, a busy flag kept fresh): without a bound one held a neighbour's launch for as long
 * as it kept writing (30.0 s of a 30-s forgery, issue 15's review). Past it the launch goes, counted. A
 * real high-priority server with a backlog longer than this lets one low-priority launch through every
 * YIELD_HOLD_MAX: one kernel's worth of intrusion per 2 s. */
#ifndef GS_CTL_YIELD_HOLD_MAX_NS
#define GS_CTL_YIELD_HOLD_MAX_NS 2000000000LL
#endif
/* Tidal: a slice without a schedule follows the high-priority slices' idle time, the fraction of time
 * none of them is queued (as above), an EWMA with time constant TIDAL_TAU (the tide follows load over
 * seconds; a request's own rhythm must not move the share); the share is recomputed every TIDAL_EVERY
 * and never goes below TIDAL_FLOOR (or the slice's compute share, if it has one). */
#define GS_CTL_TIDAL_TAU_NS   2000000000LL
#define GS_CTL_TIDAL_EVERY_NS  100000000LL
#define GS_CTL_TIDAL_FLOOR_BP 100u
/* Pure: the share (bp) a tidal slice follows now. schedule_pct: the schedule's percent for this hour
 * (0 = no schedule: follow the idle time); busy_ppm: the high-priority slices' queued fraction (EWMA,
 * parts per million); floor_bp. */
uint32_t gs_ctl_tidal_share(int schedule_pct, uint32_t busy_ppm, uint32_t floor_bp);
/* The EWMA of the queued fraction (ppm: 1 ms steps of a 2 s constant move it by 1/2000) after dt ns in
 * state `queued` (0/1), time constant TIDAL_TAU. */
uint32_t gs_ctl_tidal_ewma(uint32_t busy_ppm, int queued, int64_t dt);
#define GS_CTL_WAIT_MIN_NS       50000LL
#define GS_CTL_WAIT_MAX_NS      250000LL
/* The pacer's poller harvests events and refreshes the shared state this often while the process
 * has work queued: it bounds how stale a neighbour's "busy" flag is at a hand-over. With nothing
 * queued it sleeps IDLE_POLL, except while a paced process beside neighbours launched within
 * POLL_ACTIVE: a launch made while the poller sleeps sets the busy flag, and only a poll (or the next
 * launch) clears it when the work is done. Sleeping 5 ms there left a finished high-priority
 * request "busy" for up to 5 ms, and a low-priority trainer beside a loop with 2 ms think times got
 * 3.7 % of its speed on the H100. After POLL_ACTIVE of silence one stale flag per idle period is
 * cheaper than 4000 wake-ups a second of an idle process. */
#define GS_CTL_POLL_NS          250000LL
#define GS_CTL_IDLE_POLL_NS    5000000LL
/* A process on the free path (README-compute.md, "Paths") is polled every ms while it launches: its
 * poller publishes the sums, refills the credit and harvests sampled pairs; a throttled launch polls
 * by itself. 250 us there cost a launch-bound service 4000 lock round trips a second for nothing. */
#define GS_CTL_POLL_FREE_NS    1000000LL
#define GS_CTL_POLL_ACTIVE_NS 1000000000LL
#define GS_CTL_WINDOW_NS    1000000000LL
/* Turns: a paced process opens a busy period only when no other process's queued work is predicted
 * to run for more than TURN_EARLY (so its events time its own kernels, not a neighbour's), and a
 * holder stops adding work once a neighbour has waited TURN_MAX. EARLY 50 us covers launch latency
 * so the device does not idle at the hand-over; MAX 10 ms bounds how long a small share waits and
 * makes hand-overs rare enough (~100/s) that their cost (~0.1-0.3 ms each) stays near 1 %. */
#define GS_CTL_TURN_EARLY_NS         0LL
#define GS_CTL_TURN_MAX_NS    10000000LL

struct gs_ctl_slice {
    uint32_t share_bp;  /* set share, 0..10000 (0 or 10000 = not paced) */
    uint8_t mode;       /* GS_CTL_* */
    uint8_t weight;     /* 1..16 */
    uint8_t priority;   /* 0 high, 1 low */
    uint8_t active;     /* wants GPU time now */
};

/* Rates (basis points of the device) for n slices, by weighted water-filling:
 *  1. guarantees: high-priority slices first, then low, each class gets min(share, what is left);
 *     when a class's shares do not fit, they are scaled in proportion to share*weight;
 *  2. the capacity nobody is guaranteed goes to active soft slices in proportion to weight (soft =
 *     elastic: uses idle capacity, falls back to its share under contention);
 *  3. inactive slices keep their guarantee (so a slice waking up is not starved for ACTIVE ns) but
 *     it is not given to others as guarantee; OFF and unpaced (0/100 %) slices get GS_BP_FULL and
 *     take no capacity from the sum (they are not paced, the others are not protected from them).
 * Writes rate_bp[i] for every i. */
void gs_ctl_allocate(const struct gs_ctl_slice *s, int n, uint32_t *rate_bp);

/* Credit of one slice (the integral term). Launches charge it when they are made (the kernel's
 * predicted cost, corrected when a sampled pair is measured), so work already queued is already
 * paid for: the P term of the earlier design (outstanding x mean cost) is the charge itself. */
struct gs_ctl_bucket {
    int64_t credit_ns;   /* allowance minus charged use, clamped */
    int64_t last_ns;     /* time of last refill */
};
/* cap_ns: BURST normally; a slice that is waiting for its turn on the device (it wants to run but a
 * neighbour holds the GPU) may bank up to WANT_CAP, so waiting does not cost it its share. */
void gs_ctl_refill(struct gs_ctl_bucket *b, int64_t now, uint32_t rate_bp, int64_t cap_ns);
/* The two halves of gs_ctl_refill, for a credit that launches change concurrently (pacer_core.c
 * applies them with a compare-and-swap): the allowance accrued since *last_ns (which it advances),
 * and the credit after adding it under the anti-windup cap. */
int64_t gs_ctl_accrue(int64_t *last_ns, int64_t now, uint32_t rate_bp);
int64_t gs_ctl_refilled(int64_t credit_ns, int64_t add_ns, int64_t cap_ns);
void gs_ctl_charge(struct gs_ctl_bucket *b, int64_t busy_ns);  /* negative = refund */
/* The credit after a charge (clamped at -DEBT_MAX and +WANT_CAP). */
int64_t gs_ctl_charged(int64_t credit_ns, int64_t busy_ns);
/* 0 = launch now; else how long to sleep before asking again (WAIT_MIN..WAIT_MAX). A launch may go
 * while credit + LOOKAHEAD - need_ns >= 0, where the credit already holds every queued launch's
 * charge and need_ns is 0, or TURN_MIN when the launch starts a turn beside rivals. (The launch's
 * own charge is not needed up front: a kernel longer than BURST + LOOKAHEAD could never go.) */
int64_t gs_ctl_gate(const struct gs_ctl_bucket *b, uint32_t rate_bp, int64_t need_ns);

/* Offered load: the GPU time a process's launches ask for per second of its own CPU time between
 * launches (sleeps in the pacer and blocking inside the driver's launch call left out, each gap
 * capped at GAP_CAP so a synchronize or think time counts as no more than 1 ms). Above 1 the CPU
 * runs ahead of the GPU: the process alone would keep the device busy (a matmul loop: ~15-40, a
 * ResNet-50 training step: ~3). Below 1 it is launch-bound: the GPU idles between its kernels
 * (ResNet-50 inference at batch 8: ~0.4), and plain time-slicing fills those gaps with the
 * neighbours' kernels at no cost. Only processes above 1 gain from taking turns (fewer preempting
 * context switches, see Turns in README-compute.md); turns would idle the device in a launch-bound
 * process's gaps. Measured over LOAD_WINDOW, with hysteresis between TURNS_ON and TURNS_OFF. */
#define GS_CTL_LOAD_WINDOW_NS 100000000LL
#define GS_CTL_GAP_CAP_NS       1000000LL
/* time inside the driver's launch call counted as the launch's own CPU work; beyond it the call was
 * blocked on a full launch queue (the GPU is behind, which is what a high load means) */
#define GS_CTL_CALL_CPU_NS        20000LL
#define GS_CTL_TURNS_ON_BP        15000u
#define GS_CTL_TURNS_OFF_BP       10000u
#define GS_CTL_LOAD_MIN_LAUNCHES  16
/* 1 = a process with this offered load (basis points, 10000 = 1.0) takes turns; was = its state now */
int gs_ctl_takes_turns(int was, uint32_t offered_bp);

/* A sampled pair is "clean" (nothing else could have run inside it) when no other process on the
 * device launched within CLEAN_GUARD before it and none has measured work outstanding: then its
 * time is charged as measured; otherwise the shape's learned cost is charged (costmodel.h). */
#define GS_CTL_CLEAN_GUARD_NS   2000000LL

/* Windowed achieved share (for gpuslice ps and the tests): busy time in the current window; when a
 * window is complete, achieved_bp is set from it and a new window starts. */
struct gs_ctl_window {
    int64_t start_ns, busy_ns, throttled_ns;
    int32_t achieved_bp;      /* last complete window, -1 = none yet */
    int32_t throttled_bp;     /* share of the last window spent with a launch held back */
};
void gs_ctl_window_add(struct gs_ctl_window *w, int64_t now, int64_t busy_ns, int64_t throttled_ns);
#endif
