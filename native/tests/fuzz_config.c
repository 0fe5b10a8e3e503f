/* libFuzzer target: the slice-file parser must accept or refuse any bytes with a message, never
 * crash, never overrun (ASan/UBSan), and what it accepts must survive a dump. The same bytes, read
 * as NAME=VALUE lines, are also the environment of gs_config_load_with (HAMi names and GPUSLICE_*),
 * with the same rules: refuse with a message or accept a configuration within the contract. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpuslice/config.h"

/* The fuzz input as an environment: the value of the first line "NAME=..." (NULL if none). The
 * slice-file path is never given (it would read a file, not the input). */
struct fenv {
    const char *data;
    size_t size;
    char value[512];
};
static const char *fenv_get(const char *name, void *arg)
{
    struct fenv *f = arg;
    size_t n = strlen(name);
    if (!strcmp(name, "GPUSLICE_SLICE")) return NULL;
    for (size_t i = 0; i < f->size;) {
        size_t j = i;
        while (j < f->size && f->data[j] != '\n') j++;
        if (j - i > n && !memcmp(f->data + i, name, n) && f->data[i + n] == '=') {
            size_t len = j - i - n - 1;
            if (len >= sizeof f->value) len = sizeof f->value - 1;
            memcpy(f->value, f->data + i + n + 1, len);
            f->value[len] = 0; /* an embedded NUL just ends the value early, as in a real environment */
            return f->value;
        }
        i = j + 1;
    }
    return NULL;
}

static void check(const struct gs_config *c)
{
    char out[8192];
    gs_config_dump(c, out, sizeof out);
    if (c->weight < 1 || c->weight > 16 || c->compute < 0 || c->compute > 100 || c->device_count > GS_MAX_DEVICES)
        __builtin_trap(); /* accepted something outside the contract */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gs_config c;
    char err[512];
    err[0] = 0;
    if (gs_config_parse_text((const char *)data, size, &c, err, sizeof err) == 0) check(&c);
    else if (err[0] == 0) __builtin_trap(); /* a refusal must say why */
    struct fenv f = {(const char *)data, size, {0}};
    err[0] = 0;
    if (gs_config_load_with(fenv_get, &f, &c, err, sizeof err) == 0) {
        check(&c);
        /* without a slice file the environment alone can only limit, never open: no fail_open */
        if (c.fail_open) __builtin_trap();
    } else if (err[0] == 0) {
        __builtin_trap();
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
