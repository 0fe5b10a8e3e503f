/* Process-wide enforcer state, decided once by gs_init() (src/core/init.c) on the first hooked call.
 * The hooks and the accounting read it; start-up calls neither of them (see fork.h for how their
 * fork-child resets are run all the same). */
#ifndef GPUSLICE_STATE_H
#define GPUSLICE_STATE_H
#include "gpuslice/config.h"
#include "gpuslice/region.h"

/* Enforcer state, decided once by gs_init(). */
enum gs_state { GS_STATE_UNINIT = 0, GS_STATE_PASSTHROUGH = 1, GS_STATE_ACTIVE = 2, GS_STATE_BROKEN = 3 };
/* Load config, open the region, start the pacer. Idempotent, cheap after the first call. */
int gs_init(void);

extern struct gs_config gs_cfg;        /* valid when gs_state_now() is ACTIVE */
extern struct gs_region *gs_shared;    /* the slice's region (never NULL when ACTIVE) */
extern int32_t gs_self_pid;            /* getpid() as of the last attach (changes after fork) */
extern int gs_self_slot;               /* our process record in the region, -1 before attach */
int gs_state_now(void);                /* enum gs_state; runs gs_init() on first use */
/* Our process record index (attaching on first use); -1 on failure. Takes the region lock. */
int gs_attach_slot(void);
#endif
