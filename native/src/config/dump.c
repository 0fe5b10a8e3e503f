/* gs_config_dump: a parsed configuration as key=value text (gpuslice-config-check prints it; the
 * tests compare it with what Python's slice-file writer meant). Apart from config.c, which only parses. */
#include <stdarg.h>
#include <stdio.h>

#include "gpuslice/config.h"

static size_t cat(char *buf, size_t len, size_t pos, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t cat(char *buf, size_t len, size_t pos, const char *fmt, ...)
{
    if (pos >= len) return pos;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + pos, len - pos, fmt, ap);
    va_end(ap);
    return n < 0 ? pos : pos + (size_t)n;
}

void gs_config_dump(const struct gs_config *c, char *buf, size_t len)
{
    static const char *modes[] = {"hard", "soft", "off"}, *levels[] = {"error", "warn", "info", "debug"};
    static const char *sources[] = {"none", "slice_file", "hami_env"};
    size_t p = 0;
    buf[0] = 0;
    p = cat(buf, len, p, "source=%s\nversion=%d\ngrant=%s\ndevices=", sources[c->source], c->version, c->grant);
    for (int i = 0; i < c->device_count; i++) p = cat(buf, len, p, "%s%s", i ? "," : "", c->devices[i]);
    p = cat(buf, len, p, "\n");
    if (c->memory_limit == GS_UNLIMITED) p = cat(buf, len, p, "memory_limit=unlimited\n");
    else p = cat(buf, len, p, "memory_limit=%llu\n", (unsigned long long)c->memory_limit);
    for (int i = 0; i < c->device_count; i++) {
        if (c->device_limit[i] == GS_UNLIMITED) p = cat(buf, len, p, "memory_limit.%s=unlimited\n", c->devices[i]);
        else p = cat(buf, len, p, "memory_limit.%s=%llu\n", c->devices[i], (unsigned long long)c->device_limit[i]);
    }
    if (c->device_count == 0)
        for (int i = 0; i < GS_MAX_DEVICES; i++)
            if (c->device_limit[i] != c->memory_limit)
                p = cat(buf, len, p, "memory_limit.#%d=%llu\n", i, (unsigned long long)c->device_limit[i]);
    p = cat(buf, len, p, "compute=%d\nmode=%s\nweight=%d\npriority=%d\nregion=%s\ndevice_state_dir=%s\n",
            c->compute, modes[c->mode], c->weight, c->priority, c->region, c->device_state_dir);
    static const char *policies[] = {"return", "kill", "wait"};
    p = cat(buf, len, p, "oom_policy=%s\noom_wait_ms=%d\nlog_level=%s\nfail_open=%d\n", policies[c->oom_policy], c->oom_wait_ms,
            levels[c->log_level], c->fail_open);
    if (c->process_limit == GS_UNLIMITED) p = cat(buf, len, p, "process_limit=unlimited\n");
    else p = cat(buf, len, p, "process_limit=%llu\n", (unsigned long long)c->process_limit);
    if (c->warning[0]) p = cat(buf, len, p, "warning=%s\n", c->warning);
    if (c->context_overhead == GS_UNLIMITED) p = cat(buf, len, p, "context_overhead=default\n");
    else p = cat(buf, len, p, "context_overhead=%llu\n", (unsigned long long)c->context_overhead);
    p = cat(buf, len, p, "engine=%s\nmps_pipe_dir=%s\n", c->engine ? "spatial" : "timeslice", c->mps_pipe_dir);
    p = cat(buf, len, p, "generation=%u\n", c->generation);
    char tide[160];
    gs_tidal_format(&c->tidal, tide, sizeof tide);
    cat(buf, len, p, "colocation=%s\ntidal_schedule=%s\n", gs_coloc_name(c->colocation), tide);
}
