/* The slice configuration: parsed from the slice file named by GPUSLICE_SLICE (the contract, see
 * native/README.md), lowered by GPUSLICE_* env, or built from HAMi's env names when no slice file is
 * set. The pacer (compute part) reads this struct; keep fields stable and additive. */
#ifndef GPUSLICE_CONFIG_H
#define GPUSLICE_CONFIG_H
#include <stddef.h>
#include <stdint.h>

#define GS_MAX_DEVICES 16
#define GS_UUID_LEN 64
#define GS_PATH_LEN 1024
#define GS_UNLIMITED UINT64_MAX

enum gs_source { GS_SRC_NONE = 0, GS_SRC_SLICE_FILE = 1, GS_SRC_HAMI_ENV = 2 };
enum gs_mode { GS_MODE_HARD = 0, GS_MODE_SOFT = 1, GS_MODE_OFF = 2 };
/* What a refused or failed allocation does: return the error; kill the process (refusals at the
 * limit); wait (allocations the slice has room for but the device has not: up to oom_wait_ms). */
enum gs_oom_policy { GS_OOM_RETURN = 0, GS_OOM_KILL = 1, GS_OOM_WAIT = 2 };
#define GS_DEFAULT_OOM_WAIT_MS 30000
enum gs_log_level { GS_LOG_ERROR = 0, GS_LOG_WARN = 1, GS_LOG_INFO = 2, GS_LOG_DEBUG = 3 };
/* How the device's compute is shared: the pacer takes turns (timeslice), or the slice's processes are
 * clients of the device's MPS daemon and run at once on a fraction of the SMs (spatial: not paced). */
enum gs_sharing_engine { GS_ENGINE_TIMESLICE = 0, GS_ENGINE_SPATIAL = 1 };
/* How a slice shares a device with slices of the other priority (README-compute.md, "Co-location"):
 * preemptive (the default, what `priority` always meant): a low-priority slice holds back while a
 * preemptive high-priority slice has work queued, with a bounded queue of its own in front of it;
 * shared: priorities only order the shares' guarantees, nobody yields; tidal (low priority only): the
 * slice's share follows tidal_schedule, or without one the idle time of the device's high-priority
 * slices. The numbers are the device state's (devstate.h): keep them. */
enum gs_colocation { GS_COLOC_PREEMPTIVE = 0, GS_COLOC_SHARED = 1, GS_COLOC_TIDAL = 2 };

/* tidal_schedule=<from>-<to>:<percent>[,...]: whole UTC hours, `to` exclusive (24 = midnight), a span
 * may wrap past midnight (22-6:100), spans may not overlap; percent 1..100 (100 = the whole device).
 * Hours no span covers use the slice's compute share (0 or 100: the whole device). */
#define GS_TIDAL_MAX_SPANS 24
struct gs_tidal_span {
    uint8_t from, to, pct;
};
struct gs_tidal {
    int n;  /* 0 = no schedule: a tidal slice follows the high-priority slices' idle time */
    struct gs_tidal_span span[GS_TIDAL_MAX_SPANS];
};

struct gs_config {
    int source;                              /* enum gs_source; NONE = not in a slice: pass through */
    int version;                             /* slice file version (1) */
    char grant[128];
    int device_count;                        /* number of UUIDs in devices[]; 0 = by ordinal (HAMi env) */
    char devices[GS_MAX_DEVICES][GS_UUID_LEN];
    uint64_t device_limit[GS_MAX_DEVICES];   /* per listed device (or per ordinal when device_count == 0) */
    uint64_t memory_limit;                   /* default for devices without an override; GS_UNLIMITED if unset */
    int compute;                             /* 0..100; 0 or 100 = not paced */
    int compute_per_ordinal[GS_MAX_DEVICES]; /* HAMi CUDA_DEVICE_SM_LIMIT_<i>; -1 = use compute */
    int mode;                                /* enum gs_mode (compute pacing; memory is always hard unless off) */
    int weight;                              /* 1..16 */
    int priority;                            /* 0 high, 1 low */
    char region[GS_PATH_LEN];                /* "" = private to this process */
    char device_state_dir[GS_PATH_LEN];      /* "" = none (compute part decides) */
    int oom_policy;                          /* enum gs_oom_policy */
    int log_level;                           /* enum gs_log_level */
    int fail_open;                           /* 1 = on our own failure, let calls through unlimited */
    uint64_t context_overhead;               /* bytes counted per CUDA context; GS_UNLIMITED = built-in default */
    /* GPUSLICE_MEMORY_LIMIT: a lower limit for THIS process only (GS_UNLIMITED = none). Never written
     * to the region: device_limit/memory_limit above stay the slice's, shared by all its processes. */
    uint64_t process_limit;
    char warning[256];                       /* non-fatal remarks for the log ("" = none), e.g. an env value ignored */
    int engine;                              /* enum gs_sharing_engine; spatial covers at most one device */
    char mps_pipe_dir[GS_PATH_LEN];          /* spatial: the device's MPS pipe directory ("" = the environment's) */
    /* Live resize: the node side bumps generation= each time it rewrites the slice file of a running
     * slice; a file of a higher generation may raise the region's limit (see region.h). 0 = never resized. */
    uint32_t generation;
    char slice_path[GS_PATH_LEN];            /* the slice file this config was read from ("" = none) */
    int oom_wait_ms;                         /* oom_policy=wait: how long a device-full allocation waits */
    int colocation;                          /* enum gs_colocation */
    struct gs_tidal tidal;                   /* colocation=tidal: its schedule (n = 0: follow idle time) */
    /* The compute share the slice file (or HAMi's environment) granted, before GPUSLICE_COMPUTE lowered
     * `compute`: whether the slice has a share of its own. The spatial yield cap (mps.h) is for slices
     * without one, and an environment that "lowers" 0 to 99 must not take a slice out of it. */
    int granted_compute;
};

/* Parse slice-file text into *out (defaults first). Returns 0, or -1 with a one-line reason in err
 * naming the line and key. Never reads env or files: the fuzzer drives this directly. */
int gs_config_parse_text(const char *text, size_t len, struct gs_config *out, char *err, size_t errlen);

/* The slice file the Kubernetes device plugin mounts read-only into every GPU container. When it
 * exists it is the process's slice whatever the environment says: a container that unsets or
 * redirects GPUSLICE_SLICE must not leave its slice (env may only lower a limit, and a slice file of
 * the container's own choosing could raise it). Build-time only, never from the environment. */
#ifndef GS_PINNED_SLICE
#define GS_PINNED_SLICE "/etc/gpuslice/slice"
#endif

/* Load the process's configuration: the pinned slice file (GS_PINNED_SLICE) when it exists, else the
 * GPUSLICE_SLICE file, then GPUSLICE_* env (may only lower), or HAMi env when there is no slice file.
 * Returns 0 (out->source may be GS_SRC_NONE), or -1 with err set. */
int gs_config_load(struct gs_config *out, char *err, size_t errlen);

/* The same with the environment read through get(name, arg) instead of getenv (the fuzzer feeds the
 * HAMi/GPUSLICE_* env parser this way). get returns NULL for an unset name. */
typedef const char *(*gs_env_fn)(const char *name, void *arg);
int gs_config_load_with(gs_env_fn get, void *arg, struct gs_config *out, char *err, size_t errlen);
/* The same with an explicit pinned slice path (NULL = none): gs_config_load passes GS_PINNED_SLICE,
 * the tests a file of their own. */
int gs_config_load_pinned(gs_env_fn get, void *arg, const char *pinned, struct gs_config *out, char *err,
                          size_t errlen);

/* Read a slice file into buf (at most cap - 1 bytes; *len = bytes read) as the enforcer does: a regular file
 * (a FIFO or device is refused without blocking), and when root wrote it and this process is not root, one
 * that this process's user cannot replace (not writable by group/others, in a folder only root may write
 * or a sticky one). Returns 0, or -1 with err naming the path and the reason. */
int gs_config_read_file(const char *path, char *buf, size_t cap, size_t *len, char *err, size_t errlen);

/* Whether two device UUIDs name the same device: compared by their hex part, ignoring case and a
 * "GPU-" or "MIG-" prefix. CUDA hands out a MIG instance's UUID as 16 bytes that we can only print
 * as GPU-..., while slice files and NVML name it MIG-...; both must match. */
int gs_uuid_same(const char *a, const char *b);
/* Index of uuid in cfg->devices (by gs_uuid_same), or -1. */
int gs_config_device_index(const struct gs_config *cfg, const char *uuid);

/* Parse a byte size: plain bytes, k/m/g/t (binary), Ki/Mi/Gi/Ti(B). -1 on bad input or overflow. */
int gs_parse_bytes(const char *s, uint64_t *out);

/* Limit for a listed device UUID, or for a CUDA ordinal when the config is by ordinal. */
uint64_t gs_config_limit_for_uuid(const struct gs_config *cfg, const char *uuid, int *found);

/* colocation.c: the co-location keys' values. gs_coloc_parse: enum gs_colocation or -1.
 * gs_tidal_parse: 0, or -1 with a reason (no line number, the caller adds it) in err. */
int gs_coloc_parse(const char *v);
const char *gs_coloc_name(int colocation);
int gs_tidal_parse(const char *v, struct gs_tidal *t, char *err, size_t errlen);
/* The percent a tidal schedule gives at `hour` (0..23, UTC); base_pct for an hour no span covers.
 * Pure: the pacer passes the hour of its clock, the tests any hour. */
int gs_tidal_pct_at(const struct gs_tidal *t, int hour, int base_pct);
/* "0-8:100,20-24:60" (canonical, the spans in the order given) into buf. */
void gs_tidal_format(const struct gs_tidal *t, char *buf, size_t len);

/* Write the config as key=value lines (the format gpuslice-config-check prints). */
void gs_config_dump(const struct gs_config *cfg, char *buf, size_t len);

#endif
