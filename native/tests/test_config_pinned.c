/* The pinned slice file (GS_PINNED_SLICE, /etc/gpuslice/slice in a container): when it exists it is
 * the slice, whatever GPUSLICE_SLICE or the HAMi variables say, so a container that unsets or
 * redirects its environment cannot leave its limits; GPUSLICE_* may still lower them. Without it the
 * environment decides as before. An unreadable or broken pinned file refuses (fail closed). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gpuslice/config.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

#define GiB (1ull << 30)

/* a tiny environment: NULL-terminated name/value pairs */
static const char *env_get(const char *name, void *arg)
{
    const char **kv = arg;
    for (; kv && kv[0]; kv += 2)
        if (!strcmp(kv[0], name)) return kv[1];
    return NULL;
}

static char dir[64], pinned[128], other[128];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) { perror(path); exit(2); }
}

static int load(const char **env, struct gs_config *c, char *err)
{
    memset(c, 0, sizeof *c);
    err[0] = 0;
    return gs_config_load_pinned(env_get, env, pinned, c, err, 512);
}

int main(void)
{
    struct gs_config c;
    char err[512];
    snprintf(dir, sizeof dir, "/tmp/gs-pinned-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(pinned, sizeof pinned, "%s/slice", dir);
    snprintf(other, sizeof other, "%s/mine", dir);
    write_file(other, "version=1\nmemory_limit=64g\ncompute=0\n");

    /* no pinned file: GPUSLICE_SLICE decides, as before */
    const char *redirect[] = {"GPUSLICE_SLICE", other, NULL};
    CHECK(load(redirect, &c, err) == 0 && c.source == GS_SRC_SLICE_FILE && c.memory_limit == 64 * GiB,
          "no pinned file: env slice used (%s)", err);
    const char *none[] = {NULL};
    CHECK(load(none, &c, err) == 0 && c.source == GS_SRC_NONE, "no pinned file, no env: not in a slice");

    write_file(pinned, "version=1\nmemory_limit=1g\ncompute=30\n");
    /* unset environment: still the pinned slice */
    CHECK(load(none, &c, err) == 0 && c.source == GS_SRC_SLICE_FILE && c.memory_limit == GiB && c.compute == 30,
          "pinned slice without env (%s)", err);
    /* redirected to a file of the container's own: ignored, with a warning naming both */
    CHECK(load(redirect, &c, err) == 0 && c.memory_limit == GiB, "redirect ignored: %llu",
          (unsigned long long)c.memory_limit);
    CHECK(strstr(c.warning, "GPUSLICE_SLICE=") && strstr(c.warning, "ignored") && strstr(c.warning, pinned),
          "warning names the ignored path and the pinned one: '%s'", c.warning);
    /* the same path, or the same file by another name: no warning */
    const char *same[] = {"GPUSLICE_SLICE", pinned, NULL};
    CHECK(load(same, &c, err) == 0 && c.memory_limit == GiB && !c.warning[0], "same path, no warning: '%s'", c.warning);
    char link[160];
    snprintf(link, sizeof link, "%s/alias", dir);
    CHECK(symlink(pinned, link) == 0, "symlink");
    const char *alias[] = {"GPUSLICE_SLICE", link, NULL};
    CHECK(load(alias, &c, err) == 0 && !c.warning[0], "an alias of the pinned file is no redirection: '%s'", c.warning);
    /* HAMi variables do not replace the pinned slice */
    const char *hami[] = {"CUDA_DEVICE_MEMORY_LIMIT", "64g", "CUDA_DEVICE_SM_LIMIT", "100", NULL};
    CHECK(load(hami, &c, err) == 0 && c.source == GS_SRC_SLICE_FILE && c.memory_limit == GiB && c.compute == 30,
          "HAMi env ignored under a pinned slice");
    /* env may still lower the process's limit, never raise the slice's */
    const char *lower[] = {"GPUSLICE_SLICE", other, "GPUSLICE_MEMORY_LIMIT", "512m", NULL};
    CHECK(load(lower, &c, err) == 0 && c.memory_limit == GiB && c.process_limit == 512ull << 20,
          "GPUSLICE_MEMORY_LIMIT lowers: %llu", (unsigned long long)c.process_limit);
    const char *raise[] = {"GPUSLICE_MEMORY_LIMIT", "8g", NULL};
    CHECK(load(raise, &c, err) == 0 && c.memory_limit == GiB, "env cannot raise the pinned limit");
    /* a broken or unreadable pinned file refuses, naming it; the env slice is not a fallback */
    write_file(pinned, "version=1\nmemory_limit=lots\n");
    CHECK(load(redirect, &c, err) != 0 && strstr(err, pinned) && strstr(err, "memory_limit"), "broken pinned refused: %s",
          err);
    unlink(pinned);
    CHECK(mkdir(pinned, 0700) == 0, "mkdir");
    CHECK(load(redirect, &c, err) != 0 && strstr(err, pinned), "unreadable pinned refused: %s", err);
    rmdir(pinned);
    unlink(link);
    unlink(other);
    rmdir(dir);
    printf("test_config_pinned: %d checks, %d failures\n", checks, failures);
    return failures != 0;
}
