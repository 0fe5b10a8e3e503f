/* The region file: creation (atomic, first comer wins), mapping, the robust process-shared mutex
 * with EOWNERDEAD recovery, the seqlock that lets readers copy without the lock, and reclaim of
 * dead processes. Layout and rules: include/gpuslice/region.h. */
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
#include <time.h>
#include <unistd.h>

#include "gpuslice/config.h"
#include "gpuslice/log.h"
#include "gpuslice/region.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int init_layout(struct gs_region *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    memcpy(r->magic, GS_REGION_MAGIC, 8);
    r->version = GS_REGION_VERSION;
    r->header_size = 128;
    r->size = sizeof *r;
    r->max_devices = GS_REGION_MAX_DEVICES;
    r->max_procs = GS_REGION_MAX_PROCS;
    r->device_size = sizeof(struct gs_region_device);
    r->proc_size = sizeof(struct gs_region_proc);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (!rc) rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc) rc = pthread_mutex_init(&r->lock.mutex, &a);
    pthread_mutexattr_destroy(&a);
    if (rc) {
        set_err(err, errlen, "region: cannot initialise the robust mutex: %s", strerror(rc));
        return -1;
    }
    r->flags = 1;
    return 0;
}

static int validate(const struct gs_region *r, const char *path, char *err, size_t errlen)
{
    if (memcmp(r->magic, GS_REGION_MAGIC, 8)) {
        set_err(err, errlen, "region %s: bad magic (not a gpuslice region)", path);
        return -1;
    }
    if (r->version != GS_REGION_VERSION) {
        set_err(err, errlen, "region %s: version %u is not supported by this enforcer (knows %u)", path,
                r->version, GS_REGION_VERSION);
        return -1;
    }
    if (r->size != sizeof *r || r->max_devices != GS_REGION_MAX_DEVICES || r->max_procs != GS_REGION_MAX_PROCS ||
        r->device_size != sizeof(struct gs_region_device) || r->proc_size != sizeof(struct gs_region_proc)) {
        set_err(err, errlen, "region %s: layout sizes do not match version %u", path, GS_REGION_VERSION);
        return -1;
    }
    return 0;
}

static struct gs_region *map_fd(int fd, char *err, size_t errlen, const char *path)
{
    void *p = mmap(NULL, sizeof(struct gs_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        set_err(err, errlen, "region %s: mmap: %s", path, strerror(errno));
        return NULL;
    }
    return p;
}

/* Build the file complete under a temporary name, then link() it into place: link is atomic and
 * fails with EEXIST if another process won, so nobody ever maps a half-initialised region. */
static struct gs_region *create_new(const char *path, char *err, size_t errlen)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    /* Mode 0600: the creating user's alone (trust model, native/README.md). A slice whose processes run as
     * several users gets its region from its manager before they start (the agent, the device plugin). */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        set_err(err, errlen, "region %s: cannot create %s: %s", path, tmp, strerror(errno));
        return NULL;
    }
    struct gs_region *r = NULL;
    if (ftruncate(fd, sizeof *r)) {
        set_err(err, errlen, "region %s: ftruncate: %s", path, strerror(errno));
        goto out;
    }
    if (!(r = map_fd(fd, err, errlen, path))) goto out;
    if (init_layout(r, err, errlen)) goto unmap;
    if (link(tmp, path) == 0) goto out;
    if (errno != EEXIST) set_err(err, errlen, "region %s: link: %s", path, strerror(errno));
    else set_err(err, errlen, "EEXIST");
unmap:
    munmap(r, sizeof *r);
    r = NULL;
out:
    unlink(tmp);
    close(fd);
    return r;
}

struct gs_region *gs_region_open(const char *path, char *err, size_t errlen)
{
    if (!path || !*path) {
        void *p = mmap(NULL, sizeof(struct gs_region), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            set_err(err, errlen, "region (private): mmap: %s", strerror(errno));
            return NULL;
        }
        if (init_layout(p, err, errlen)) {
            munmap(p, sizeof(struct gs_region));
            return NULL;
        }
        return p;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        /* No link followed, no FIFO or device opened (O_NONBLOCK keeps a FIFO from hanging the open). */
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st)) {
                set_err(err, errlen, "region %s: fstat: %s", path, strerror(errno));
                close(fd);
                return NULL;
            }
            if (!S_ISREG(st.st_mode)) {
                set_err(err, errlen, "region %s: not a regular file", path);
                close(fd);
                return NULL;
            }
            if ((size_t)st.st_size < 16) {
                set_err(err, errlen, "region %s: file is %lld bytes, too small for a region", path, (long long)st.st_size);
                close(fd);
                return NULL;
            }
            /* Check the version before trusting the size, so a future layout gets a clear error. */
            char head[16];
            if (pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head) {
                set_err(err, errlen, "region %s: cannot read header", path);
                close(fd);
                return NULL;
            }
            struct gs_region probe;
            memcpy(&probe, head, sizeof head);
            if (memcmp(probe.magic, GS_REGION_MAGIC, 8) || probe.version != GS_REGION_VERSION ||
                (size_t)st.st_size < sizeof(struct gs_region)) {
                probe.size = probe.max_devices = probe.max_procs = 0;
                validate(&probe, path, err, errlen);
                if (!memcmp(probe.magic, GS_REGION_MAGIC, 8) && probe.version == GS_REGION_VERSION)
                    set_err(err, errlen, "region %s: file is %lld bytes, expected %zu", path, (long long)st.st_size, sizeof(struct gs_region));
                close(fd);
                return NULL;
            }
            struct gs_region *r = map_fd(fd, err, errlen, path);
            close(fd);
            if (r && validate(r, path, err, errlen)) {
                munmap(r, sizeof *r);
                return NULL;
            }
            return r;
        }
        if (errno != ENOENT) {
            set_err(err, errlen, "region %s: cannot open: %s", path,
                    errno == ELOOP ? "it is a symbolic link (a region must be a regular file)" : strerror(errno));
            return NULL;
        }
        struct gs_region *r = create_new(path, err, errlen);
        if (r) return r;
        if (strcmp(err, "EEXIST")) return NULL; /* a real error; else someone else created it: open theirs */
    }
    set_err(err, errlen, "region %s: could not open or create it", path);
    return NULL;
}

void gs_region_close(struct gs_region *r)
{
    if (r) munmap(r, sizeof *r);
}

void gs_region_write_begin(struct gs_region *r)
{
    __atomic_add_fetch(&r->seq, 1, __ATOMIC_ACQ_REL);
}

void gs_region_write_end(struct gs_region *r)
{
    __atomic_add_fetch(&r->seq, 1, __ATOMIC_RELEASE);
}

void gs_region_rebuild(struct gs_region *r)
{
    for (int d = 0; d < GS_REGION_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (int p = 0; p < GS_REGION_MAX_PROCS; p++)
            if (r->procs[p].state == 1) sum += r->procs[p].used[d];
        r->devices[d].used = sum;
        if (sum > r->devices[d].peak) r->devices[d].peak = sum;
    }
}

int gs_region_lock(struct gs_region *r)
{
    int rc = pthread_mutex_lock(&r->lock.mutex);
    if (rc == 0) return 0;
    if (rc == EOWNERDEAD) {
        /* The previous holder died inside: its half-done update may have left a device total out of
         * step with the process records and seq odd. Rebuild totals from the records (the per-process
         * numbers are each written by one 8-byte store), make seq even, and carry on. */
        GS_WARN("region: previous lock holder died; recovering (rebuilding totals from process records)");
        if (r->seq & 1) r->seq++;
        gs_region_write_begin(r);
        gs_region_rebuild(r);
        gs_region_write_end(r);
        pthread_mutex_consistent(&r->lock.mutex);
        return 0;
    }
    GS_ERROR("region: lock failed: %s", strerror(rc));
    return -1;
}

void gs_region_unlock(struct gs_region *r)
{
    pthread_mutex_unlock(&r->lock.mutex);
}

int gs_region_device_index(struct gs_region *r, const char *uuid, uint64_t limit, uint64_t ctx_overhead,
                           uint32_t compute, uint64_t *lowered_from)
{
    uint32_t n = r->device_count;
    if (n > GS_REGION_MAX_DEVICES) n = GS_REGION_MAX_DEVICES;
    for (uint32_t i = 0; i < n; i++) {
        struct gs_region_device *d = &r->devices[i];
        if (!gs_uuid_same(d->uuid, uuid)) continue;
        /* A slice file may shrink the slice (lower), never grow an existing region (see region.h). */
        if (limit < d->limit) {
            if (lowered_from) *lowered_from = d->limit;
            gs_region_write_begin(r);
            d->limit = limit;
            gs_region_write_end(r);
        }
        return (int)i;
    }
    if (n == GS_REGION_MAX_DEVICES) return -1;
    gs_region_write_begin(r);
    struct gs_region_device *d = &r->devices[n];
    memset(d, 0, sizeof *d);
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
    d->limit = limit;
    d->context_overhead = ctx_overhead;
    d->compute = compute;
    r->device_count = n + 1;
    gs_region_write_end(r);
    return (int)n;
}

int gs_region_set_limit(struct gs_region *r, int idx, uint64_t limit, uint32_t generation)
{
    if (idx < 0 || idx >= GS_REGION_MAX_DEVICES) return 0;
    struct gs_region_device *d = &r->devices[idx];
    int newer = generation > d->generation;
    if (!(newer ? limit != d->limit : limit < d->limit)) {
        if (newer) d->generation = generation; /* same limit, newer file: remember it was read */
        return 0;
    }
    gs_region_write_begin(r);
    d->limit = limit;
    if (newer) d->generation = generation;
    gs_region_write_end(r);
    return 1;
}

uint64_t gs_proc_start_time(int32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    /* Field 2 (comm) may hold spaces and parentheses: count fields after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

static int proc_alive(const struct gs_region_proc *pr)
{
    if (pr->pid <= 0) return 0;
    if (kill(pr->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t st = gs_proc_start_time(pr->pid);
    /* A zombie still answers kill(0); /proc/<pid>/stat then reads state Z, and its memory is gone. */
    if (st && pr->start_time && st != pr->start_time) return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pr->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n > 0) {
            buf[n] = 0;
            char *q = strrchr(buf, ')');
            if (q && q[1] == ' ' && (q[2] == 'Z' || q[2] == 'X')) return 0;
        }
    }
    return 1;
}

static void clear_proc(struct gs_region *r, int i)
{
    struct gs_region_proc *pr = &r->procs[i];
    for (int d = 0; d < GS_REGION_MAX_DEVICES; d++) {
        uint64_t u = pr->used[d];
        r->devices[d].used = r->devices[d].used >= u ? r->devices[d].used - u : 0;
    }
    memset(pr, 0, sizeof *pr);
}

int gs_region_reclaim_dead(struct gs_region *r)
{
    int n = 0;
    for (int i = 0; i < GS_REGION_MAX_PROCS; i++) {
        struct gs_region_proc *pr = &r->procs[i];
        if (pr->state != 1 || proc_alive(pr)) continue;
        uint64_t total = 0;
        for (int d = 0; d < GS_REGION_MAX_DEVICES; d++) total += pr->used[d];
        GS_INFO("region: reclaiming %llu bytes of dead process %d", (unsigned long long)total, (int)pr->pid);
        gs_region_write_begin(r);
        clear_proc(r, i);
        gs_region_write_end(r);
        n++;
    }
    return n;
}

int gs_region_proc_attach(struct gs_region *r, int32_t pid, uint64_t start_time)
{
    int free_slot = -1;
    for (int i = 0; i < GS_REGION_MAX_PROCS; i++) {
        struct gs_region_proc *pr = &r->procs[i];
        if (pr->state == 1 && pr->pid == pid) {
            /* Our pid already has a record: a previous image of this process (before exec) or a dead
             * process whose pid we got. Either way its device memory is gone: start from zero. */
            gs_region_write_begin(r);
            clear_proc(r, i);
            pr->pid = pid;
            pr->start_time = start_time;
            pr->state = 1;
            gs_region_write_end(r);
            return i;
        }
        if (pr->state != 1 && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0 && gs_region_reclaim_dead(r) > 0) return gs_region_proc_attach(r, pid, start_time);
    if (free_slot < 0) return -1;
    gs_region_write_begin(r);
    struct gs_region_proc *pr = &r->procs[free_slot];
    memset(pr, 0, sizeof *pr);
    pr->pid = pid;
    pr->start_time = start_time;
    pr->state = 1;
    gs_region_write_end(r);
    return free_slot;
}

void gs_region_proc_detach(struct gs_region *r, int slot)
{
    if (slot < 0 || slot >= GS_REGION_MAX_PROCS) return;
    gs_region_write_begin(r);
    clear_proc(r, slot);
    gs_region_write_end(r);
}
