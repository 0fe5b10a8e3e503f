/* gpuslice compute pacer: public interface called by the launch hooks.
 * See native/README-compute.md for the controller design. */
#ifndef GPUSLICE_PACER_H
#define GPUSLICE_PACER_H

struct gs_config;  /* defined by the memory helper in gpuslice/config.h */
int  gs_pacer_init(const struct gs_config *cfg);    /* once after config load; nonzero = failed */
void gs_pacer_before_launch(int dev, void *stream); /* dev = CUdevice ordinal of the current context; may sleep */
void gs_pacer_after_launch(int dev, void *stream, int cu_result);
void gs_pacer_shutdown(void);

#endif
