/* gpuslice-config-check [FILE]: parse a slice file exactly as the enforcer does and print the result
 * as key=value lines (exit 0), or print the one-line error (exit 2). Without FILE it loads the
 * process configuration from the environment (GPUSLICE_SLICE, GPUSLICE_*, HAMi names). Used by the
 * Python slicefile round-trip tests and by operators. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "gpuslice/config.h"

int main(int argc, char **argv)
{
    struct gs_config c;
    char err[512];
    int rc;
    if (argc > 1) {
        static char buf[65536];
        size_t n = 0;
        rc = gs_config_read_file(argv[1], buf, sizeof buf, &n, err, sizeof err);
        if (!rc) rc = gs_config_parse_text(buf, n, &c, err, sizeof err);
    } else {
        rc = gs_config_load(&c, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    char out[8192];
    gs_config_dump(&c, out, sizeof out);
    fputs(out, stdout);
    return 0;
}
