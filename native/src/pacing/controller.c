/* gpuslice compute controller: the pure arithmetic of the pacer. See gpuslice/controller.h for the
 * loop and README-compute.md for why the constants are what they are. */
#include "gpuslice/controller.h"

#define GS_CTL_MAXN 64

static int paced(const struct gs_ctl_slice *s)
{
    return s->mode != GS_CTL_OFF && s->share_bp > 0 && s->share_bp < GS_BP_FULL;
}

static int64_t wclamp(uint8_t w) { return w < 1 ? 1 : (w > 16 ? 16 : w); }

/* Weighted max-min water-filling: give each member min(demand, level*weight), level chosen so the
 * capacity is used up (or every demand met). Adds the grants into g[]. Returns capacity used. */
static int64_t waterfill(int n, const int *member, const int64_t *demand, const int64_t *weight,
                         int64_t cap, int64_t *g)
{
    int done[GS_CTL_MAXN] = {0};
    int64_t used = 0;
    for (;;) {
        int64_t wsum = 0;
        for (int i = 0; i < n; i++)
            if (member[i] && !done[i]) wsum += weight[i];
        if (wsum == 0 || cap - used <= 0) break;
        int64_t left = cap - used;
        int progressed = 0;
        /* Members whose demand is below their weighted level are satisfied exactly; the level rises
         * for the others, so repeat until nobody new is satisfied. */
        for (int i = 0; i < n; i++) {
            if (!member[i] || done[i]) continue;
            if (demand[i] * wsum <= left * weight[i]) {
                g[i] += demand[i];
                used += demand[i];
                done[i] = 1;
                progressed = 1;
            }
        }
        if (progressed) continue;
        int64_t given = 0;
        for (int i = 0; i < n; i++) {
            if (!member[i] || done[i]) continue;
            int64_t x = left * weight[i] / wsum;
            g[i] += x;
            given += x;
            done[i] = 1;
        }
        used += given;
        break;
    }
    return used;
}

void gs_ctl_allocate(const struct gs_ctl_slice *s, int n, uint32_t *rate_bp)
{
    if (n > GS_CTL_MAXN) n = GS_CTL_MAXN;
    int64_t g[GS_CTL_MAXN] = {0}, demand[GS_CTL_MAXN], weight[GS_CTL_MAXN];
    int member[GS_CTL_MAXN];
    int64_t cap = GS_BP_FULL;
    for (int i = 0; i < n; i++) weight[i] = wclamp(s[i].weight);
    /* 1. guarantees, high priority first */
    for (int prio = 0; prio <= 1; prio++) {
        for (int i = 0; i < n; i++) {
            member[i] = paced(&s[i]) && s[i].active && (prio == 0 ? s[i].priority == 0 : s[i].priority != 0);
            demand[i] = s[i].share_bp;
        }
        cap -= waterfill(n, member, demand, weight, cap, g);
    }
    /* 2. idle capacity to active soft slices by weight */
    for (int i = 0; i < n; i++) {
        member[i] = paced(&s[i]) && s[i].active && s[i].mode == GS_CTL_SOFT;
        demand[i] = GS_BP_FULL - g[i];
    }
    if (cap > 0) waterfill(n, member, demand, weight, cap, g);
    /* 3. the rest */
    for (int i = 0; i < n; i++) {
        if (!paced(&s[i])) rate_bp[i] = GS_BP_FULL;
        else if (!s[i].active) rate_bp[i] = s[i].share_bp;
        else rate_bp[i] = (uint32_t)(g[i] > GS_BP_FULL ? GS_BP_FULL : g[i]);
    }
}

int64_t gs_ctl_accrue(int64_t *last_ns, int64_t now, uint32_t rate_bp)
{
    if (*last_ns == 0 || now < *last_ns) {  /* first use, or a clock that went backwards */
        *last_ns = now;
        return 0;
    }
    int64_t dt = now - *last_ns;
    *last_ns = now;
    /* dt * rate can overflow only for dt > 10^15 ns (11 days); clamp dt first */
    if (dt > GS_CTL_DEBT_MAX_NS) dt = GS_CTL_DEBT_MAX_NS;
    return dt * (int64_t)rate_bp / GS_BP_FULL;
}

int64_t gs_ctl_refilled(int64_t credit_ns, int64_t add_ns, int64_t cap_ns)
{
    /* anti-windup: never bank past the cap (but do not take away what is already there) */
    int64_t cap = credit_ns > cap_ns ? credit_ns : cap_ns;
    int64_t c = credit_ns + add_ns;
    return c > cap ? cap : c;
}

void gs_ctl_refill(struct gs_ctl_bucket *b, int64_t now, uint32_t rate_bp, int64_t cap_ns)
{
    int64_t add = gs_ctl_accrue(&b->last_ns, now, rate_bp);
    b->credit_ns = gs_ctl_refilled(b->credit_ns, add, cap_ns);
}

/* a - b, saturated: the credit lives in the 0666 pacing file, and a hostile tenant may write any value
 * there; arithmetic on it must not overflow (UB), only clamp */
static int64_t sat_sub(int64_t a, int64_t b)
{
    int64_t r;
    if (!__builtin_sub_overflow(a, b, &r)) return r;
    return b < 0 ? INT64_MAX : INT64_MIN;
}

int64_t gs_ctl_charged(int64_t credit_ns, int64_t busy_ns)
{
    int64_t c = sat_sub(credit_ns, busy_ns);
    if (c < -GS_CTL_DEBT_MAX_NS) c = -GS_CTL_DEBT_MAX_NS;
    if (c > GS_CTL_WANT_CAP_NS) c = GS_CTL_WANT_CAP_NS;
    return c;
}

void gs_ctl_charge(struct gs_ctl_bucket *b, int64_t busy_ns) { b->credit_ns = gs_ctl_charged(b->credit_ns, busy_ns); }

int64_t gs_ctl_gate(const struct gs_ctl_bucket *b, uint32_t rate_bp, int64_t need_ns)
{
    if (rate_bp >= GS_BP_FULL) return 0;
    /* credit missing before this launch */
    int64_t need = sat_sub(sat_sub(need_ns, b->credit_ns), GS_CTL_LOOKAHEAD_NS);
    if (need <= 0) return 0;
    if (rate_bp == 0 || need > GS_CTL_WAIT_MAX_NS * (int64_t)GS_BP_FULL) return GS_CTL_WAIT_MAX_NS;
    /* time until the refill covers the gap (an upper bound when other launches are refunded
     * meanwhile; WAIT_MAX keeps the re-check frequent) */
    int64_t w = need * GS_BP_FULL / rate_bp;
    if (w < GS_CTL_WAIT_MIN_NS) w = GS_CTL_WAIT_MIN_NS;
    if (w > GS_CTL_WAIT_MAX_NS) w = GS_CTL_WAIT_MAX_NS;
    return w;
}

int gs_ctl_takes_turns(int was, uint32_t offered_bp)
{
    return was ? offered_bp >= GS_CTL_TURNS_OFF_BP : offered_bp >= GS_CTL_TURNS_ON_BP;
}

void gs_ctl_window_add(struct gs_ctl_window *w, int64_t now, int64_t busy_ns, int64_t throttled_ns)
{
    if (w->start_ns == 0) {
        w->start_ns = now;
        w->achieved_bp = -1;
    }
    w->busy_ns += busy_ns;
    w->throttled_ns += throttled_ns;
    int64_t len = now - w->start_ns;
    if (len >= GS_CTL_WINDOW_NS) {
        int64_t a = w->busy_ns * GS_BP_FULL / len;
        int64_t t = w->throttled_ns * GS_BP_FULL / len;
        w->achieved_bp = (int32_t)(a < 0 ? 0 : a > GS_BP_FULL ? GS_BP_FULL : a);
        w->throttled_bp = (int32_t)(t < 0 ? 0 : t > GS_BP_FULL ? GS_BP_FULL : t);
        w->start_ns = now;
        w->busy_ns = 0;
        w->throttled_ns = 0;
    }
}

uint32_t gs_ctl_tidal_share(int schedule_pct, uint32_t busy_ppm, uint32_t floor_bp)
{
    if (schedule_pct > 0) return (uint32_t)(schedule_pct > 100 ? 100 : schedule_pct) * 100u;
    uint32_t busy_bp = busy_ppm / 100u;
    uint32_t idle = busy_bp >= GS_BP_FULL ? 0 : GS_BP_FULL - busy_bp;
    if (floor_bp > GS_BP_FULL) floor_bp = GS_BP_FULL;
    return idle < floor_bp ? floor_bp : idle;
}

uint32_t gs_ctl_tidal_ewma(uint32_t busy_ppm, int queued, int64_t dt)
{
    if (dt <= 0) return busy_ppm;
    if (dt > GS_CTL_TIDAL_TAU_NS) dt = GS_CTL_TIDAL_TAU_NS;
    int64_t target = queued ? 1000000 : 0;
    int64_t b = busy_ppm + (target - (int64_t)busy_ppm) * dt / GS_CTL_TIDAL_TAU_NS;
    return (uint32_t)(b < 0 ? 0 : b > 1000000 ? 1000000 : b);
}
