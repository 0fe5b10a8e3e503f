/* The one clock of the enforcer's timing: CLOCK_MONOTONIC in nanoseconds. The pacing state's times
 * (devstate.h: liveness, drain looks, lock deadlines) are compared across processes of one machine, which
 * the monotonic clock allows and the wall clock (stepped by NTP) does not. Inline: the launch path reads it
 * once or twice per launch. */
#ifndef GPUSLICE_CLOCK_H
#define GPUSLICE_CLOCK_H
#include <stdint.h>
#include <time.h>

static inline int64_t gs_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif
