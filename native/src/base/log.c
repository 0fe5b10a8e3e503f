/* Logging: one line per event on stderr. vsnprintf into a stack buffer and one write() so lines
 * from threads and processes never interleave, and nothing allocates inside a hook. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuslice/log.h"

static int g_level = -1;

static int level_from_env(void)
{
    const char *e = getenv("GPUSLICE_LOG_LEVEL");
    if (!e) return GS_LOG_WARN;
    if (!strcmp(e, "error")) return GS_LOG_ERROR;
    if (!strcmp(e, "info")) return GS_LOG_INFO;
    if (!strcmp(e, "debug")) return GS_LOG_DEBUG;
    return GS_LOG_WARN;
}

void gs_log_set_level(int level) { g_level = level; }

int gs_log_level(void)
{
    if (g_level < 0) g_level = level_from_env();
    return g_level;
}

void gs_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > gs_log_level() && level != GS_LOG_ERROR) return;
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "gpuslice[%d]: %s: ", (int)getpid(), names[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(2, buf, len);
    (void)w;
}
