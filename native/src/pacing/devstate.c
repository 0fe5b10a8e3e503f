/* gpuslice per-device shared state (layout and crash-safety: gpuslice/devstate.h). */
#define _GNU_SOURCE
#include "gpuslice/devstate.h"
#include "gpuslice/controller.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct gs_ds_header) == GS_DS_HEADER_SIZE, "header layout");
_Static_assert(sizeof(struct gs_ds_slice) == GS_DS_SLICE_SIZE, "slice layout");
_Static_assert(sizeof(struct gs_ds_proc) == GS_DS_PROC_SIZE, "proc layout");
_Static_assert(offsetof(struct gs_ds_slice, credit_ns) == 144, "slice layout");
_Static_assert(offsetof(struct gs_ds_slice, achieved_bp) == 216, "slice layout");
_Static_assert(offsetof(struct gs_ds_proc, busy_total_ns) == 40, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, heartbeat_ns) == 64, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, pidns) == 72, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, joined_ns) == 80, "proc layout");
_Static_assert(offsetof(struct gs_ds_slice, colocation) == 232, "slice layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_seen_ns) == 96, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_done_ns) == 104, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_backlog_ns) == 112, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, offered_bp) == 88, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, path) == 92, "proc layout");

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int init_file(struct gs_devstate *ds)
{
    memset(ds->map, 0, GS_DS_FILE_SIZE);
    struct gs_ds_header *h = ds->hdr;
    h->version = GS_DS_VERSION;
    h->size = GS_DS_FILE_SIZE;
    h->max_slices = GS_DS_MAX_SLICES;
    h->max_procs = GS_DS_MAX_PROCS;
    h->slice_off = GS_DS_SLICE_OFF;
    h->slice_size = GS_DS_SLICE_SIZE;
    h->proc_off = GS_DS_PROC_OFF;
    h->proc_size = GS_DS_PROC_SIZE;
    h->created_ns = mono_ns();
    /* the lock is not in the file (an OFD lock on byte GS_DS_LOCK_BYTE: devstate_lock.c); bytes 128.. are zero */
    /* magic last: a reader that sees the magic sees an initialised file */
    __atomic_store_n(&h->magic, GS_DS_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

static int validate(const struct gs_ds_header *h, char *err, size_t errlen)
{
    if (h->magic != GS_DS_MAGIC) {
        snprintf(err, errlen, "device state: bad magic");
        return -1;
    }
    if (h->version != GS_DS_VERSION || h->size != GS_DS_FILE_SIZE || h->slice_off != GS_DS_SLICE_OFF ||
        h->slice_size != GS_DS_SLICE_SIZE || h->proc_off != GS_DS_PROC_OFF || h->proc_size != GS_DS_PROC_SIZE ||
        h->max_slices != GS_DS_MAX_SLICES || h->max_procs != GS_DS_MAX_PROCS) {
        snprintf(err, errlen,
                 "device state: version %u size %u not known (this build: version %u size %u): processes of "
                 "different gpuslice versions cannot coordinate; remove the file once none of the other version runs",
                 h->version, h->size, GS_DS_VERSION, (unsigned)GS_DS_FILE_SIZE);
        return -1;
    }
    return 0;
}

/* Open <dir>/<uuid>.dev for reading and writing, creating it if missing: the one place that decides how
 * this file is created, opened and permissioned (trust model, native/README.md). The folder is shared by
 * every slice on the node and usually world-writable (sticky), so a tenant may have put anything there
 * first; a root process must never follow, chmod or truncate what a tenant named (issue 15: a symlink
 * here turned a root-owned 0600 file into 0666). So: the folder is opened once without following a link
 * and every name is resolved relative to it (openat); the file is never followed (O_NOFOLLOW) and must be
 * a regular file with one link; only a file this call created gets mode 0666 (umask must not lock other
 * users' slices out of coordination). Returns the fd, or -1 with err set. */
static int open_state_file(const char *dir, const char *uuid, char *path, size_t pathlen, char *err, size_t errlen)
{
    if (snprintf(path, pathlen, "%s/%s.dev", dir, uuid) >= (int)pathlen) {
        snprintf(err, errlen, "device state: path too long");
        return -1;
    }
    /* The folder is shared by every slice on the node: world-writable with the sticky bit, like /tmp, so
     * processes of different users can join and none can replace another's file. */
    int dfd = -1;
    if (mkdir(dir, 01777) == 0) {
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd >= 0) fchmod(dfd, 01777); /* ours, just made: umask must not narrow it */
    } else {
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (dfd < 0) {
        snprintf(err, errlen, "device state: folder %s: %s", dir,
                 errno == ELOOP || errno == ENOTDIR ? "not a directory (a link is not followed)" : strerror(errno));
        return -1;
    }
    char name[80];
    snprintf(name, sizeof name, "%s.dev", uuid);
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
        fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0 || errno != ENOENT) break;
        fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0) fchmod(fd, 0666); /* created by this call: the one file we may widen */
        else if (errno != EEXIST) break;  /* else someone else created it just now: open theirs */
    }
    int saved = errno;
    close(dfd);
    if (fd < 0) {
        snprintf(err, errlen, "device state: open %s: %s", path,
                 saved == ELOOP ? "it is a symbolic link (not followed)" : strerror(saved));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        snprintf(err, errlen, "device state: %s is not a regular file with a single link: not used", path);
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* The creation lock, bounded: a tenant that takes the flock and stops must not hang a neighbour's
 * first launch (GS_DS_LOCK_WAIT_NS). 0, or -1 with errno. */
int gs_ds_flock_bounded(int fd)
{
    int64_t until = mono_ns() + GS_DS_LOCK_WAIT_NS;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (mono_ns() >= until) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct timespec ts = {0, 1000000}; /* creation takes microseconds: 1 ms polls are plenty */
        nanosleep(&ts, NULL);
    }
}

/* Under the flock, with the file mapped: a file of zeros (just created, or its creator died before
 * the magic, or a tenant cut it to nothing) is initialised; anything else must be a header we know. */
int gs_ds_adopt_locked(struct gs_devstate *ds, char *err, size_t errlen)
{
    char scratch[256];
    if (!err) {
        err = scratch;
        errlen = sizeof scratch;
    }
    if (ds->hdr->magic == 0) {
        if (init_file(ds) != 0) {
            snprintf(err, errlen, "device state: mutex init failed");
            return -1;
        }
        snprintf(ds->hdr->uuid, sizeof ds->hdr->uuid, "%s", ds->uuid);
        return 0;
    }
    return validate(ds->hdr, err, errlen);
}

int gs_devstate_open(struct gs_devstate *ds, const char *dir, const char *uuid, char *err, size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    ds->fd = -1;
    ds->guard = -1;
    pthread_mutex_init(&ds->local, NULL);
    if (!dir || !*dir || !uuid || !*uuid || strchr(uuid, '/') || strlen(uuid) > 63) {
        snprintf(err, errlen, "device state: need a directory and a device uuid");
        return -1;
    }
    snprintf(ds->uuid, sizeof ds->uuid, "%s", uuid);
    if (snprintf(ds->dir, sizeof ds->dir, "%s", dir) >= (int)sizeof ds->dir) {
        snprintf(err, errlen, "device state: folder path longer than %zu bytes", sizeof ds->dir - 1);
        return -1;
    }
    char path[1200];
    int fd = open_state_file(dir, uuid, path, sizeof path, err, errlen);
    if (fd < 0) return -1;
    if (gs_ds_flock_bounded(fd) != 0) {
        snprintf(err, errlen, "device state: flock %s: %s", path,
                 errno == ETIMEDOUT ? "held by another process for more than 100 ms" : strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) goto fail_errno;
    if (st.st_size == 0) {
        if (ftruncate(fd, GS_DS_FILE_SIZE) != 0) goto fail_errno;
    } else if (st.st_size != GS_DS_FILE_SIZE) {
        snprintf(err, errlen,
                 "device state: %s has size %lld, expected %d (version %u): a gpuslice of another version "
                 "uses it; processes of different versions cannot coordinate; remove the file once none runs",
                 path, (long long)st.st_size, GS_DS_FILE_SIZE, GS_DS_VERSION);
        goto fail;
    }
    void *m = mmap(NULL, GS_DS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) goto fail_errno;
    ds->map = m;
    ds->hdr = (struct gs_ds_header *)m;
    ds->slices = (struct gs_ds_slice *)(ds->map + GS_DS_SLICE_OFF);
    ds->procs = (struct gs_ds_proc *)(ds->map + GS_DS_PROC_OFF);
    ds->fd = fd;
    /* guarded before the first access: the file may be cut short from here on (devstate_guard.c) */
    if (gs_ds_guard_add(ds) != 0) {
        snprintf(err, errlen, "device state: no SIGBUS guard could be set up; not used");
        goto fail_unmap;
    }
    if (gs_ds_adopt_locked(ds, err, errlen) != 0) goto fail_unmap;
    flock(fd, LOCK_UN);
    return 0;
fail_errno:
    snprintf(err, errlen, "device state: %s: %s", path, strerror(errno));
    goto fail;
fail_unmap:
    gs_ds_guard_remove(ds);
    munmap(ds->map, GS_DS_FILE_SIZE);
    ds->map = NULL;
fail:
    close(fd);
    ds->fd = -1;
    return -1;
}

void gs_devstate_close(struct gs_devstate *ds)
{
    gs_ds_guard_remove(ds);
    if (ds->map) munmap(ds->map, GS_DS_FILE_SIZE);
    if (ds->fd >= 0) close(ds->fd);
    pthread_mutex_destroy(&ds->local);
    memset(ds, 0, sizeof *ds);
    ds->fd = -1;
    ds->guard = -1;
    pthread_mutex_init(&ds->local, NULL); /* a closed handle may be closed again */
}

static int alive_kill(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

uint64_t gs_devstate_pidns(void)
{
    /* cached per pid: a child forked after unshare(CLONE_NEWPID) lives in another namespace */
    static pid_t cached_pid;
    static uint64_t cached;
    pid_t me = getpid();
    if (__atomic_load_n(&cached_pid, __ATOMIC_ACQUIRE) == me) return __atomic_load_n(&cached, __ATOMIC_RELAXED);
    char buf[64];
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
    uint64_t ino = 0;
    if (n > 0) {
        buf[n] = 0;
        const char *p = strchr(buf, '[');  /* "pid:[4026531836]" */
        if (p)
            for (p++; *p >= '0' && *p <= '9'; p++) ino = ino * 10 + (uint64_t)(*p - '0');
    }
    __atomic_store_n(&cached, ino, __ATOMIC_RELAXED);
    __atomic_store_n(&cached_pid, me, __ATOMIC_RELEASE);
    return ino;
}

/* Same PID namespace: the pid is ours to ask about. Another (or unknown) namespace: only the
 * heartbeat can tell; kill() there would ask about an unrelated process or nobody. */
static int record_alive(const struct gs_ds_proc *p, uint64_t my_ns, int64_t now, int (*is_alive)(int32_t))
{
    if (my_ns && p->pidns == my_ns) return is_alive(p->pid);
    return p->heartbeat_ns > 0 && now - p->heartbeat_ns < GS_DS_STALE_NS;
}

int gs_devstate_reap_locked(struct gs_devstate *ds, int (*is_alive)(int32_t pid))
{
    if (!is_alive) is_alive = alive_kill;
    int freed = 0;
    int refs[GS_DS_MAX_SLICES] = {0};
    uint64_t my_ns = gs_devstate_pidns();
    int64_t now = mono_ns();
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        struct gs_ds_proc *p = &ds->procs[i];
        if (!(p->flags & GS_DS_PROC_IN_USE)) continue;
        if (!record_alive(p, my_ns, now, is_alive)) {
            memset(p, 0, sizeof *p);
            freed++;
            continue;
        }
        if (p->slice >= 0 && p->slice < GS_DS_MAX_SLICES) refs[p->slice]++;
    }
    for (int s = 0; s < GS_DS_MAX_SLICES; s++)
        if ((ds->slices[s].flags & GS_DS_SLICE_IN_USE) && refs[s] == 0) memset(&ds->slices[s], 0, sizeof ds->slices[s]);
    ds->hdr->last_reap_ns = mono_ns();
    return freed;
}

int gs_devstate_join_locked(struct gs_devstate *ds, const char *grant, uint32_t share_bp, int mode,
                            int weight, int priority, int paced, int32_t pid, uint32_t id,
                            int *slice_idx, int *proc_idx)
{
    int s = -1, free_s = -1;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        struct gs_ds_slice *r = &ds->slices[i];
        if (!(r->flags & GS_DS_SLICE_IN_USE)) {
            if (free_s < 0) free_s = i;
            continue;
        }
        if (strncmp(r->grant, grant, sizeof r->grant) == 0) {
            s = i;
            break;
        }
    }
    int p = -1;
    for (int i = 0; i < GS_DS_MAX_PROCS; i++)
        if (!(ds->procs[i].flags & GS_DS_PROC_IN_USE)) {
            p = i;
            break;
        }
    if (s < 0 && free_s < 0) {
        if (gs_devstate_reap_locked(ds, NULL) > 0) return gs_devstate_join_locked(ds, grant, share_bp, mode, weight, priority, paced, pid, id, slice_idx, proc_idx);
        return -1;
    }
    if (p < 0) {
        if (gs_devstate_reap_locked(ds, NULL) > 0) return gs_devstate_join_locked(ds, grant, share_bp, mode, weight, priority, paced, pid, id, slice_idx, proc_idx);
        return -1;
    }
    struct gs_ds_slice *r;
    if (s < 0) {
        s = free_s;
        r = &ds->slices[s];
        memset(r, 0, sizeof *r);
        snprintf(r->grant, sizeof r->grant, "%s", grant);
        r->achieved_bp = -1;
        r->flags = GS_DS_SLICE_IN_USE;
    }
    r = &ds->slices[s];
    /* the latest joiner's configuration wins: all processes of a grant read the same slice file */
    r->share_bp = share_bp;
    r->mode = (uint8_t)mode;
    r->weight = (uint8_t)weight;
    r->priority = (uint8_t)priority;
    r->paced = (uint8_t)(paced != 0);
    r->rate_bp = share_bp;
    struct gs_ds_proc *q = &ds->procs[p];
    memset(q, 0, sizeof *q);
    q->pid = pid;
    q->id = id;
    q->slice = s;
    q->last_seen_ns = mono_ns();
    q->heartbeat_ns = q->last_seen_ns;
    q->joined_ns = q->last_seen_ns;
    q->pidns = gs_devstate_pidns();
    q->flags = GS_DS_PROC_IN_USE | (paced ? 0u : GS_DS_PROC_LIGHT);
    *slice_idx = s;
    *proc_idx = p;
    return 0;
}

void gs_devstate_leave_locked(struct gs_devstate *ds, int proc_idx)
{
    if (proc_idx < 0 || proc_idx >= GS_DS_MAX_PROCS) return;
    int s = ds->procs[proc_idx].slice;
    memset(&ds->procs[proc_idx], 0, sizeof ds->procs[proc_idx]);
    for (int i = 0; i < GS_DS_MAX_PROCS; i++)
        if ((ds->procs[i].flags & GS_DS_PROC_IN_USE) && ds->procs[i].slice == s) return;
    if (s >= 0 && s < GS_DS_MAX_SLICES) memset(&ds->slices[s], 0, sizeof ds->slices[s]);
}
