/* gpuslice per-device shared state: how the slices (and their processes) on one device see each
 * other, for the compute pacer and for `gpuslice ps` (Python reader: gpuslice.enforcer.devstate).
 *
 * One file per device: <device_state_dir>/<device-uuid>.dev, mmap'd MAP_SHARED by every paced
 * process on the node. Fixed little-endian layout (x86-64/aarch64 native), version 2:
 *
 *   offset 0     header, 256 bytes   (struct gs_ds_header)
 *   offset 256   GS_DS_MAX_SLICES slice records of 256 bytes (struct gs_ds_slice)
 *   offset 256+32*256 = 8448   GS_DS_MAX_PROCS process records of 128 bytes (struct gs_ds_proc)
 *   size 8448 + 128*128 = 24832 bytes
 * (version 1 had 64-byte process records without heartbeat_ns / pidns / joined_ns. Version 3 keeps
 * the layout of version 2 and adds offered_bp and path to the process record, but changes what the
 * fields mean to the writers: a slice's credit_ns is changed by launches without the lock (atomic
 * add/sub) and only processes flagged TURNS take turns; a version-2 enforcer writing the same file
 * would overwrite those charges and wait for turns no one offers, so the two must not share it.)
 *
 * Version 4 keeps the layout of version 3 but not its lock: version 3 kept a process-shared robust
 * pthread mutex at offset 128, which any tenant could overwrite (the file is 0666) to hang or crash
 * its neighbours; version 4 locks with the kernel (an OFD lock on byte GS_DS_LOCK_BYTE, src/pacing/
 * devstate_lock.c) and uses the mutex's bytes only as a "held" hint. The two would not exclude each
 * other, so they refuse each other's files.
 *
 * Readers check magic, version, size and the record offsets/sizes in the header and refuse what they
 * do not know. A layout change bumps GS_DS_VERSION.
 * Crash safety: creation and validation happen under flock() (released by the kernel when a creator
 * dies); updates happen under the OFD lock (released by the kernel when its holder dies; the "held"
 * hint it leaves makes the next locker reap dead processes: their records are freed; a slice record
 * is freed when no live process refers to it). Counters are monotonic sums, so a half-done update
 * loses at most one increment.
 *
 * Hostile neighbours (trust model: native/README.md, README-compute.md): every tenant on the device
 * writes this file. A neighbour can distort what the records say (activity; the credit of a slice without a
 * region of its own; the policy fields of a
 * slice record are only what its own processes publish: every pacer takes policy from root's roster,
 * policy.h, when the device has one); it cannot
 * hang or crash a process: the lock is the kernel's and bounded (GS_DS_LOCK_WAIT_NS), a truncated file
 * is caught (devstate_guard.c), records are brought back into range at every lock, and a paced launch
 * is held at most what its own share can owe (pacer.c).
 *
 * Liveness across PID namespaces: in Kubernetes the directory is shared by every pod on the node and
 * each pod has its own PID namespace, so a pid in a record means nothing to a process of another
 * pod (kill(pid, 0) there may hit nobody, or an unrelated process). Each process record carries the
 * inode of its PID namespace (/proc/self/ns/pid) and a heartbeat (CLOCK_MONOTONIC, refreshed by the
 * owner's poller at least every GS_DS_HEARTBEAT_NS). A reaper decides with kill(pid, 0) only for
 * records of its own namespace; any other record is dead when its heartbeat is older than
 * GS_DS_STALE_NS. An owner that finds its record gone (freed as stale) joins again. */
#ifndef GPUSLICE_DEVSTATE_H
#define GPUSLICE_DEVSTATE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GS_DS_MAGIC 0x0054535645445347ULL /* "GSDEVST\0" little-endian */
#define GS_DS_VERSION 4u
#define GS_DS_MAX_SLICES 32
#define GS_DS_MAX_PROCS 128
#define GS_DS_HEADER_SIZE 256
#define GS_DS_LOCK_BYTE 128 /* the byte the OFD write lock covers (and where the "held" hint lives) */
#define GS_DS_SLICE_SIZE 256
#define GS_DS_PROC_SIZE 128
#define GS_DS_SLICE_OFF GS_DS_HEADER_SIZE
#define GS_DS_PROC_OFF (GS_DS_SLICE_OFF + GS_DS_MAX_SLICES * GS_DS_SLICE_SIZE)
#define GS_DS_FILE_SIZE (GS_DS_PROC_OFF + GS_DS_MAX_PROCS * GS_DS_PROC_SIZE)
/* the owner refreshes heartbeat_ns at least this often; a record of another PID namespace whose
 * heartbeat is older than STALE is freed (5 missed beats: a poller is never that late unless its
 * process is stopped or gone; a stopped one joins again when it runs) */
#define GS_DS_HEARTBEAT_NS 1000000000LL
#define GS_DS_STALE_NS     5000000000LL

struct gs_ds_header {           /* 256 bytes */
    uint64_t magic;             /*   0 */
    uint32_t version;           /*   8 */
    uint32_t size;              /*  12 total file size */
    uint32_t max_slices;        /*  16 */
    uint32_t max_procs;         /*  20 */
    uint32_t slice_off;         /*  24 */
    uint32_t slice_size;        /*  28 */
    uint32_t proc_off;          /*  32 */
    uint32_t proc_size;         /*  36 */
    int64_t created_ns;         /*  40 CLOCK_MONOTONIC */
    int64_t last_reap_ns;       /*  48 */
    uint64_t updates;           /*  56 count of locked updates (readers: detect a torn read) */
    char uuid[64];              /*  64 device UUID, NUL-terminated */
    unsigned char lock[128];    /* 128 first 8 bytes: pid of the lock's holder while held (a hint); the
                                       lock is an OFD lock on this byte (GS_DS_LOCK_BYTE); version 3 kept a
                                       pthread mutex here */
};

#define GS_DS_SLICE_IN_USE 1u
struct gs_ds_slice {            /* 256 bytes */
    uint32_t flags;             /*   0 GS_DS_SLICE_IN_USE */
    uint32_t share_bp;          /*   4 set share, basis points (10000 = device) */
    uint8_t mode;               /*   8 0 hard, 1 soft, 2 off (gs_config's enum gs_mode) */
    uint8_t weight;             /*   9 1..16 */
    uint8_t priority;           /*  10 0 high, 1 low */
    uint8_t paced;              /*  11 1 = share is enforced (0 < share < 100 %, mode != off) */
    uint32_t rate_bp;           /*  12 rate the controller allots right now */
    char grant[128];            /*  16 grant id (slice identity across processes) */
    int64_t credit_ns;          /* 144 controller credit (struct gs_ctl_bucket) of a slice without a region of its
                                       own (one with a region keeps it there: pacer_core.h credit_home); launches charge it with
                                       atomic adds outside the lock, refills are compare-and-swap */
    int64_t credit_last_ns;     /* 152 */
    int64_t last_active_ns;     /* 160 last launch by any process of the slice */
    uint64_t busy_total_ns;     /* 168 GPU time charged, ever (measured pairs and learned costs) */
    uint64_t throttled_total_ns;/* 176 time launches were held back, ever (summed over threads) */
    uint64_t launches;          /* 184 launches seen, ever */
    int64_t win_start_ns;       /* 192 current window (struct gs_ctl_window) */
    int64_t win_busy_ns;        /* 200 */
    int64_t win_throttled_ns;   /* 208 */
    int32_t achieved_bp;        /* 216 achieved share over the last complete 1-s window, -1 none */
    int32_t throttled_bp;       /* 220 share of that window spent holding launches back */
    int64_t updated_ns;         /* 224 */
    uint8_t colocation;         /* 232 gs_config's enum gs_colocation: 0 preemptive, 1 shared, 2 tidal
                                       (issue 13, in what was padding: enforcers before it wrote 0 here,
                                       which is what they did: preemptive) */
    unsigned char pad[23];      /* 233 */
};

#define GS_DS_PROC_IN_USE 1u
#define GS_DS_PROC_BUSY 2u      /* has GPU work outstanding (measured with events) */
#define GS_DS_PROC_LIGHT 4u     /* unpaced: no pairs; queued = launched within YIELD_GAP or drain_seen fresh */
#define GS_DS_PROC_TURNS 8u     /* takes turns with the other TURNS processes (offered load > 1) */
/* publishes what its poller observes of its drain event (drain_seen_ns, drain_backlog_ns,
 * drain_done_ns): neighbours read "queued" (a backlog) from the looks, not from "launched within
 * YIELD_GAP" (coloc.c; issue 13) */
#define GS_DS_PROC_DRAINS 16u
/* proc.path: how the process's launches go through the pacer now (README-compute.md) */
enum { GS_DS_PATH_LIGHT = 0, GS_DS_PATH_FREE = 1, GS_DS_PATH_TURNS = 2, GS_DS_PATH_YIELD = 3 };
struct gs_ds_proc {             /* 128 bytes */
    int32_t pid;                /*  0 */
    uint32_t flags;             /*  4 */
    int32_t slice;              /*  8 index of its slice record */
    uint32_t id;                /* 12 distinguishes engines of one pid (devices, tests) */
    int64_t want_seen_ns;       /* 16 last time it was seen waiting for its turn (a stale want expires) */
    int64_t last_launch_ns;     /* 24 */
    int64_t last_seen_ns;       /* 32 */
    uint64_t busy_total_ns;     /* 40 this process's share of the slice's GPU time */
    int64_t expect_idle_ns;     /* 48 predicted end of its queued work, 0 = unknown */
    int64_t want_since_ns;      /* 56 waiting for its turn on the device since, 0 = not waiting */
    int64_t heartbeat_ns;       /* 64 refreshed by the owner at least every GS_DS_HEARTBEAT_NS */
    uint64_t pidns;             /* 72 inode of the owner's PID namespace (/proc/self/ns/pid), 0 unknown */
    int64_t joined_ns;          /* 80 when the record was taken (with pid, id, pidns: the owner's identity) */
    uint32_t offered_bp;        /* 88 offered load (GPU time asked per CPU second, 10000 = 1.0), paced only */
    uint8_t path;               /* 92 GS_DS_PATH_* */
    unsigned char pad0[3];      /* 93 */
    int64_t drain_seen_ns;      /* 96 last time its poller saw its drain event pending (issue 13, in
                                       what was padding; 0 = never) */
    int64_t drain_done_ns;      /* 104 last time its poller saw its drain event complete with no newer
                                       record: its queue was empty then (issue 13, in what was padding) */
    int64_t drain_backlog_ns;   /* 112 its poller has seen a backlog since (0: none): its drain pending for
                                       DRAIN_SHORT, or 2+ launches since it was last seen drained; a
                                       neighbour holds only for a backlog (coloc.c) */
    unsigned char pad[8];       /* 120 */
};

/* A process's handle on one file (process-local, not part of the file). */
struct gs_devstate {
    int fd;
    unsigned char *map;
    struct gs_ds_header *hdr;
    struct gs_ds_slice *slices;
    struct gs_ds_proc *procs;
    char uuid[64];
    char dir[1024];            /* the folder the file is in (the policy roster is beside it: policy.h) */
    pthread_mutex_t local;     /* this handle's threads take the file's lock in turn (an OFD lock is the open file's) */
    int64_t hint_reap_ns;      /* last reap because the "held" hint was set */
    int guard;                 /* slot of the SIGBUS guard (devstate_guard.c), -1 none */
    int64_t recover_at_ns;     /* next attempt to map the file again after a truncation */
    int64_t backoff_until_ns;  /* after a lock timeout: only try the lock (no wait) until then */
    uint64_t lock_timeouts;    /* waits for the lock that ran out (GS_DS_LOCK_WAIT_NS) */
    uint64_t lock_refused;     /* lock calls that failed for any reason (timeouts, back-off) */
};

/* A neighbour may stop (SIGSTOP) while it holds the lock, or hold the file's flock: the longest one
 * call waits for either (devstate_lock.c). After a timeout the handle only tries the lock, without waiting, for
 * GS_DS_LOCK_BACKOFF_NS: a stopped holder costs a launch at most one wait per back-off period. A
 * locker that gets -1 goes on without the shared state (README-compute.md "Hostile neighbours").
 * 100 ms: a legitimate holder keeps the lock for microseconds (one scan of 160 records); only a
 * holder descheduled on a loaded machine comes near, and then waiting longer would not pace better. */
#define GS_DS_LOCK_WAIT_NS     100000000LL
#define GS_DS_LOCK_BACKOFF_NS 1000000000LL

/* Open (creating if needed) <dir>/<uuid>.dev. 0, or -1 with a one-line reason in err. */
int gs_devstate_open(struct gs_devstate *ds, const char *dir, const char *uuid, char *err, size_t errlen);
void gs_devstate_close(struct gs_devstate *ds);
/* Lock the shared state (bounded: GS_DS_LOCK_WAIT_NS; a holder that died releases it). 0 or -1. */
int gs_devstate_lock(struct gs_devstate *ds);
void gs_devstate_unlock(struct gs_devstate *ds);
/* Join (under lock): find or create the slice record for grant, update its configuration, take a
 * process record. 0 or -1 (tables full). */
int gs_devstate_join_locked(struct gs_devstate *ds, const char *grant, uint32_t share_bp, int mode,
                            int weight, int priority, int paced, int32_t pid, uint32_t id,
                            int *slice_idx, int *proc_idx);
void gs_devstate_leave_locked(struct gs_devstate *ds, int proc_idx);
/* Free records of processes that no longer exist (and slices left without processes). Returns how
 * many process records were freed. A record of our own PID namespace is alive while is_alive(pid)
 * (NULL = kill(pid, 0)); any other record while its heartbeat is younger than GS_DS_STALE_NS. */
int gs_devstate_reap_locked(struct gs_devstate *ds, int (*is_alive)(int32_t pid));
/* SIGBUS caught on a truncated state file since start (the mapping went private; devstate_guard.c). */
uint64_t gs_devstate_faults_caught(void);
/* Internal to devstate.c / devstate_guard.c. */
int gs_ds_flock_bounded(int fd);
int gs_ds_adopt_locked(struct gs_devstate *ds, char *err, size_t errlen);
int gs_ds_guard_add(struct gs_devstate *ds);
void gs_ds_guard_remove(struct gs_devstate *ds);
int gs_ds_guard_lost(const struct gs_devstate *ds);
int gs_ds_guard_recover(struct gs_devstate *ds);
/* Inode of this process's PID namespace (readlink /proc/self/ns/pid), 0 when unknown. */
uint64_t gs_devstate_pidns(void);
#endif
