/* gpuslice compute pacer: public interface called by the launch hooks.
 * See native/README-compute.md for the controller design. */
#ifndef GPUSLICE_PACER_H
#define GPUSLICE_PACER_H
#include <stdint.h>

struct gs_config;  /* defined by the memory helper in gpuslice/config.h */
/* CU_STREAM_PER_THREAD: the stream a _ptsz launch on stream 0 runs on. The _ptsz launch hooks hand
 * this to the pacer instead of 0 (which names the legacy default stream in every other call). */
#define GS_STREAM_PER_THREAD ((void *)0x2)
#define GS_PTSZ_STREAM(s) ((s) ? (void *)(s) : GS_STREAM_PER_THREAD)
int  gs_pacer_init(const struct gs_config *cfg);    /* once after config load; nonzero = failed */
/* dev = CUdevice ordinal of the current context; may sleep; stream: as the driver reads it
 * (GS_PTSZ_STREAM for _ptsz); key: the launch's kernel shape (gs_cost_key in costmodel.h, 0 unknown) */
void gs_pacer_before_launch(int dev, void *stream, uint64_t key);
void gs_pacer_after_launch(int dev, void *stream, int cu_result);
void gs_pacer_shutdown(void);
/* Paced launches let go because they were held longer than this slice's share can owe (a neighbour
 * rewrote the shared state: pacer.c hold_cap_ns), since start. */
uint64_t gs_pacer_held_too_long(void);

#endif
