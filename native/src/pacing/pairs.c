/* gpuslice pacer: what one measured launch cost (see the charging notes in pacer_core.c's header and
 * README-compute.md "Measuring and charging"). The harvest (pacer_core.c) hands each completed event
 * pair here, under the state lock; the answer corrects the charge made at the launch. */
#include "gpuslice/pacer_core.h"

/* The latest launch of any other process on the device and whether one has measured work
 * outstanding (what decides whether a pair was clean): looked up once per harvest. */
static void look_at_others(struct gs_engine *e, struct gs_eng_others *o)
{
    o->known = 1;
    o->busy = 0;
    o->last_launch = 0;
    for (int i = 0; i < gs_ds_nprocs(e->ds); i++) {
        const struct gs_ds_proc *p = gs_ds_proc(e->ds, i);
        uint32_t f = __atomic_load_n(&p->flags, __ATOMIC_RELAXED);
        if (i == e->proc || !(f & GS_DS_PROC_IN_USE)) continue;
        int64_t l = __atomic_load_n(&p->last_launch_ns, __ATOMIC_RELAXED);
        if (l > o->last_launch) o->last_launch = l;
        o->busy |= (f & GS_DS_PROC_BUSY) != 0;
    }
}

int64_t gs_eng_account_pair(struct gs_engine *e, int i, int64_t ns, struct gs_eng_others *o)
{
    e->measured++;
    int64_t gap = e->ring_gap_ns[i];
    gap = gap < 0 ? 0 : gap < ns ? gap : ns;
    /* the events' own time (pairbias.h): 2.2 us a pair on an H200 whatever the kernel, 1.35-1.40x the
     * eager cost of a ResNet-50 request. It comes off what the launch gap left, at most half of that: the
     * gap is the CPU's estimate and may already hold part of it, and a kernel keeps a cost (a 6-us pair
     * with a 4-us gap and a 2.2-us bias is charged 1 us, not 0) */
    int64_t bias = __atomic_load_n(&e->pair_bias_ns, __ATOMIC_RELAXED), left = ns - gap;
    if (bias > left / 2) bias = left / 2;
    if (bias > 0) ns -= bias;
    int64_t raw = ns;
    if (gap > 0) {
        /* started on an empty queue: the launch call's time is in the pair, not the kernel's */
        ns -= gap;
        e->sampled_gap++;
        e->gap_total_ns += gap;
    }
    e->cost_avg_ns = e->cost_avg_ns ? e->cost_avg_ns + (ns - e->cost_avg_ns) / 64 : (ns > 0 ? ns : 1);
    /* EWMA 1/8: follows a change of workload within ~20 launches, smooths mixed kernels */
    if (e->cost_ns) {
        int64_t d = ns - e->cost_ns;
        e->cost_ns += d / 8;
        e->cost_dev_ns += ((d < 0 ? -d : d) - e->cost_dev_ns) / 8;
    } else {
        e->cost_ns = ns > 0 ? ns : 1;
    }
    if (!o->known) look_at_others(e, o);
    int clean = !o->busy && o->last_launch < e->ring_launch_ns[i] - GS_CTL_CLEAN_GUARD_NS;
    int64_t cost = ns;
    if (e->ring_key[i]) {
        int64_t learned = gs_cost_sample(&e->cm, e->ring_key[i], raw, gap, clean);
        if (!clean) cost = learned;
    } else if (!clean) {
        e->st_dirty_keyless++;
    }
    if (clean) {
        e->sampled_clean++;
        e->st_clean_launch_ns += e->ring_charged[i];
        e->st_clean_cost_ns += cost;
    } else {
        e->sampled_dirty++;
        e->st_dirty_launch_ns += e->ring_charged[i];
        e->st_dirty_raw_ns += raw;
        e->st_dirty_cost_ns += cost;
    }
    return cost;
}
