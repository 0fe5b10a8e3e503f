/* gpuslice per-device shared state: the device's folder and the slots its slice files are mapped at
 * (layout, trust and liveness: gpuslice/devstate.h; joining and reaping: devstate_records.c). */
#define _GNU_SOURCE
#include "gpuslice/clock.h"
#include "gpuslice/devstate.h"
#include "gpuslice/policy.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct gs_ds_header) == GS_DS_HEADER_SIZE, "header layout");
_Static_assert(offsetof(struct gs_ds_header, updates) == 48, "header layout");
_Static_assert(offsetof(struct gs_ds_header, uuid) == 56, "header layout");
_Static_assert(sizeof(struct gs_ds_slice) == GS_DS_SLICE_SIZE, "slice layout");
_Static_assert(sizeof(struct gs_ds_proc) == GS_DS_PROC_SIZE, "proc layout");
_Static_assert(GS_DS_SLOT_PROCS * GS_DS_PROC_SIZE == 4096, "a slot's records fill one 4 KiB page");
_Static_assert(offsetof(struct gs_ds_slice, credit_ns) == 144, "slice layout");
_Static_assert(offsetof(struct gs_ds_slice, achieved_bp) == 216, "slice layout");
_Static_assert(offsetof(struct gs_ds_slice, colocation) == 232, "slice layout");
_Static_assert(offsetof(struct gs_ds_proc, busy_total_ns) == 40, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, heartbeat_ns) == 64, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, pidns) == 72, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, joined_ns) == 80, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, offered_bp) == 88, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, path) == 92, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_seen_ns) == 96, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_done_ns) == 104, "proc layout");
_Static_assert(offsetof(struct gs_ds_proc, drain_backlog_ns) == 112, "proc layout");

/* A slot's two pages become private zero pages (empty to every loop). Writable: a launch thread of ours
 * still holding the slot's index when its last record left (a shutdown racing a launch) writes into
 * nothing rather than faulting. An engine's own slot is never given back while its record is in use. */
void gs_ds_private_pages(struct gs_devstate *ds, int slot)
{
    mmap(ds->sbase + (size_t)slot * ds->page, ds->page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mmap(ds->pbase + (size_t)slot * ds->page, ds->page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

void gs_ds_clear_slot(struct gs_devstate *ds, int slot)
{
    struct gs_ds_slot *s = &ds->slot[slot];
    gs_ds_private_pages(ds, slot);
    if (s->fd >= 0) close(s->fd);
    memset(s, 0, sizeof *s);
    s->fd = -1;
    __atomic_store_n(&s->lost, 0, __ATOMIC_RELEASE);
}

/* Map fd's header page and records page at the slot (in place: a reader sees the old pages or the new
 * ones, never a hole). Read-write only for our own slice's file. 0, or -1 with errno. */
int gs_ds_map_slot(struct gs_devstate *ds, int slot, int fd, int writable)
{
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    if (mmap(ds->sbase + (size_t)slot * ds->page, ds->page, prot, MAP_FIXED | MAP_SHARED, fd, 0) == MAP_FAILED ||
        mmap(ds->pbase + (size_t)slot * ds->page, ds->page, prot, MAP_FIXED | MAP_SHARED, fd, GS_DS_PROC_OFF) == MAP_FAILED) {
        int saved = errno;
        gs_ds_private_pages(ds, slot); /* the slot's state is the caller's to decide */
        errno = saved;
        return -1;
    }
    if (slot + 1 > ds->nslots) __atomic_store_n(&ds->nslots, slot + 1, __ATOMIC_RELEASE);
    return 0;
}

int gs_ds_find_slot(const struct gs_devstate *ds, uint64_t dev, uint64_t ino)
{
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (ds->slot[i].state != GS_DS_SLOT_FREE && ds->slot[i].dev == dev && ds->slot[i].ino == ino) return i;
    return -1;
}

int gs_ds_free_slot(const struct gs_devstate *ds)
{
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (ds->slot[i].state == GS_DS_SLOT_FREE) return i;
    return -1;
}

/* The device's folder, made 01777 when missing (no root manager: every user's enforcer makes its own
 * file there, and the sticky bit keeps each from removing another's). A root manager makes it 0755
 * first, with each grant's file in it. Never followed. The fd, or -1 with err set. */
static int open_folder(const char *dir, const char *uuid, char *err, size_t errlen)
{
    int top = -1;
    if (mkdir(dir, 01777) == 0) {
        top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (top >= 0) fchmod(top, 01777); /* ours, just made: umask must not narrow it */
    } else {
        top = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (top < 0) {
        snprintf(err, errlen, "device state: folder %s: %s", dir,
                 errno == ELOOP || errno == ENOTDIR ? "not a directory (a link is not followed)" : strerror(errno));
        return -1;
    }
    char name[80];
    snprintf(name, sizeof name, "%s%s", uuid, GS_DS_FOLDER_SUFFIX);
    int fd = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        int made = mkdirat(top, name, 01777) == 0; /* or someone made it meanwhile (EEXIST): open theirs */
        fd = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0 && made) fchmod(fd, 01777);
    }
    int saved = errno;
    close(top);
    if (fd < 0)
        snprintf(err, errlen, "device state: folder %s/%s: %s", dir, name,
                 saved == ELOOP || saved == ENOTDIR ? "not a directory (a link is not followed)" : strerror(saved));
    return fd;
}

/* The uid a user namespace shows for an owner it does not map (root's files in a pod's user namespace). */
static uid_t overflow_uid(void)
{
    static uid_t cached = (uid_t)-1;
    if (cached != (uid_t)-1) return cached;
    uid_t u = 65534;
    FILE *f = fopen("/proc/sys/kernel/overflowuid", "re");
    if (f) {
        unsigned v;
        if (fscanf(f, "%u", &v) == 1) u = (uid_t)v;
        fclose(f);
    }
    return cached = u;
}

/* A manager's folder: on a read-only mount (Kubernetes), or root's (inside a user namespace: the overflow
 * uid's) and writable by nobody else. Only its manager makes files in it, so a file there is the one
 * made for the grant it is named after, whoever owns it. Anything else (no manager: the first enforcer's
 * 01777 folder) holds files any user may have made first: there only a file of our own is ours. */
/* In a user namespace (a uid map other than the identity): then root's files show as the overflow uid. On
 * the host that uid is a real account (nobody), whose folder is no manager's. */
static int in_user_namespace(void)
{
    FILE *f = fopen("/proc/self/uid_map", "re");
    if (!f) return 0;
    unsigned long inside, outside, count;
    int lines = 0, identity = 1;
    while (fscanf(f, "%lu %lu %lu", &inside, &outside, &count) == 3) {
        lines++;
        identity = identity && inside == 0 && outside == 0 && count == 4294967295UL;
    }
    fclose(f);
    return lines > 0 && !(lines == 1 && identity);
}

static int managed_folder(int fd)
{
    struct statvfs v;
    if (fstatvfs(fd, &v) == 0 && (v.f_flag & ST_RDONLY)) return 1;
    struct stat st;
    return fstat(fd, &st) == 0 && (st.st_uid == 0 || (st.st_uid == overflow_uid() && in_user_namespace())) &&
           !(st.st_mode & (S_IWGRP | S_IWOTH));
}

static void *reserve(size_t len)
{
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

int gs_devstate_open(struct gs_devstate *ds, const char *dir, const char *uuid, char *err, size_t errlen)
{
    memset(ds, 0, sizeof *ds);
    ds->dfd = -1;
    ds->guard = -1;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) ds->slot[i].fd = -1;
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
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || pg > GS_DS_PROC_OFF) {
        snprintf(err, errlen, "device state: page size %ld not supported (at most %d)", pg, GS_DS_PROC_OFF);
        return -1;
    }
    ds->page = (size_t)pg;
    int fd = open_folder(dir, uuid, err, errlen);
    if (fd < 0) return -1;
    ds->sbase = reserve(GS_DS_MAX_SLICES * ds->page);
    ds->pbase = reserve(GS_DS_MAX_SLICES * ds->page);
    if (!ds->sbase || !ds->pbase) {
        snprintf(err, errlen, "device state: cannot reserve address space: %s", strerror(errno));
        goto fail;
    }
    /* guarded before any file is mapped: a neighbour may cut its file short from here on */
    if (gs_ds_guard_add(ds) != 0) {
        snprintf(err, errlen, "device state: no SIGBUS guard could be set up; not used");
        goto fail;
    }
    ds->dfd = fd;
    ds->managed = managed_folder(fd);
    gs_devstate_scan_locked(ds, gs_mono_ns(), 1); /* nobody else has the handle yet: no lock needed for its slots */
    return 0;
fail:
    if (ds->sbase) munmap(ds->sbase, GS_DS_MAX_SLICES * ds->page);
    if (ds->pbase) munmap(ds->pbase, GS_DS_MAX_SLICES * ds->page);
    ds->sbase = ds->pbase = NULL;
    close(fd);
    return -1;
}

void gs_devstate_close(struct gs_devstate *ds)
{
    gs_ds_guard_remove(ds);
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (ds->slot[i].fd >= 0) close(ds->slot[i].fd);
    if (ds->sbase) munmap(ds->sbase, GS_DS_MAX_SLICES * ds->page);
    if (ds->pbase) munmap(ds->pbase, GS_DS_MAX_SLICES * ds->page);
    if (ds->dfd >= 0) close(ds->dfd);
    pthread_mutex_destroy(&ds->local);
    memset(ds, 0, sizeof *ds);
    ds->dfd = -1;
    ds->guard = -1;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) ds->slot[i].fd = -1;
    pthread_mutex_init(&ds->local, NULL); /* a closed handle may be closed again */
}

void gs_devstate_after_fork(struct gs_devstate *ds)
{
    if (!ds->sbase) return;
    gs_ds_guard_remove(ds);
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (ds->slot[i].fd >= 0) close(ds->slot[i].fd);
    munmap(ds->sbase, GS_DS_MAX_SLICES * ds->page);
    munmap(ds->pbase, GS_DS_MAX_SLICES * ds->page);
    if (ds->dfd >= 0) close(ds->dfd);
    memset(ds, 0, sizeof *ds); /* the mutex too: another thread of the parent may have held it */
    ds->dfd = -1;
    ds->guard = -1;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) ds->slot[i].fd = -1;
    pthread_mutex_init(&ds->local, NULL);
}

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
