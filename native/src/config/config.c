/* The slice configuration parser and loader. The slice file format is the contract documented in
 * native/README.md; the Python writer (gpuslice.enforcer.slicefile) is tested against this parser. The
 * parser is pure (text in, struct out) so libFuzzer can drive it; gs_config_load adds env and files. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpuslice/config.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void defaults(struct gs_config *c)
{
    memset(c, 0, sizeof *c);
    c->version = 1;
    c->memory_limit = GS_UNLIMITED;
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        c->device_limit[i] = GS_UNLIMITED;
        c->compute_per_ordinal[i] = -1;
    }
    c->mode = GS_MODE_HARD;
    c->weight = 1;
    c->priority = 1;
    c->oom_policy = GS_OOM_RETURN;
    c->oom_wait_ms = GS_DEFAULT_OOM_WAIT_MS;
    c->log_level = GS_LOG_WARN;
    c->context_overhead = GS_UNLIMITED;
    c->process_limit = GS_UNLIMITED;
}

/* Append a remark to c->warning ("; " between remarks). */
static void add_warning(struct gs_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_warning(struct gs_config *c, const char *fmt, ...)
{
    size_t n = strlen(c->warning);
    if (n && n + 2 < sizeof c->warning) {
        memcpy(c->warning + n, "; ", 3);
        n += 2;
    }
    if (n >= sizeof c->warning - 1) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->warning + n, sizeof c->warning - n, fmt, ap);
    va_end(ap);
}

int gs_parse_bytes(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        unsigned d = (unsigned)(*s++ - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1ull << 10}, {"ki", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mi", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
        {"g", 1ull << 30}, {"gi", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
        {"t", 1ull << 40}, {"ti", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    };
    char low[8];
    size_t n = strlen(s);
    if (n >= sizeof low) return -1;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)s[i]);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(low, units[i].suffix) == 0) {
            if (v > UINT64_MAX / units[i].mult) return -1;
            *out = v * units[i].mult;
            return 0;
        }
    }
    return -1;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    if (!*s) return -1;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p)) return -1;
        v = v * 10 + (*p - '0');
        if (v > hi) return -1;
    }
    if (v < lo) return -1;
    *out = (int)v;
    return 0;
}

static int parse_mode(const char *v)
{
    if (!strcmp(v, "hard") || !strcmp(v, "force")) return GS_MODE_HARD;
    if (!strcmp(v, "soft") || !strcmp(v, "default")) return GS_MODE_SOFT;
    if (!strcmp(v, "off") || !strcmp(v, "disable")) return GS_MODE_OFF;
    return -1;
}

static int parse_log_level(const char *v)
{
    if (!strcmp(v, "error")) return GS_LOG_ERROR;
    if (!strcmp(v, "warn")) return GS_LOG_WARN;
    if (!strcmp(v, "info")) return GS_LOG_INFO;
    if (!strcmp(v, "debug")) return GS_LOG_DEBUG;
    return -1;
}

static int valid_uuid(const char *u)
{
    size_t n = strlen(u);
    if (n < 5 || n >= GS_UUID_LEN) return 0;
    if (strncmp(u, "GPU-", 4) && strncmp(u, "MIG-", 4)) return 0;
    for (const char *p = u; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '/')) return 0;
    return 1;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
    return s;
}

/* Overrides keyed by UUID are resolved after the whole file is read (devices= may come later). */
struct pending_override {
    char uuid[GS_UUID_LEN];
    uint64_t bytes;
};

/* A slice file being read: the config so far and what is only known at the end. */
struct parse {
    struct gs_config c;
    struct pending_override ov[GS_MAX_DEVICES];
    int nov;
    unsigned seen; /* bit per key, to refuse duplicates */
    int have_version;
};

/* Every refusal names the line and the key; err and errlen are in scope wherever FAIL is used. */
#define FAIL(...) do { set_err(err, errlen, __VA_ARGS__); return -1; } while (0)

static const char *keys[] = {"version", "grant", "devices", "memory_limit", "compute", "mode",
                             "weight", "priority", "region", "device_state_dir", "oom_policy",
                             "log_level", "fail_open", "context_overhead", "engine", "mps_pipe_dir", "colocation",
                             "tidal_schedule", "generation", "oom_wait_ms"};
enum { K_VERSION, K_GRANT, K_DEVICES, K_MEMORY_LIMIT, K_COMPUTE, K_MODE, K_WEIGHT, K_PRIORITY, K_REGION,
       K_DEVICE_STATE_DIR, K_OOM_POLICY, K_LOG_LEVEL, K_FAIL_OPEN, K_CONTEXT_OVERHEAD, K_ENGINE, K_MPS_PIPE_DIR,
       K_COLOCATION, K_TIDAL, K_GENERATION, K_OOM_WAIT_MS };

/* memory_limit.<uuid>=<bytes> */
static int parse_override(struct parse *p, const char *key, const char *val, int lineno, char *err, size_t errlen)
{
    const char *uuid = key + 13;
    if (!valid_uuid(uuid)) FAIL("slice file line %d: memory_limit.<uuid>: '%.70s' is not a device UUID (GPU-... or MIG-...)", lineno, uuid);
    for (int i = 0; i < p->nov; i++)
        if (!strcmp(p->ov[i].uuid, uuid)) FAIL("slice file line %d: duplicate key '%.80s'", lineno, key);
    if (p->nov == GS_MAX_DEVICES) FAIL("slice file line %d: more than %d per-device limits", lineno, GS_MAX_DEVICES);
    if (gs_parse_bytes(val, &p->ov[p->nov].bytes)) FAIL("slice file line %d: %.80s: '%.40s' is not a byte size (e.g. 4294967296, 4g, 4Gi, 4096Mi)", lineno, key, val);
    snprintf(p->ov[p->nov].uuid, GS_UUID_LEN, "%s", uuid);
    p->nov++;
    return 0;
}

/* devices=<uuid>,<uuid>,... */
static int parse_devices(struct gs_config *c, char *val, int lineno, char *err, size_t errlen)
{
    char *save = NULL;
    for (char *tok = strtok_r(val, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (!*tok) continue;
        if (!valid_uuid(tok)) FAIL("slice file line %d: devices: '%.70s' is not a device UUID (GPU-... or MIG-...)", lineno, tok);
        if (c->device_count == GS_MAX_DEVICES) FAIL("slice file line %d: devices: more than %d devices", lineno, GS_MAX_DEVICES);
        for (int i = 0; i < c->device_count; i++)
            if (!strcmp(c->devices[i], tok)) FAIL("slice file line %d: devices: '%s' listed twice", lineno, tok);
        snprintf(c->devices[c->device_count++], GS_UUID_LEN, "%s", tok);
    }
    if (!c->device_count) FAIL("slice file line %d: devices: empty; expected UUIDs separated by commas", lineno);
    return 0;
}

/* The value of key number k (keys[]) into c. */
static int apply_key(struct parse *p, int k, const char *key, char *val, int lineno, char *err, size_t errlen)
{
    struct gs_config *c = &p->c;
    switch (k) {
    case K_VERSION:
        if (strcmp(val, "1")) FAIL("slice file line %d: version: '%.20s' is not supported; expected 1", lineno, val);
        p->have_version = 1;
        break;
    case K_GRANT:
        if (strlen(val) >= sizeof c->grant) FAIL("slice file line %d: grant: longer than %zu characters", lineno, sizeof c->grant - 1);
        snprintf(c->grant, sizeof c->grant, "%s", val);
        break;
    case K_DEVICES:
        return parse_devices(c, val, lineno, err, errlen);
    case K_MEMORY_LIMIT:
        if (gs_parse_bytes(val, &c->memory_limit)) FAIL("slice file line %d: memory_limit: '%.40s' is not a byte size (e.g. 4294967296, 4g, 4Gi, 4096Mi)", lineno, val);
        break;
    case K_COMPUTE:
        if (parse_int(val, 0, 100, &c->compute)) FAIL("slice file line %d: compute: '%.40s' is not allowed; expected a whole percent 0..100", lineno, val);
        break;
    case K_MODE:
        if ((c->mode = parse_mode(val)) < 0) FAIL("slice file line %d: mode: '%.40s' is not allowed; expected hard, soft or off", lineno, val);
        break;
    case K_WEIGHT:
        if (parse_int(val, 1, 16, &c->weight)) FAIL("slice file line %d: weight: '%.40s' is not allowed; expected 1..16", lineno, val);
        break;
    case K_PRIORITY:
        if (!strcmp(val, "high")) c->priority = 0;
        else if (!strcmp(val, "low")) c->priority = 1;
        else if (parse_int(val, 0, 1, &c->priority)) FAIL("slice file line %d: priority: '%.40s' is not allowed; expected 0 (high) or 1 (low)", lineno, val);
        break;
    case K_REGION:
    case K_DEVICE_STATE_DIR:
    case K_MPS_PIPE_DIR: {
        char *dst = k == K_REGION ? c->region : k == K_MPS_PIPE_DIR ? c->mps_pipe_dir : c->device_state_dir;
        if (val[0] != '/') FAIL("slice file line %d: %s: '%.80s' is not an absolute path", lineno, key, val);
        if (strlen(val) >= GS_PATH_LEN) FAIL("slice file line %d: %s: longer than %d characters", lineno, key, GS_PATH_LEN - 1);
        snprintf(dst, GS_PATH_LEN, "%s", val);
        break;
    }
    case K_OOM_POLICY:
        if (!strcmp(val, "return")) c->oom_policy = GS_OOM_RETURN;
        else if (!strcmp(val, "kill")) c->oom_policy = GS_OOM_KILL;
        else if (!strcmp(val, "wait")) c->oom_policy = GS_OOM_WAIT;
        else FAIL("slice file line %d: oom_policy: '%.40s' is not allowed; expected return, kill or wait", lineno, val);
        break;
    case K_OOM_WAIT_MS:
        if (parse_int(val, 0, 86400000, &c->oom_wait_ms)) FAIL("slice file line %d: oom_wait_ms: '%.40s' is not allowed; expected milliseconds 0..86400000", lineno, val);
        break;
    case K_LOG_LEVEL:
        if ((c->log_level = parse_log_level(val)) < 0) FAIL("slice file line %d: log_level: '%.40s' is not allowed; expected error, warn, info or debug", lineno, val);
        break;
    case K_FAIL_OPEN:
        if (parse_int(val, 0, 1, &c->fail_open)) FAIL("slice file line %d: fail_open: '%.40s' is not allowed; expected 0 or 1", lineno, val);
        break;
    case K_CONTEXT_OVERHEAD:
        if (gs_parse_bytes(val, &c->context_overhead) || c->context_overhead == GS_UNLIMITED) FAIL("slice file line %d: context_overhead: '%.40s' is not a byte size", lineno, val);
        break;
    case K_ENGINE:
        if (!strcmp(val, "spatial")) c->engine = GS_ENGINE_SPATIAL;
        else if (strcmp(val, "timeslice")) FAIL("slice file line %d: engine: '%.40s' is not allowed; expected timeslice or spatial", lineno, val);
        break;
    case K_GENERATION: {
        size_t n = strlen(val);
        unsigned long long g = n && n <= 10 && strspn(val, "0123456789") == n ? strtoull(val, NULL, 10) : ~0ull;
        if (g > UINT32_MAX)
            FAIL("slice file line %d: generation: '%.40s' is not allowed; expected a whole number 0..4294967295", lineno, val);
        c->generation = (uint32_t)g;
        break;
    }
    case K_COLOCATION:
        if ((c->colocation = gs_coloc_parse(val)) < 0) FAIL("slice file line %d: colocation: '%.40s' is not allowed; expected preemptive, shared or tidal", lineno, val);
        break;
    case K_TIDAL: {
        char why[160];
        if (gs_tidal_parse(val, &c->tidal, why, sizeof why)) FAIL("slice file line %d: tidal_schedule: %s", lineno, why);
        break;
    }
    }
    return 0;
}

/* One line (NUL-terminated, writable): blank, a comment, or key=value. */
static int parse_line(struct parse *p, char *line, int lineno, char *err, size_t errlen)
{
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *s = trim(line);
    if (!*s) return 0;
    char *eq = strchr(s, '=');
    if (!eq) FAIL("slice file line %d: expected key=value, got '%.60s'", lineno, s);
    *eq = 0;
    char *key = trim(s), *val = trim(eq + 1);
    int k = -1;
    for (int i = 0; i < (int)(sizeof keys / sizeof keys[0]); i++)
        if (!strcmp(key, keys[i])) k = i;
    if (k < 0 && !strncmp(key, "memory_limit.", 13)) return parse_override(p, key, val, lineno, err, errlen);
    if (k < 0) FAIL("slice file line %d: unknown key '%.80s' (allowed: version grant devices memory_limit memory_limit.<uuid> compute mode weight priority region device_state_dir oom_policy log_level fail_open context_overhead engine mps_pipe_dir colocation tidal_schedule generation oom_wait_ms)", lineno, key);
    if (p->seen & (1u << k)) FAIL("slice file line %d: duplicate key '%s'", lineno, key);
    p->seen |= 1u << k;
    return apply_key(p, k, key, val, lineno, err, errlen);
}

/* What only the whole file decides: the version is there, per-device limits land on listed devices. */
static int finish(struct parse *p, char *err, size_t errlen)
{
    struct gs_config *c = &p->c;
    if (!p->have_version) FAIL("slice file: version: missing; expected a line version=1");
    /* Without devices= the limit applies by CUDA ordinal to every device the process sees. */
    for (int i = 0; i < (c->device_count ? c->device_count : GS_MAX_DEVICES); i++) c->device_limit[i] = c->memory_limit;
    for (int j = 0; j < p->nov; j++) {
        int found = 0;
        for (int i = 0; i < c->device_count; i++)
            if (!strcmp(c->devices[i], p->ov[j].uuid)) { c->device_limit[i] = p->ov[j].bytes; found = 1; }
        if (!found) FAIL("slice file: memory_limit.%s: that device is not in devices=", p->ov[j].uuid);
    }
    if (p->nov && c->device_count == 0) FAIL("slice file: memory_limit.<uuid> given but devices= is missing");
    /* A process is the client of one MPS daemon, and the node side runs one per device. */
    if (c->engine == GS_ENGINE_SPATIAL && c->device_count > 1) FAIL("slice file: engine=spatial covers one device; devices= lists %d", c->device_count);
    if (c->mps_pipe_dir[0] && c->engine != GS_ENGINE_SPATIAL) FAIL("slice file: mps_pipe_dir given but engine is not spatial");
    /* a tidal share is held hard for a low-priority slice: soft would borrow back what the tide leaves */
    if (c->tidal.n && c->colocation != GS_COLOC_TIDAL) FAIL("slice file: tidal_schedule: given but colocation is %s; expected colocation=tidal", gs_coloc_name(c->colocation));
    if (c->colocation == GS_COLOC_TIDAL && (c->priority != 1 || c->mode != GS_MODE_HARD)) FAIL("slice file: colocation: tidal is for a low-priority slice with mode=hard (priority=1, mode=hard)");
    /* a spatial slice is not paced: nothing could hold it to a tide */
    if (c->colocation == GS_COLOC_TIDAL && c->engine == GS_ENGINE_SPATIAL) FAIL("slice file: colocation: tidal needs engine=timeslice (a spatial slice is not paced)");
    return 0;
}

int gs_config_parse_text(const char *text, size_t len, struct gs_config *out, char *err, size_t errlen)
{
    static const struct parse empty;
    struct parse p = empty;
    defaults(&p.c);
    p.c.source = GS_SRC_SLICE_FILE;
    char line[2048];
    size_t pos = 0;
    int lineno = 0;
    while (pos < len) {
        size_t start = pos;
        while (pos < len && text[pos] != '\n') pos++;
        size_t n = pos - start;
        pos++; /* skip the newline */
        lineno++;
        if (n >= sizeof line) FAIL("slice file line %d: longer than %zu bytes", lineno, sizeof line - 1);
        memcpy(line, text + start, n);
        line[n] = 0;
        if (memchr(line, 0, n)) FAIL("slice file line %d: contains a NUL byte", lineno);
        if (parse_line(&p, line, lineno, err, errlen)) return -1;
    }
    if (finish(&p, err, errlen)) return -1;
    *out = p.c;
    return 0;
}

/* A slice file root wrote must be one this process's user cannot replace (trust model, README.md): not
 * writable by group or others, in a folder root owns that only root may write (or a sticky one, where
 * nobody may replace root's file). Issue 15: a user whose grant folder was handed to them replaced the
 * slice file and raised their own limit. A file of the user's own (their own ledger, a file they wrote)
 * is theirs to change anyway, and root obeys whatever it reads. Only the file's own folder is checked. */
static int check_not_replaceable(int fd, const char *path, char *err, size_t errlen)
{
    struct stat st, dst;
    if (geteuid() == 0 || fstat(fd, &st) != 0 || st.st_uid != 0) return 0;
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        set_err(err, errlen, "slice file %s: written by root but writable by others (mode %03o): refusing a slice "
                "its processes could change", path, (unsigned)(st.st_mode & 0777));
        return -1;
    }
    char dir[GS_PATH_LEN];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (stat(dir, &dst) != 0) {
        set_err(err, errlen, "slice file %s: cannot check its folder %s: %s", path, dir, strerror(errno));
        return -1;
    }
    if (dst.st_uid != 0 || ((dst.st_mode & (S_IWGRP | S_IWOTH)) && !(dst.st_mode & S_ISVTX))) {
        set_err(err, errlen, "slice file %s: written by root, but its folder %s (owner uid %u, mode %04o) lets "
                "others replace it: refusing a slice its processes could change", path, dir, (unsigned)dst.st_uid,
                (unsigned)(dst.st_mode & 07777));
        return -1;
    }
    return 0;
}

int gs_config_read_file(const char *path, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    /* O_NONBLOCK: a FIFO in its place must not hang the program (or gpuslice-config-check) in open(). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        set_err(err, errlen, "GPUSLICE_SLICE=%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        set_err(err, errlen, "GPUSLICE_SLICE=%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (check_not_replaceable(fd, path, err, errlen)) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            set_err(err, errlen, "GPUSLICE_SLICE=%s: cannot read: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            set_err(err, errlen, "GPUSLICE_SLICE=%s: larger than %zu bytes", path, cap - 1);
            close(fd);
            return -1;
        }
    }
    close(fd);
    *len = n;
    return 0;
}

/* An environment value, or NULL when unset or empty (both mean "not given"). */
static const char *env(gs_env_fn get, void *arg, const char *name)
{
    const char *v = get(name, arg);
    return v && *v ? v : NULL;
}

/* name=<byte size> into *out: 1 if given, 0 if not, -1 with err naming it if it is no byte size. */
static int env_bytes(gs_env_fn get, void *arg, const char *name, const char *examples, uint64_t *out, char *err,
                     size_t errlen)
{
    const char *v = env(get, arg, name);
    if (!v) return 0;
    if (gs_parse_bytes(v, out)) FAIL("%s='%.40s' is not a byte size (e.g. %s)", name, v, examples);
    return 1;
}

/* name=<whole percent> into *out: 1 if given, 0 if not, -1 with err naming it otherwise. */
static int env_percent(gs_env_fn get, void *arg, const char *name, int *out, char *err, size_t errlen)
{
    const char *v = env(get, arg, name);
    if (!v) return 0;
    if (parse_int(v, 0, 100, out)) FAIL("%s='%.40s' is not a whole percent 0..100", name, v);
    return 1;
}

#define HAMI_BYTES "3000m, 4g"

/* HAMi's limits: CUDA_DEVICE_MEMORY_LIMIT[_<i>], CUDA_DEVICE_SM_LIMIT[_<i>]. 1 if any is given. */
static int load_hami_limits(gs_env_fn get, void *arg, struct gs_config *c, char *err, size_t errlen)
{
    int any = 0, got;
    if ((got = env_bytes(get, arg, "CUDA_DEVICE_MEMORY_LIMIT", HAMI_BYTES, &c->memory_limit, err, errlen)) < 0) return -1;
    any |= got;
    for (int i = 0; i < GS_MAX_DEVICES; i++) c->device_limit[i] = c->memory_limit;
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        char name[48];
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        if ((got = env_bytes(get, arg, name, HAMI_BYTES, &c->device_limit[i], err, errlen)) < 0) return -1;
        any |= got;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        if ((got = env_percent(get, arg, name, &c->compute_per_ordinal[i], err, errlen)) < 0) return -1;
        any |= got;
    }
    if ((got = env_percent(get, arg, "CUDA_DEVICE_SM_LIMIT", &c->compute, err, errlen)) < 0) return -1;
    return any | got;
}

/* HAMi's env names, used only when no slice file is given (drop-in compatibility). */
static int load_hami_env(gs_env_fn get, void *arg, struct gs_config *c, char *err, size_t errlen)
{
    int any = load_hami_limits(get, arg, c, err, errlen);
    if (any <= 0) return any;
    c->source = GS_SRC_HAMI_ENV;
    const char *v;
    if ((v = env(get, arg, "CUDA_DEVICE_MEMORY_SHARED_CACHE"))) {
        if (v[0] != '/' || strlen(v) >= GS_PATH_LEN) FAIL("CUDA_DEVICE_MEMORY_SHARED_CACHE='%.80s' is not an absolute path", v);
        snprintf(c->region, sizeof c->region, "%s", v);
    }
    /* HAMi's own values. Anything else is most likely a typo of "true": say so once, and keep the
     * safe default (refusals return CUDA_ERROR_OUT_OF_MEMORY) rather than refusing all GPU work. */
    if ((v = env(get, arg, "ACTIVE_OOM_KILLER"))) {
        if (!strcmp(v, "1") || !strcasecmp(v, "true")) c->oom_policy = GS_OOM_KILL;
        else if (strcmp(v, "0") && strcasecmp(v, "false"))
            add_warning(c, "ACTIVE_OOM_KILLER='%.40s' is not understood (allowed: 1, true, 0, false); keeping oom_policy=return", v);
    }
    if ((v = env(get, arg, "GPU_CORE_UTILIZATION_POLICY"))) {
        int m = parse_mode(v);
        if (m < 0) FAIL("GPU_CORE_UTILIZATION_POLICY='%.40s' is not allowed; expected force, default or disable", v);
        c->mode = m;
    }
    return 0;
}

/* Env may only tighten what the slice grants: GPUSLICE_MEMORY_LIMIT lowers the limit of this
 * process alone (process_limit, never the slice's), GPUSLICE_COMPUTE lowers the share,
 * GPUSLICE_FAIL_OPEN may turn fail_open off but never on (a broken environment must not become an
 * unlimited one: only the slice file can say fail_open=1). */
static int apply_gpuslice_env(gs_env_fn get, void *arg, struct gs_config *c, char *err, size_t errlen)
{
    uint64_t lim;
    int got = env_bytes(get, arg, "GPUSLICE_MEMORY_LIMIT", "4g, 4Gi, 4096Mi", &lim, err, errlen);
    if (got < 0) return -1;
    if (got) {
        if (c->source == GS_SRC_NONE) c->source = GS_SRC_HAMI_ENV; /* a bare env limit, by ordinal */
        if (lim < c->process_limit) c->process_limit = lim;
    }
    int pct;
    if ((got = env_percent(get, arg, "GPUSLICE_COMPUTE", &pct, err, errlen)) < 0) return -1;
    if (got) {
        /* compute 0 means unpaced (the whole device), so any share 1..99 lowers it. */
        int cur = (c->compute == 0) ? 100 : c->compute;
        if (pct > 0 && pct < cur) c->compute = pct;
    }
    const char *v;
    if ((v = env(get, arg, "GPUSLICE_FAIL_OPEN"))) {
        if (!strcmp(v, "0")) {
            c->fail_open = 0;
        } else if (!strcmp(v, "1")) {
            if (!c->fail_open)
                add_warning(c, "GPUSLICE_FAIL_OPEN=1 ignored: env may only tighten; only the slice file can set fail_open=1");
        } else {
            FAIL("GPUSLICE_FAIL_OPEN='%.40s' is not allowed; expected 0 (env can only turn fail_open off)", v);
        }
    }
    if ((v = env(get, arg, "GPUSLICE_LOG_LEVEL"))) {
        int l = parse_log_level(v);
        if (l < 0) FAIL("GPUSLICE_LOG_LEVEL='%.40s' is not allowed; expected error, warn, info or debug", v);
        c->log_level = l;
    }
    return 0;
}

/* Which slice file governs: the pinned one when it exists, else GPUSLICE_SLICE. NULL = none.
 * *ignored = the env path that names another file than the pinned one (it is not read). */
static const char *slice_path(gs_env_fn get, void *arg, const char *pinned, const char **ignored)
{
    const char *env = get("GPUSLICE_SLICE", arg);
    struct stat st, est;
    *ignored = NULL;
    if (!pinned || lstat(pinned, &st) != 0) return env && *env ? env : NULL;
    /* the same file under another name (a bind mount seen twice, a symlink) is no redirection */
    if (env && *env && strcmp(env, pinned) != 0 &&
        (stat(env, &est) != 0 || stat(pinned, &st) != 0 || est.st_dev != st.st_dev || est.st_ino != st.st_ino))
        *ignored = env;
    return pinned;
}

int gs_config_load_pinned(gs_env_fn get, void *arg, const char *pinned, struct gs_config *out, char *err,
                          size_t errlen)
{
    struct gs_config c;
    defaults(&c);
    const char *ignored;
    const char *path = slice_path(get, arg, pinned, &ignored);
    if (path) {
        static char buf[65536];
        size_t len;
        if (gs_config_read_file(path, buf, sizeof buf, &len, err, errlen)) return -1;
        char perr[400];
        if (gs_config_parse_text(buf, len, &c, perr, sizeof perr)) {
            set_err(err, errlen, "%s: %s", path, perr);
            return -1;
        }
        snprintf(c.slice_path, sizeof c.slice_path, "%s", path); /* a live resize re-reads it */
    } else if (load_hami_env(get, arg, &c, err, errlen)) {
        return -1;
    }
    if (ignored)
        add_warning(&c, "GPUSLICE_SLICE=%.100s ignored: the mounted slice file %.60s governs this process", ignored,
                    path);
    c.granted_compute = c.compute;
    if (apply_gpuslice_env(get, arg, &c, err, errlen)) return -1;
    *out = c;
    return 0;
}

int gs_config_load_with(gs_env_fn get, void *arg, struct gs_config *out, char *err, size_t errlen)
{
    return gs_config_load_pinned(get, arg, NULL, out, err, errlen);
}

static const char *real_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

int gs_config_load(struct gs_config *out, char *err, size_t errlen)
{
    return gs_config_load_pinned(real_getenv, NULL, GS_PINNED_SLICE, out, err, errlen);
}
