/* gpuslice compute pacer (initial compiling skeleton; controller follows). */
#include "gpuslice/pacer.h"

int gs_pacer_init(const struct gs_config *cfg) { (void)cfg; return 0; }
void gs_pacer_before_launch(int dev, void *stream) { (void)dev; (void)stream; }
void gs_pacer_after_launch(int dev, void *stream, int cu_result) { (void)dev; (void)stream; (void)cu_result; }
void gs_pacer_shutdown(void) {}
