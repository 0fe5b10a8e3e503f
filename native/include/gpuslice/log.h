/* One-line logs to stderr, prefixed "gpuslice[pid]: level:". Level from the slice (log_level) or
 * GPUSLICE_LOG_LEVEL; errors always print. Never allocates, safe inside hooks. */
#ifndef GPUSLICE_LOG_H
#define GPUSLICE_LOG_H
#include "gpuslice/config.h"

void gs_log_set_level(int level);
int gs_log_level(void);
void gs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define GS_ERROR(...) gs_log(GS_LOG_ERROR, __VA_ARGS__)
#define GS_WARN(...) gs_log(GS_LOG_WARN, __VA_ARGS__)
#define GS_INFO(...) gs_log(GS_LOG_INFO, __VA_ARGS__)
#define GS_DEBUG(...) do { if (gs_log_level() >= GS_LOG_DEBUG) gs_log(GS_LOG_DEBUG, __VA_ARGS__); } while (0)
#endif
