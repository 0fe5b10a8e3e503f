/* Process-wide enforcer state, set once by gs_init(). The pacer may read these. */
#ifndef GPUSLICE_STATE_H
#define GPUSLICE_STATE_H
#include "gpuslice/config.h"
#include "gpuslice/region.h"

extern struct gs_config gs_cfg;        /* valid when gs_state_now() is ACTIVE */
extern struct gs_region *gs_shared;    /* the slice's region (never NULL when ACTIVE) */
extern int32_t gs_self_pid;            /* getpid() as of the last attach (changes after fork) */
extern int gs_self_slot;               /* our process record in the region, -1 before attach */
int gs_state_now(void);                /* enum gs_state; runs gs_init() on first use */
/* Our process record index (attaching on first use); -1 on failure. Takes the region lock. */
int gs_attach_slot(void);
#endif
