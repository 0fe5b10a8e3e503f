/* Helpers for the native tests: checks that count, a fresh temp dir and slice file per scenario,
 * one forked process per scenario (the enforcer reads its configuration once per process), and a
 * direct view of the region through its ABI header. */
#ifndef GS_TESTLIB_H
#define GS_TESTLIB_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "double/double_common.h"
#include "gpuslice/cuda_types.h"
#include "gpuslice/region.h"

static int t_failures, t_checks;
#define CHECK(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ(a, b) do { unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
    CHECK(a_ == b_, "%s = %llu, expected %s = %llu", #a, a_, #b, b_); } while (0)

#define MiB (1ull << 20)
static char t_dir[256];
static char t_region[300];

static inline void t_fresh_dir(void)
{
    snprintf(t_dir, sizeof t_dir, "/tmp/gs-test-XXXXXX");
    if (!mkdtemp(t_dir)) { perror("mkdtemp"); exit(2); }
    snprintf(t_region, sizeof t_region, "%s/slice.region", t_dir);
}

static inline void t_uuid(int dev, char out[64]) { dbl_uuid_string(dev, out); }

/* Write (or rewrite, as a live resize does: a new file renamed over the old one) a slice file covering
 * the double's devices 0 and 1, with extra key=value lines. */
static inline void t_slice(const char *fmt, ...)
{
    char path[320], extra[2048], u0[64], u1[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(extra, sizeof extra, fmt, ap);
    va_end(ap);
    t_uuid(0, u0);
    t_uuid(1, u1);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    char tmp[340];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    if (!f) { perror(tmp); exit(2); }
    fprintf(f, "version=1\ngrant=test\ndevices=%s,%s\nregion=%s\n%s", u0, u1, t_region, extra);
    fclose(f);
    if (rename(tmp, path)) { perror("rename"); exit(2); } /* as the node side writes it: whole, or not at all */
    setenv("GPUSLICE_SLICE", path, 1);
}

static inline struct gs_region *t_map_region(void)
{
    int fd = open(t_region, O_RDWR);
    if (fd < 0) return NULL;
    void *p = mmap(NULL, sizeof(struct gs_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Slice usage of device 0 as the region says (device record 0 is the first device touched). */
static inline unsigned long long t_used(int rec)
{
    struct gs_region *r = t_map_region();
    if (!r) return ~0ull;
    unsigned long long u = r->devices[rec].used;
    munmap(r, sizeof *r);
    return u;
}

static inline void t_cleanup_dir(void)
{
    char p[400];
    snprintf(p, sizeof p, "%s/slice.conf", t_dir);
    unlink(p);
    unlink(t_region);
    rmdir(t_dir);
}

/* Run fn in a child; returns its wait status. Failures in the child are reported by its exit code. */
static inline int t_fork(void (*fn)(void))
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        t_failures = t_checks = 0;
        fn();
        fflush(NULL);
        exit(t_failures ? 1 : 0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return st;
}

#define SCENARIO(fn) do { t_fresh_dir(); int st_ = t_fork(fn); t_checks++; \
    if (!(WIFEXITED(st_) && WEXITSTATUS(st_) == 0)) { t_failures++; fprintf(stderr, "FAIL scenario %s (status 0x%x)\n", #fn, st_); } \
    else { fprintf(stderr, "ok   %s\n", #fn); } t_cleanup_dir(); } while (0)
#endif
