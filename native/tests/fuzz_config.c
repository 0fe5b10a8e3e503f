/* libFuzzer target: the slice-file parser must accept or refuse any bytes with a message, never
 * crash, never overrun (ASan/UBSan), and what it accepts must survive a dump. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpuslice/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gs_config c;
    char err[512];
    err[0] = 0;
    if (gs_config_parse_text((const char *)data, size, &c, err, sizeof err) == 0) {
        char out[8192];
        gs_config_dump(&c, out, sizeof out);
        if (c.weight < 1 || c.weight > 16 || c.compute < 0 || c.compute > 100 || c.device_count > GS_MAX_DEVICES)
            __builtin_trap(); /* accepted something outside the contract */
    } else if (err[0] == 0) {
        __builtin_trap(); /* a refusal must say why */
    }
    if (size < 32) {
        char num[33];
        memcpy(num, data, size);
        num[size] = 0;
        uint64_t v;
        (void)gs_parse_bytes(num, &v);
    }
    return 0;
}
