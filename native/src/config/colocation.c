/* The co-location keys of the slice file (native/README.md): colocation=shared|preemptive|tidal and a
 * tidal slice's schedule, tidal_schedule=<from>-<to>:<percent>[,...]. Pure text -> struct, so the
 * fuzzer and the Python parser's cross-tests drive it through gs_config_parse_text; the pacer asks
 * gs_tidal_pct_at for the share of the current hour. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "gpuslice/config.h"

static const char *const names[] = {"preemptive", "shared", "tidal"};

int gs_coloc_parse(const char *v)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) return i;
    return -1;
}

const char *gs_coloc_name(int colocation)
{
    return colocation >= 0 && colocation < 3 ? names[colocation] : "?";
}

/* A whole number of at most 3 digits at *p (advanced past it); -1 when there is none. */
static int number(const char **p)
{
    int v = 0, n = 0;
    while (isdigit((unsigned char)**p) && n < 4) {
        v = v * 10 + (**p - '0');
        (*p)++;
        n++;
    }
    return n == 0 || n > 3 ? -1 : v;
}

static void skip_blanks(const char **p)
{
    while (**p == ' ' || **p == '\t') (*p)++;
}

/* One span "<from>-<to>:<pct>" at *p; 0 or -1 with err. */
static int span(const char **p, struct gs_tidal_span *s, char *err, size_t errlen)
{
    const char *start = *p;
    int from = number(p), to = -1, pct = -1;
    if (from >= 0 && **p == '-') {
        (*p)++;
        to = number(p);
    }
    if (to >= 0 && **p == ':') {
        (*p)++;
        pct = number(p);
    }
    int len = (int)strcspn(start, ",");
    if (pct < 0 || (**p && **p != ',' && **p != ' ' && **p != '\t')) {
        snprintf(err, errlen, "'%.*s' is not a span <from>-<to>:<percent> (e.g. 8-20:30)", len > 40 ? 40 : len, start);
        return -1;
    }
    if (from > 23 || to < 1 || to > 24 || from == to) {
        snprintf(err, errlen, "'%.*s': hours are whole UTC hours, from 0..23 to 1..24 (exclusive), not equal",
                 len > 40 ? 40 : len, start);
        return -1;
    }
    if (pct < 1 || pct > 100) {
        snprintf(err, errlen, "'%.*s': percent %d is not allowed; expected 1..100", len > 40 ? 40 : len, start, pct);
        return -1;
    }
    s->from = (uint8_t)from;
    s->to = (uint8_t)to;
    s->pct = (uint8_t)pct;
    return 0;
}

int gs_tidal_parse(const char *v, struct gs_tidal *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    uint32_t covered = 0;
    const char *p = v;
    for (;;) {
        skip_blanks(&p);
        if (!*p) break;
        if (t->n == GS_TIDAL_MAX_SPANS) {
            snprintf(err, errlen, "more than %d spans", GS_TIDAL_MAX_SPANS);
            return -1;
        }
        struct gs_tidal_span *s = &t->span[t->n];
        if (span(&p, s, err, errlen)) return -1;
        int hours = s->to > s->from ? s->to - s->from : s->to + 24 - s->from; /* 22-6 wraps: 8 */
        for (int k = 0; k < hours; k++) {
            int h = (s->from + k) % 24;
            if (covered & (1u << h)) {
                snprintf(err, errlen, "span %d-%d covers hour %d, which an earlier span covers too", s->from, s->to, h);
                return -1;
            }
            covered |= 1u << h;
        }
        t->n++;
        skip_blanks(&p);
        if (*p == ',') p++;
        else if (*p) {
            snprintf(err, errlen, "'%.20s': spans are separated by commas", p);
            return -1;
        }
    }
    if (!t->n) {
        snprintf(err, errlen, "empty; expected spans <from>-<to>:<percent> separated by commas (e.g. 8-20:30,20-8:100)");
        return -1;
    }
    return 0;
}

int gs_tidal_pct_at(const struct gs_tidal *t, int hour, int base_pct)
{
    for (int i = 0; i < t->n; i++) {
        const struct gs_tidal_span *s = &t->span[i];
        int in = s->to > s->from ? hour >= s->from && hour < s->to : hour >= s->from || hour < s->to;
        if (in) return s->pct;
    }
    return base_pct;
}

void gs_tidal_format(const struct gs_tidal *t, char *buf, size_t len)
{
    size_t pos = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < t->n && pos < len; i++) {
        int n = snprintf(buf + pos, len - pos, "%s%d-%d:%d", i ? "," : "", t->span[i].from, t->span[i].to,
                         t->span[i].pct);
        if (n < 0) break;
        pos += (size_t)n;
    }
}
