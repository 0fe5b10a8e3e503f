/* gpuslice per-device shared state: how the slices (and their processes) on one device see each
 * other, for the compute pacer and for `gpuslice ps` (Python reader: gpuslice.enforcer.devstate).
 *
 * Version 5 (issue 15): one file per slice and device, written only by that slice's processes:
 *
 *   <device_state_dir>/<device-uuid>.slices/          the device's folder (root's, 0755, when a root
 *                                                     manager made it; else the first enforcer's, 01777)
 *   <device_state_dir>/<device-uuid>.slices/<grant>   the grant's file: the local agent makes it owned by
 *                                                     the grant's user, 0644; the device plugin / DRA driver
 *                                                     0666 in a host folder only that container mounts
 *                                                     read-write; without a manager the enforcer makes it
 *                                                     O_EXCL, 0644
 *
 * Layout of a slice file (fixed, little-endian, x86-64/aarch64 native), GS_DS_FILE_SIZE bytes (an empty
 * file is one its manager made before any process joined: the first joiner sizes and initialises it):
 *   offset 0       header, 256 bytes   (struct gs_ds_header)
 *   offset 256     the slice record, 256 bytes (struct gs_ds_slice; its grant is the file's name)
 *   offset 65536   GS_DS_SLOT_PROCS process records of 128 bytes (struct gs_ds_proc)
 * The records start on a 64 KiB boundary so that every page size Linux uses can map them on their own.
 *
 * Each process maps its own slice's file read-write and every other file of the folder read-only, one
 * "slot" each: the slot's page 0 (header + slice record) at sbase + slot * page and its process
 * records at pbase + slot * page, inside two address ranges reserved at open. Slot numbers are the
 * handle's own (another process numbers the same files otherwise), so nothing written to a file names a
 * slot: a process record's slice is the slot it is in (gs_ds_proc_slice). Empty slots are zero pages.
 * Until version 4 every slice wrote one shared file (0666): any tenant could rewrite, free or truncate
 * its neighbours' records (issue 15); now a tenant writes only its own slice's records, and a
 * neighbour's file is mapped read-only, so nothing this process does can write it either.
 *
 * Readers check magic, version, size and the record offsets/sizes in the header and skip what they
 * do not know. A layout change bumps GS_DS_VERSION.
 * Locking: updates take the device's lock, an exclusive flock() on the folder (any process that can
 * read the folder can take it; the kernel releases it when its holder dies), bounded
 * (GS_DS_LOCK_WAIT_NS). Counters are monotonic sums, so a half-done update loses at most one increment.
 *
 * Hostile neighbours (trust model: native/README.md, README-compute.md): a neighbour can publish false
 * activity about its own slice (policy comes from root's roster, policy.h), hold the folder's lock for
 * at most what a locker waits (bounded, then back-off), and cut its own file short (a SIGBUS on our
 * read-only mapping is caught: devstate_guard.c; its slot reads as empty until its file is whole).
 * Records are range-checked wherever they are read.
 *
 * Liveness: a process frees its own records at exit; the processes of a slice free the records of
 * slice-mates that died (same PID namespace: kill(pid, 0); a slice's processes share one). A handle
 * maps a neighbour's file only while it has a live record (kill(pid, 0) in our own PID namespace, else
 * a heartbeat younger than GS_DS_STALE_NS): a slice with no process on the device (its processes left,
 * or were killed without freeing their records) takes no slot and reads as absent; each scan looks at
 * such files again, so a process that joins one is seen within GS_DS_SCAN_NS. Our own slot is given
 * back when its last record leaves. Owners refresh heartbeat_ns at least every GS_DS_HEARTBEAT_NS. */
#ifndef GPUSLICE_DEVSTATE_H
#define GPUSLICE_DEVSTATE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GS_DS_MAGIC 0x004345524C535347ULL /* "GSSLREC\0" little-endian */
#define GS_DS_VERSION 5u
#define GS_DS_MAX_SLICES 32           /* files (slots) a handle maps per device; more are not seen */
#define GS_DS_SLOT_PROCS 32           /* process records per slice file */
#define GS_DS_MAX_PROCS (GS_DS_MAX_SLICES * GS_DS_SLOT_PROCS) /* process index space of a handle */
#define GS_DS_HEADER_SIZE 256
#define GS_DS_SLICE_SIZE 256
#define GS_DS_PROC_SIZE 128
#define GS_DS_SLICE_OFF GS_DS_HEADER_SIZE
#define GS_DS_PROC_OFF 65536
#define GS_DS_FILE_SIZE (GS_DS_PROC_OFF + GS_DS_SLOT_PROCS * GS_DS_PROC_SIZE)
#define GS_DS_FOLDER_SUFFIX ".slices"
/* the owner refreshes heartbeat_ns at least this often; a record of another PID namespace whose
 * heartbeat is older than STALE is freed (5 missed beats: a poller is never that late unless its
 * process is stopped or gone; a stopped one joins again when it runs) */
#define GS_DS_HEARTBEAT_NS 1000000000LL
#define GS_DS_STALE_NS     5000000000LL

struct gs_ds_header {           /* 256 bytes */
    uint64_t magic;             /*   0 */
    uint32_t version;           /*   8 */
    uint32_t size;              /*  12 total file size */
    uint32_t max_procs;         /*  16 GS_DS_SLOT_PROCS */
    uint32_t slice_off;         /*  20 */
    uint32_t slice_size;        /*  24 */
    uint32_t proc_off;          /*  28 */
    uint32_t proc_size;         /*  32 */
    uint32_t pad0;              /*  36 */
    int64_t created_ns;         /*  40 CLOCK_MONOTONIC */
    uint64_t updates;           /*  48 count of locked updates of this file (readers: detect a torn read) */
    char uuid[64];              /*  56 device UUID, NUL-terminated */
    unsigned char pad[136];     /* 120 */
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

/* What a handle's slot holds (process-local). */
enum { GS_DS_SLOT_FREE = 0, GS_DS_SLOT_OWN = 1, GS_DS_SLOT_PEER = 2 };
struct gs_ds_slot {
    int state;                 /* GS_DS_SLOT_*: OWN mapped read-write, PEER read-only, FREE zero pages */
    int fd;                    /* OWN: the file, kept for recovery after a truncation; else -1 */
    uint64_t dev, ino;         /* the file's identity (a name made again is another file) */
    int lost;                  /* set by the SIGBUS guard: the slot's pages are private zeros now (atomic) */
    int pins;                  /* OWN: engines of this handle whose records live here; never given back while > 0 */
    int private_copy;          /* OWN without a file: our slice's own file was unusable (neighbours do not see it) */
    char name[128];            /* the grant the file is named after */
};

/* A process's handle on one device's folder (process-local, not part of any file). */
struct gs_devstate {
    int dfd;                   /* the folder, read-only: its flock is the device's lock; -1 closed */
    unsigned char *sbase;      /* GS_DS_MAX_SLICES pages: slot i's header and slice record at sbase + i * page */
    unsigned char *pbase;      /* GS_DS_MAX_SLICES pages: slot i's process records at pbase + i * page */
    size_t page;
    int nslots;                /* loops stop here: one past the highest slot used since open (atomic) */
    int lost_any;              /* some slot's `lost` may be set: the SIGBUS guard sets it after the slot's, the
                                  next lock clears it and looks (atomic; without it every lock read 32 flags) */
    struct gs_ds_slot slot[GS_DS_MAX_SLICES];
    int64_t scanned_ns;        /* last scan of the folder (gs_devstate_scan_locked) */
    int64_t mtime_checked_ns;  /* last look at the folder's mtime */
    int64_t folder_mtime_ns;   /* the folder's mtime at the last scan */
    uint64_t unseen;           /* files the last scan could not map (slots full, not whole, unknown version, not reached) */
    int scan_from;             /* where among the unmapped files the next scan starts looking (round robin) */
    char why[240];             /* why the last join failed, or went to a private copy (for the enforcer's log) */
    int managed;               /* the folder is a manager's (root's or the overflow uid's, writable by nobody else,
                                  or a read-only mount): any file in it is one the manager made for its grant */
    char uuid[64];
    char dir[1024];            /* the device-state folder (the policy roster is beside this device's folder: policy.h) */
    pthread_mutex_t local;     /* this handle's threads take the folder's lock in turn (a flock is the open file's) */
    int guard;                 /* slot of the SIGBUS guard (devstate_guard.c), -1 none */
    int64_t recover_at_ns;     /* next attempt to map an own file again after a truncation */
    int64_t backoff_until_ns;  /* after a lock timeout: only try the lock (no wait) until then */
    uint64_t lock_timeouts;    /* waits for the lock that ran out (GS_DS_LOCK_WAIT_NS) */
    uint64_t lock_refused;     /* lock calls that failed for any reason (timeouts, back-off) */
};

/* Record access: slot numbers and process indexes are the handle's own. Process index j is record
 * j % GS_DS_SLOT_PROCS of slot j / GS_DS_SLOT_PROCS. Loops run to gs_ds_nslices / gs_ds_nprocs. */
static inline struct gs_ds_header *gs_ds_hdr(const struct gs_devstate *ds, int slot)
{
    return (struct gs_ds_header *)(void *)(ds->sbase + (size_t)slot * ds->page);
}
static inline struct gs_ds_slice *gs_ds_slice(const struct gs_devstate *ds, int slot)
{
    return (struct gs_ds_slice *)(void *)(ds->sbase + (size_t)slot * ds->page + GS_DS_SLICE_OFF);
}
static inline struct gs_ds_proc *gs_ds_proc(const struct gs_devstate *ds, int j)
{
    return (struct gs_ds_proc *)(void *)(ds->pbase + (size_t)(j / GS_DS_SLOT_PROCS) * ds->page +
                                         (size_t)(j % GS_DS_SLOT_PROCS) * GS_DS_PROC_SIZE);
}
static inline int gs_ds_proc_slice(int j) { return j / GS_DS_SLOT_PROCS; }
static inline int gs_ds_nslices(const struct gs_devstate *ds) { return __atomic_load_n(&ds->nslots, __ATOMIC_ACQUIRE); }
static inline int gs_ds_nprocs(const struct gs_devstate *ds) { return gs_ds_nslices(ds) * GS_DS_SLOT_PROCS; }
/* Slot i is this handle's own slice file (mapped read-write): the only records it may write. */
static inline int gs_ds_own(const struct gs_devstate *ds, int slot)
{
    return slot >= 0 && slot < GS_DS_MAX_SLICES && ds->slot[slot].state == GS_DS_SLOT_OWN;
}

/* A neighbour may stop (SIGSTOP) while it holds the lock, or hold the file's flock: the longest one
 * call waits for either (devstate_lock.c). After a timeout the handle only tries the lock, without waiting, for
 * GS_DS_LOCK_BACKOFF_NS: a stopped holder costs a launch at most one wait per back-off period. A
 * locker that gets -1 goes on without the shared state (README-compute.md "Hostile neighbours").
 * 100 ms: a legitimate holder keeps the lock for microseconds (one scan of 160 records); only a
 * holder descheduled on a loaded machine comes near, and then waiting longer would not pace better. */
#define GS_DS_LOCK_WAIT_NS     100000000LL
#define GS_DS_LOCK_BACKOFF_NS 1000000000LL

/* Open the device's folder <dir>/<uuid>.slices (making it, 01777, when there is none: no root manager)
 * and map the slice files in it read-only. 0, or -1 with a one-line reason in err. */
int gs_devstate_open(struct gs_devstate *ds, const char *dir, const char *uuid, char *err, size_t errlen);
void gs_devstate_close(struct gs_devstate *ds);
/* Lock the device (bounded: GS_DS_LOCK_WAIT_NS; a holder that died releases it). 0 or -1. */
int gs_devstate_lock(struct gs_devstate *ds);
void gs_devstate_unlock(struct gs_devstate *ds);
/* Join (under lock): map grant's own file read-write (made O_EXCL 0644 when missing and the folder lets us),
 * set up its slice record, take a process record, and pin the slot (it is not given back while pinned). Our
 * own file cut or scribbled by the slice's own processes is made whole and initialised again (ds->why says
 * so); one that cannot be used (missing and not ours to make, a link, another user's, its records all taken)
 * leaves the slice on a private copy, which neighbours do not see, rather than unpaced (ds->why says so) — a
 * tenant must not escape its pacing by spoiling its own file. 0, or -1 (a grant that cannot name a file). */
int gs_devstate_join_locked(struct gs_devstate *ds, const char *grant, uint32_t share_bp, int mode,
                            int weight, int priority, int paced, int32_t pid, uint32_t id,
                            int *slice_idx, int *proc_idx);
void gs_devstate_leave_locked(struct gs_devstate *ds, int proc_idx); /* frees the record, unpins its slot */
/* An engine whose record was taken from it joined again (maybe in another slot): its old slot's pin goes. */
void gs_devstate_unpin_locked(struct gs_devstate *ds, int slot);
/* Free the records of our own slices' processes that no longer exist (and a slice record left without
 * processes). Returns how many process records were freed. A record of our own PID namespace is alive
 * while is_alive(pid) (NULL = kill(pid, 0)); any other record while its heartbeat is younger than
 * GS_DS_STALE_NS. Neighbours' records are never written: gs_devstate_scan_locked hides a dead one. */
int gs_devstate_reap_locked(struct gs_devstate *ds, int (*is_alive)(int32_t pid));
/* With the handle's mutex held (gs_devstate_lock takes it before the device's flock, and scans before that:
 * a scan holds up no other process): look at the folder again (files with a live record mapped, removed
 * ones and ones without a live record dropped), every GS_DS_SCAN_NS, and at once when the folder's mtime
 * moved (looked at every GS_DS_MTIME_NS). force: now. 50 ms: a process joining a file its manager made
 * earlier moves no mtime, so this is how soon neighbours see it. A scan reads no more than
 * GS_DS_SCAN_MAX_ENTRIES entries and opens no more than GS_DS_SCAN_MAX_OPENS files it has not mapped, each
 * scan starting where the last one stopped (a folder someone filled costs each scan a bounded time; with n
 * idle files a joiner is seen within n / 24 scans; entries past the first 256 are not seen). */
void gs_devstate_scan_locked(struct gs_devstate *ds, int64_t now, int force);
#define GS_DS_SCAN_NS   50000000LL
#define GS_DS_MTIME_NS  10000000LL
#define GS_DS_SCAN_MAX_ENTRIES 256
#define GS_DS_SCAN_MAX_OPENS   24
/* In the child of a fork: the parent's handle let go of without touching the parent's records (its
 * descriptors closed — a child must not keep the parent's flock alive —, its ranges unmapped, its guard
 * entry removed); the handle is then closed and may be opened again. */
void gs_devstate_after_fork(struct gs_devstate *ds);
/* Once per thread, before it reads neighbours' files: SIGBUS unblocked in this thread (a synchronous SIGBUS
 * on a thread that blocks it kills the process whatever its handler: the guard could not catch a
 * neighbour's truncation there). Cheap after the first call (a thread-local flag). */
void gs_devstate_thread_ready(void);
/* SIGBUS caught on a truncated slice file since start (the slot went private; devstate_guard.c). */
uint64_t gs_devstate_faults_caught(void);
/* Internal to devstate*.c. */
int gs_ds_adopt_locked(struct gs_devstate *ds, int slot, char *err, size_t errlen);
int gs_ds_header_ok(const struct gs_ds_header *h); /* 0: a header of this version and layout */
/* Alive: our own PID namespace asks is_alive(pid) (NULL = kill(pid, 0)); another one the heartbeat. */
int gs_ds_record_alive(const struct gs_ds_proc *p, uint64_t my_ns, int64_t now, int (*is_alive)(int32_t));
int gs_ds_map_slot(struct gs_devstate *ds, int slot, int fd, int writable);
int gs_ds_find_slot(const struct gs_devstate *ds, uint64_t dev, uint64_t ino); /* the slot holding that file, -1 */
int gs_ds_free_slot(const struct gs_devstate *ds);                            /* a free slot, -1 */
void gs_ds_clear_slot(struct gs_devstate *ds, int slot);   /* pages zero, slot free */
void gs_ds_private_pages(struct gs_devstate *ds, int slot); /* pages zero, slot state kept */
int gs_ds_guard_add(struct gs_devstate *ds);
void gs_ds_guard_remove(struct gs_devstate *ds);
/* Under the lock: slots the guard made private since (own: mapped again; a neighbour's: dropped). */
void gs_ds_guard_recover(struct gs_devstate *ds);
/* Inode of this process's PID namespace (readlink /proc/self/ns/pid), 0 when unknown. */
uint64_t gs_devstate_pidns(void);
#endif
