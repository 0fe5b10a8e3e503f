/* Live resize (src/core/reload.c): a running process follows its slice file when the node side
 * rewrites it. The accounting calls gs_reload_poll() on its paths; it stats the slice file at most
 * every 100 ms and, when it changed, takes over the new limits into gs_cfg. */
#ifndef GPUSLICE_RELOAD_H
#define GPUSLICE_RELOAD_H

/* The reload epoch: bumped each time a changed slice file was taken over into gs_cfg. Callers keep
 * the epoch they last applied and apply gs_cfg's limits again when it moved. Cheap (a coarse clock
 * read) between checks. */
unsigned gs_reload_poll(void);
/* Let the next gs_reload_poll look at the file whatever the time (tests, a refusal about to be final). */
void gs_reload_now(void);
#endif
