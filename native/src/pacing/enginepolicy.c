/* gpuslice pacer: whose word an engine takes for each slice's share, mode, weight, priority and
 * co-location (the roster and why: gpuslice/policy.h; the calls: gpuslice/pacer_core.h).
 *
 * Our own slice: the engine's values, which come from our config (a root-written slice file) and, when
 * the device has a roster that lists our grant, from the roster: a live resize arrives that way. Never
 * from our slice record, which every tenant on the device can write; we write our values back into it
 * at every poll (what `gpuslice ps` and roster-less neighbours read).
 * Another slice: from the roster when there is one. A slice it does not list counts as low priority
 * with weight 1 and no share: an unlisted process can neither make anyone yield to it nor take
 * capacity from a listed slice's guarantee (it still paces itself at its own share). Records naming
 * the same grant count once (gs_engine_rate). A tidal slice's share moves with its tide, which only it knows: that one number comes
 * from its record. Without a roster (no root manager on the node): from the records, range-checked. */
#include "gpuslice/pacer_core.h"
#include "gpuslice/log.h"
#include <string.h>

static struct gs_pol from_record(const struct gs_ds_slice *s)
{
    struct gs_pol p;
    uint32_t share = __atomic_load_n(&s->share_bp, __ATOMIC_RELAXED);
    uint8_t mode = s->mode, weight = s->weight, coloc = s->colocation;
    p.share_bp = share > GS_BP_FULL ? GS_BP_FULL : share;
    p.mode = mode <= GS_CTL_OFF ? mode : GS_CTL_HARD;
    p.weight = weight < 1 ? 1 : weight > 16 ? 16 : weight;
    p.priority = s->priority ? 1 : 0;
    p.colocation = coloc <= GS_COLOC_TIDAL ? coloc : GS_COLOC_PREEMPTIVE;
    return p;
}

static struct gs_pol own(const struct gs_engine *e)
{
    struct gs_pol p;
    p.share_bp = e->share_bp;
    p.mode = (uint8_t)e->mode;
    p.weight = (uint8_t)e->weight;
    p.priority = (uint8_t)e->priority;
    p.colocation = (uint8_t)e->colocation;
    return p;
}

/* Slice record i by the rules above, its grant read once into `grant` (a private, terminated copy: the
 * record may change under us, and every decision about it must see the same name). */
static struct gs_pol resolve_named(struct gs_engine *e, int i, const char *grant)
{
    struct gs_pol rec = from_record(gs_ds_slice(e->ds, i));
    const struct gs_policy_set *set = &e->pol[__atomic_load_n(&e->pol_cur, __ATOMIC_ACQUIRE)];
    if (!set->present) return rec;
    const struct gs_pol *listed = gs_policy_find(set, grant);
    if (!listed) {
        /* no capacity either: 31 unlisted records claiming 100 % each cut a listed 30 % slice's rate to
         * 3.1 % (issue 15's review), and root lists every slice it granted */
        rec.share_bp = 0;
        rec.priority = 1;
        rec.weight = 1;
        return rec;
    }
    struct gs_pol p = *listed;
    if (p.colocation == GS_COLOC_TIDAL) p.share_bp = rec.share_bp;
    return p;
}

/* A slice's grant is its file's name, which the node's manager chose, never the grant in its record, which is
 * what its own processes wrote (a tenant naming a listed grant there would take that grant's policy). */
static void grant_of(const struct gs_engine *e, int i, char *out)
{
    /* a slot without a name (a test's bare records) is nobody the roster lists */
    memcpy(out, e->ds->slot[i].name, GS_POL_GRANT_LEN);
    out[GS_POL_GRANT_LEN - 1] = '\0';
}

/* Looked up now, for a launch path that finds no pack (a binary search of the roster). */
static struct gs_pol resolve(struct gs_engine *e, int i)
{
    char grant[GS_POL_GRANT_LEN];
    grant_of(e, i, grant);
    return resolve_named(e, i, grant);
}

/* The record that speaks for record i's grant (named `seen[i]`) in the allocation: i itself, an earlier
 * record of the same grant, or ours for a record of our grant. One grant is one slice however many
 * records name it: a tenant that copied a listed grant's record 30 times counted 30 times (issue 15's
 * review). seen[j] holds record j's grant for each earlier j with counted[j] set. */
static int canonical(const struct gs_engine *e, int i, char (*seen)[GS_POL_GRANT_LEN], const uint8_t *counted)
{
    if (strcmp(seen[i], e->grant) == 0) return e->slice;
    for (int j = 0; j < i; j++)
        if (counted[j] && strcmp(seen[j], seen[i]) == 0) return j;
    return i;
}

struct gs_pol gs_eng_pol(struct gs_engine *e, int i)
{
    struct gs_pol p;
    if (i == e->slice) return own(e);
    if (i < 0 || i >= GS_DS_MAX_SLICES) {
        memset(&p, 0, sizeof p);
        p.priority = 1;
        p.weight = 1;
        return p;
    }
    if (gs_pol_unpack(__atomic_load_n(&e->pol_pack[i], __ATOMIC_RELAXED), &p)) return p;
    return resolve(e, i);
}

/* A file the roster read left out counts for nothing: its slice is unlisted (no share, low priority) in
 * this process's allocation, so say it, the first times and then at every power of two. */
static void say_refused(const struct gs_engine *e, uint64_t more)
{
    static uint64_t said;
    if (!more) return;
    uint64_t n = __atomic_add_fetch(&said, 1, __ATOMIC_RELAXED);
    if (n <= 2 || (n & (n - 1)) == 0)
        GS_WARN("policy roster %s/%s.policy: %llu file(s) left out (not a regular file of one link owned by root "
                "or this user and written by nobody else, not a slice file naming its grant, over %d bytes, or "
                "past %d grants): their slices count as unlisted here (report %llu)",
                e->ds->dir, e->ds->uuid, (unsigned long long)more, GS_POL_FILE_MAX, GS_POL_MAX,
                (unsigned long long)n);
}

void gs_eng_policy_refresh(struct gs_engine *e, int64_t now)
{
    if (__atomic_exchange_n(&e->pol_reading, 1, __ATOMIC_ACQUIRE)) return; /* another thread is at it */
    if (e->pol_checked_ns == 0 || now - e->pol_checked_ns >= GS_POL_RECHECK_NS || now < e->pol_checked_ns) {
        e->pol_checked_ns = now;
        int cur = __atomic_load_n(&e->pol_cur, __ATOMIC_RELAXED);
        /* the other set is read by nobody: launch threads took the current one at most a few us ago,
         * and the last swap was at least RECHECK ago */
        int changed = gs_policy_read(e->ds->dir, e->ds->uuid, &e->pol[cur], &e->pol[1 - cur]);
        say_refused(e, e->pol[1 - cur].refused - e->pol[cur].refused);
        if (changed) {
            __atomic_store_n(&e->pol_cur, 1 - cur, __ATOMIC_RELEASE);
            __atomic_store_n(&e->rate_at_ns, 0, __ATOMIC_RELAXED); /* recount the allocation now */
        }
    }
    __atomic_store_n(&e->pol_reading, 0, __ATOMIC_RELEASE);
}

void gs_eng_policy_locked(struct gs_engine *e, struct gs_ds_slice *s)
{
    const struct gs_policy_set *set = &e->pol[__atomic_load_n(&e->pol_cur, __ATOMIC_ACQUIRE)];
    const struct gs_pol *p = set->present ? gs_policy_find(set, e->grant) : NULL;
    __atomic_store_n(&e->pol_own_listed, p != NULL, __ATOMIC_RELAXED);
    if (p) {
        /* pacing on or off is decided when a process starts: a paced slice keeps a share in (0, 100 %)
         * and a mode that paces; a tidal slice's share is its tide's */
        if (e->paced && e->colocation != GS_COLOC_TIDAL && p->share_bp > 0 && p->share_bp < GS_BP_FULL)
            e->share_bp = p->share_bp;
        if (e->paced && p->mode != GS_CTL_OFF) e->mode = p->mode;
        e->weight = p->weight;
        e->priority = p->priority;
    }
    if (e->colocation != GS_COLOC_TIDAL) s->share_bp = e->share_bp;
    s->mode = (uint8_t)e->mode;
    s->weight = (uint8_t)e->weight;
    s->priority = (uint8_t)e->priority;
    s->colocation = (uint8_t)e->colocation;
    /* One snapshot per record: its in-use flag and its grant are read once here, and the allocation
     * (gs_engine_rate) counts exactly the records packed here, never re-reading either. A tenant flipping
     * a record's flag or name between reads had it counted as a slice of its own with a listed grant's
     * policy (the victim at 0 % in 83 % of recounts, review of this change). */
    char seen[GS_DS_MAX_SLICES][GS_POL_GRANT_LEN];
    uint8_t counted[GS_DS_MAX_SLICES] = {0};
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        uint64_t w = 0;
        e->pol_canon[i] = (int8_t)i;
        uint32_t flags = __atomic_load_n(&gs_ds_slice(e->ds, i)->flags, __ATOMIC_RELAXED);
        if (i != e->slice && (flags & GS_DS_SLICE_IN_USE)) {
            grant_of(e, i, seen[i]);
            struct gs_pol q = resolve_named(e, i, seen[i]);
            w = gs_pol_pack(&q);
            e->pol_canon[i] = (int8_t)canonical(e, i, seen, counted);
            counted[i] = e->pol_canon[i] == i;
        }
        __atomic_store_n(&e->pol_pack[i], w, __ATOMIC_RELAXED);
    }
    e->pol_packed = 1;
}

void gs_eng_policy_forget(struct gs_engine *e)
{
    if (!e->pol_packed) return;
    e->pol_packed = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) __atomic_store_n(&e->pol_pack[i], 0, __ATOMIC_RELAXED);
}
