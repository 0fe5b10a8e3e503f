/* The spatial engine's client settings (include/gpuslice/mps.h). A spatial slice covers one device, and
 * its device's daemon serves that device alone (the node side starts it with CUDA_VISIBLE_DEVICES set
 * to the device's UUID), so the client sees the slice's device as ordinal 0: the pinned limit is
 * "0=<limit>". MPS takes the limit in whole M or G; it is written in MiB, rounded down, so MPS never
 * allows more than the slice. The enforcer still accounts every allocation against the slice's limit
 * (with the per-context overhead, which MPS does not count), so it refuses first; MPS's own limit is a
 * second wall for memory the enforcer cannot see. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuslice/log.h"
#include "gpuslice/mps.h"
#include "gpuslice/policy.h"

static const char *env_or_null(gs_env_fn get, void *arg, const char *name)
{
    const char *v = get(name, arg);
    return v && *v ? v : NULL;
}

/* A whole number 1..100 from text, else -1. */
static int percent(const char *s)
{
    if (!s || !*s || strlen(s) > 3) return -1;
    int v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v >= 1 && v <= 100 ? v : -1;
}

/* The bytes of a single "0=<n>M" or "0=<n>G" entry (MPS's form for one device), else 0. */
static uint64_t one_device_limit(const char *s)
{
    if (!s || strncmp(s, "0=", 2)) return 0;
    uint64_t v = 0;
    const char *p = s + 2;
    if (*p < '0' || *p > '9') return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX >> 31) / 10) return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p[1]) return 0;
    if (*p == 'M' || *p == 'm') return v << 20;
    if (*p == 'G' || *p == 'g') return v << 30;
    return 0;
}

/* A low-priority slice that yields (colocation preemptive or tidal; tidal is refused for spatial slices
 * by the node side): a below-normal client, capped beside a high-priority neighbour. */
static int yields(const struct gs_config *c) { return c->priority != 0 && c->colocation != GS_COLOC_SHARED; }

/* Whether the yield cap is this slice's to take: it yields and was granted no share of its own. */
static int capped_beside_high(const struct gs_config *c) { return c->granted_compute == 0 && yields(c); }

/* The active-thread percentage the slice's clients may use: its compute share (as the environment may have
 * lowered it), and with no share granted, at most GS_MPS_YIELD_THREADS beside a high-priority neighbour;
 * 0 = every SM. */
static int thread_cap(const struct gs_config *c, int beside_high)
{
    int share = c->compute > 0 && c->compute < 100 ? c->compute : 0;
    int yield = beside_high && capped_beside_high(c) ? GS_MPS_YIELD_THREADS : 0;
    if (share && yield) return share < yield ? share : yield;
    return share ? share : yield;
}

int gs_mps_client_env(const struct gs_config *c, int beside_high, gs_env_fn get, void *arg, struct gs_mps_env *out)
{
    memset(out, 0, sizeof *out);
    if (c->engine != GS_ENGINE_SPATIAL) return 0;
    int n = 0;
    const char *pipe = env_or_null(get, arg, "CUDA_MPS_PIPE_DIRECTORY");
    if (c->mps_pipe_dir[0] && (!pipe || strcmp(pipe, c->mps_pipe_dir))) {
        snprintf(out->pipe_dir, sizeof out->pipe_dir, "%s", c->mps_pipe_dir);
        n++;
    }
    /* no share reserved and no high-priority neighbour (or 100): the client may use every SM, as a
     * time-sliced slice is unpaced */
    int cap = thread_cap(c, beside_high);
    if (cap) {
        int have = percent(env_or_null(get, arg, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        if (have < 0 || have > cap) {
            snprintf(out->threads, sizeof out->threads, "%d", cap);
            n++;
        }
    }
    /* A low-priority slice that yields is a below-normal client; "0" or anything else in the environment
     * would make it the equal of the high-priority slices it must yield to. A high-priority slice may
     * lower itself. */
    if (yields(c)) {
        const char *have = env_or_null(get, arg, "CUDA_MPS_CLIENT_PRIORITY");
        if (!have || strcmp(have, "1")) {
            snprintf(out->priority, sizeof out->priority, "1");
            n++;
        }
    }
    uint64_t limit = c->device_limit[0];
    if (c->process_limit < limit) limit = c->process_limit;
    if (limit != GS_UNLIMITED) {
        uint64_t mib = limit >> 20;
        if (mib == 0) mib = 1; /* MPS has no 0: the enforcer refuses everything below 1 MiB anyway */
        uint64_t have = one_device_limit(env_or_null(get, arg, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
        if (have == 0 || have > (mib << 20)) {
            snprintf(out->pinned, sizeof out->pinned, "0=%lluM", (unsigned long long)mib);
            n++;
        }
    }
    return n;
}

int gs_mps_yield_paced(const struct gs_config *c)
{
    const char *ask = getenv("GPUSLICE_SPATIAL_YIELD");
    return c->engine == GS_ENGINE_SPATIAL && c->colocation == GS_COLOC_PREEMPTIVE && c->mode != GS_MODE_OFF && ask &&
           !strcmp(ask, "1");
}

int gs_mps_high_neighbour(const struct gs_config *c, char *grant, size_t len)
{
    if (grant && len) grant[0] = 0;
    if (c->engine != GS_ENGINE_SPATIAL || !capped_beside_high(c) || c->device_count != 1 || !c->device_state_dir[0])
        return 0;
    /* the roster folder's stem is the pacer's name for the device: GPU-<hex>, a MIG instance's too (the
     * config parser takes a device as GPU-<hex> or MIG-<hex>; gpuslice.enforcer.devstate.device_stem) */
    const char *hex = c->devices[0];
    if (!strncmp(hex, "GPU-", 4) || !strncmp(hex, "MIG-", 4)) hex += 4;
    char stem[GS_UUID_LEN + 8];
    snprintf(stem, sizeof stem, "GPU-%s", hex);
    struct gs_policy_set *set = malloc(sizeof *set); /* ~9 KB: once per process, before the driver starts */
    if (!set) return 0;
    gs_policy_read(c->device_state_dir, stem, NULL, set);
    /* Only a neighbour of our own MPS daemon: MPS serves each user (in Kubernetes each user and tenant) from
     * a daemon of its own, and the daemons on one device are time-sliced, so another daemon's server does
     * not wait for our blocks' SMs. An entry that names no daemon (ours or the neighbour's) counts. */
    const struct gs_pol_entry *own = NULL;
    for (int i = 0; i < set->n && !own; i++)
        if (!strcmp(set->e[i].grant, c->grant)) own = &set->e[i];
    uint64_t daemon = own ? own->mps_id : 0;
    int found = 0;
    for (int i = 0; i < set->n && !found; i++) {
        const struct gs_pol_entry *e = &set->e[i];
        found = e->pol.priority == 0 && e->pol.colocation == GS_COLOC_PREEMPTIVE && e != own &&
                (!daemon || !e->mps_id || e->mps_id == daemon);
        if (found && grant && len) snprintf(grant, len, "%s", e->grant);
    }
    free(set);
    return found;
}

static const char *real_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

/* Whether this process starts beside a high-priority neighbour, as gs_mps_apply found it (-1: not yet):
 * gs_mps_hold sets the same values again, never a different decision. */
static int g_beside_high = -1;

/* Set what differs from the slice's settings; the number of variables set. Only what differs: in the usual
 * case the node side already put these values in the environment, and setenv racing another thread's
 * getenv is best avoided. */
static int set_client_env(const struct gs_config *c, int beside_high)
{
    struct gs_mps_env e;
    int n = gs_mps_client_env(c, beside_high, real_getenv, NULL, &e);
    if (n) {
        if (e.pipe_dir[0]) setenv("CUDA_MPS_PIPE_DIRECTORY", e.pipe_dir, 1);
        if (e.threads[0]) setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", e.threads, 1);
        if (e.pinned[0]) setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", e.pinned, 1);
        if (e.priority[0]) setenv("CUDA_MPS_CLIENT_PRIORITY", e.priority, 1);
    }
    return n;
}

void gs_mps_hold(const struct gs_config *c)
{
    if (c->engine != GS_ENGINE_SPATIAL || g_beside_high < 0) return;
    if (set_client_env(c, g_beside_high))
        GS_WARN("spatial slice: the process changed its MPS settings after the enforcer set them; set back "
                "before the driver starts");
}

void gs_mps_apply(const struct gs_config *c)
{
    if (c->engine != GS_ENGINE_SPATIAL) return;
    char high[GS_POL_GRANT_LEN];
    int beside_high = gs_mps_high_neighbour(c, high, sizeof high);
    g_beside_high = beside_high;
    set_client_env(c, beside_high);
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    const char *threads = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    const char *pinned = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    const char *prio = getenv("CUDA_MPS_CLIENT_PRIORITY");
    GS_INFO("spatial slice: MPS client of %s, active threads %s%%%s%s%s, pinned memory %s, client priority %s; "
            "launches %s", pipe ? pipe : "/tmp/nvidia-mps (the default)", threads ? threads : "100",
            beside_high ? " (yielding beside high-priority slice " : "", beside_high ? high : "", beside_high ? ")" : "",
            pinned ? pinned : "unlimited", prio && !strcmp(prio, "1") ? "below normal" : "normal",
            gs_mps_yield_paced(c) ? "not paced to a share (the yield gate: GPUSLICE_SPATIAL_YIELD=1)" : "not paced");
}
