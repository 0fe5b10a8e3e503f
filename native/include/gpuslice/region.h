/* The region: one file per slice, mmap'ed MAP_SHARED by every process of the slice and read by the
 * node's monitor (src/gpuslice/enforcer/region.py). This header IS the ABI; a layout change bumps
 * GS_REGION_VERSION. All integers little-endian (the only hosts are x86_64 / aarch64 Linux).
 *
 * Layout, version 1 (offsets in bytes; sizes are also recorded in the header so readers can check):
 *   0    char     magic[8]        "GSREGION"
 *   8    u32      version         1
 *   12   u32      header_size     128
 *   16   u64      size            total file size (105600)
 *   24   u32      max_devices     16
 *   28   u32      max_procs       128
 *   32   u32      device_size     192 (bytes per device record)
 *   36   u32      proc_size       800 (bytes per process record)
 *   40   u64      seq             seqlock: odd while a writer is inside; readers retry on odd/changed
 *   48   u32      device_count    device records in use
 *   52   u32      flags           bit0 = initialised; bit 1+i = device record i's context_overhead was
 *                                 measured on the card (src/accounting/ctxcost.c; additive, version 1)
 *   56   u64      created_ns      CLOCK_REALTIME at creation
 *   64   byte[64] lock            pthread_mutex_t, PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST
 *   128  device records [max_devices], each device_size bytes:
 *        0   char uuid[64]        "GPU-..." / "MIG-..." (NUL padded); "#<ordinal>" for HAMi-env slices
 *        64  u64  limit           bytes; UINT64_MAX = unlimited. The SLICE's limit (slice file / HAMi
 *                                 env), never a process's GPUSLICE_MEMORY_LIMIT; only ever lowered
 *        72  u64  used            bytes, sum of the processes' used[] for this device (incl. contexts)
 *        80  u64  peak            highest `used` seen
 *        88  u64  oom_refusals    allocations refused on this device
 *        96  u64  context_overhead bytes counted per CUDA context (configured, measured, or the default)
 *        104 u32  compute         compute share 0..100 from the config
 *        108 u32  generation      the slice file generation= that last set `limit` (live resize; was
 *                                 `reserved`, always 0 before: additive, version stays 1)
 *        112 u64  compute_spare[10]  written by the compute part (pacer), atomically, outside seq: [0] the
 *                                     slice's credit (ns, signed), [1] its refill clock (CLOCK_MONOTONIC ns);
 *                                     the rest unused (0)
 *   128 + max_devices*device_size: process records [max_procs], each proc_size bytes:
 *        0   i32  pid             0 = free slot
 *        4   u32  state           1 = active
 *        8   u64  start_time      /proc/<pid>/stat starttime (clock ticks) to tell pid reuse apart
 *        16  u64  oom_refusals
 *        24  u64  reserved
 *        32  u64  used[16]        bytes per device record index
 *        160 u64  peak[16]
 *        288 u32  contexts[16]    CUDA contexts counted per device
 *        352 u64  launches[16]    ┐ written by the compute part (pacer) with atomic adds, outside
 *        480 u64  throttled_ns[16]│ the lock and the seqlock: monotonic counters, each 8-byte
 *        608 u64  busy_ns[16]     ┘ aligned so readers never see a torn value
 *        736 u64  spare[8]        oom_policy=wait (src/accounting/oomwait.c; additive, version 1): [0]
 *                                 allocations waiting now, [1] waits started, [2] waits timed out, [3]
 *                                 bytes waited for now; atomic adds outside the lock. [4..7] unused
 *
 * Writers (memory accounting) take the robust mutex, then bump seq to odd, write, bump seq to even.
 * A writer killed inside leaves EOWNERDEAD: the next locker rebuilds device `used` from the process
 * records, makes seq even and marks the mutex consistent. Dead processes (pid gone, or pid reused
 * with another start_time) are reclaimed when a process attaches and before any refusal. */
#ifndef GPUSLICE_REGION_H
#define GPUSLICE_REGION_H
#include <pthread.h>
#include <stdint.h>

#define GS_REGION_MAGIC "GSREGION"
#define GS_REGION_VERSION 1u
#define GS_REGION_MAX_DEVICES 16
#define GS_REGION_MAX_PROCS 128

struct gs_region_device {
    char uuid[64];
    uint64_t limit;
    uint64_t used;
    uint64_t peak;
    uint64_t oom_refusals;
    uint64_t context_overhead;
    uint32_t compute;
    uint32_t generation;
    uint64_t compute_spare[10];
};

struct gs_region_proc {
    int32_t pid;
    uint32_t state;
    uint64_t start_time;
    uint64_t oom_refusals;
    uint64_t reserved;
    uint64_t used[GS_REGION_MAX_DEVICES];
    uint64_t peak[GS_REGION_MAX_DEVICES];
    uint32_t contexts[GS_REGION_MAX_DEVICES];
    uint64_t launches[GS_REGION_MAX_DEVICES];
    uint64_t throttled_ns[GS_REGION_MAX_DEVICES];
    uint64_t busy_ns[GS_REGION_MAX_DEVICES];
    uint64_t spare[8];
};

struct gs_region {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t size;
    uint32_t max_devices;
    uint32_t max_procs;
    uint32_t device_size;
    uint32_t proc_size;
    uint64_t seq;
    uint32_t device_count;
    uint32_t flags;
    uint64_t created_ns;
    union {
        pthread_mutex_t mutex;
        unsigned char bytes[64];
    } lock;
    struct gs_region_device devices[GS_REGION_MAX_DEVICES];
    struct gs_region_proc procs[GS_REGION_MAX_PROCS];
};

_Static_assert(sizeof(struct gs_region_device) == 192, "region ABI: device record is 192 bytes");
_Static_assert(sizeof(struct gs_region_proc) == 800, "region ABI: process record is 800 bytes");
_Static_assert(__builtin_offsetof(struct gs_region, devices) == 128, "region ABI: devices at 128");
_Static_assert(sizeof(struct gs_region) == 128 + 16 * 192 + 128 * 800, "region ABI: total size");
_Static_assert(__builtin_offsetof(struct gs_region_proc, launches) == 352, "region ABI: launches at 352");

/* Open (or create, atomically, if missing) the region at path; path "" maps a private anonymous
 * region. Returns NULL with err set. */
struct gs_region *gs_region_open(const char *path, char *err, size_t errlen);
void gs_region_close(struct gs_region *r);

/* Lock with EOWNERDEAD recovery; 0 or -1 (unrecoverable, logged). Enter/leave bracket writes with seq. */
int gs_region_lock(struct gs_region *r);
void gs_region_unlock(struct gs_region *r);
void gs_region_write_begin(struct gs_region *r);
void gs_region_write_end(struct gs_region *r);

/* Device record index for uuid (matched by hex part, GPU-/MIG- prefix ignored), created with
 * limit/overhead/compute if missing (caller holds lock). An existing record whose limit is above
 * `limit` is lowered to it (*lowered_from = the old limit): the slice file is authoritative for
 * shrinking a slice; growing one takes a fresh region, so that a process started with an older,
 * larger slice file can never undo a shrink (a live resize raises it through a newer generation:
 * gs_region_set_limit). -1 when the table is full. */
int gs_region_device_index(struct gs_region *r, const char *uuid, uint64_t limit, uint64_t ctx_overhead,
                           uint32_t compute, uint64_t *lowered_from);
/* Live resize (caller holds lock): a slice file of a higher generation than the record's sets the
 * device's limit to its own, up or down, and records that generation; one of the same or a lower
 * generation may only lower it (as gs_region_device_index). Returns 1 when the limit changed. */
int gs_region_set_limit(struct gs_region *r, int idx, uint64_t limit, uint32_t generation);
/* Process record for (pid, start_time): reuses our own stale record, else a free one (caller holds
 * lock). -1 when full even after reclaiming dead processes. */
int gs_region_proc_attach(struct gs_region *r, int32_t pid, uint64_t start_time);
/* Give a process record back (its usage leaves the device totals). Caller holds lock. */
void gs_region_proc_detach(struct gs_region *r, int slot);
/* Reclaim records of dead processes (caller holds lock). Returns how many were reclaimed. */
int gs_region_reclaim_dead(struct gs_region *r);
/* Rebuild device used[] from process records (caller holds lock, inside write). */
void gs_region_rebuild(struct gs_region *r);

/* starttime of pid from /proc/<pid>/stat (0 if unreadable). */
uint64_t gs_proc_start_time(int32_t pid);
#endif
