/* gpuslice per-device shared state: finding the neighbours' slice files and mapping them read-only
 * (layout, trust and liveness: gpuslice/devstate.h). */
#define _GNU_SOURCE
#include "gpuslice/devstate.h"
#include "gpuslice/policy.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int64_t ts_ns(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec; }

/* 1: a record in use is alive; 0: records in use, all dead; -1: none in use. */
static int records_live(const struct gs_ds_proc *p, int n, uint64_t my_ns, int64_t now)
{
    int in_use = 0;
    for (int i = 0; i < n; i++) {
        if (!(p[i].flags & GS_DS_PROC_IN_USE)) continue;
        in_use = 1;
        if (gs_ds_record_alive(&p[i], my_ns, now, NULL)) return 1;
    }
    return in_use ? 0 : -1;
}

/* A neighbour's file, by its name: opened read-only, never followed; its header read and checked, and
 * its records for liveness. The fd (the caller closes it), or -1 when it is not a whole file of ours. */
static int open_peer(struct gs_devstate *ds, const char *name, const struct stat *seen, int *live, int64_t now)
{
    int fd = openat(ds->dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    struct gs_ds_header h;
    struct gs_ds_proc recs[GS_DS_SLOT_PROCS];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != seen->st_dev || st.st_ino != seen->st_ino ||
        st.st_size != GS_DS_FILE_SIZE || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || gs_ds_header_ok(&h) != 0 ||
        pread(fd, recs, sizeof recs, GS_DS_PROC_OFF) != (ssize_t)sizeof recs) {
        close(fd);
        return -1;
    }
    *live = records_live(recs, GS_DS_SLOT_PROCS, gs_devstate_pidns(), now);
    return fd;
}

/* A file the folder lists that no slot holds: mapped read-only when it has a live record. A slice with no
 * process on the device takes no slot (a manager makes a file per grant, long before and after its
 * processes run); it is looked at again by every scan. */
static void look_at(struct gs_devstate *ds, const char *name, const struct stat *st, int64_t now)
{
    int live = 0;
    int fd = open_peer(ds, name, st, &live, now);
    if (fd < 0) {
        ds->unseen++;
        return;
    }
    int slot = live == 1 ? gs_ds_free_slot(ds) : -1;
    if (live == 1 && slot < 0) ds->unseen++;
    if (slot >= 0) {
        struct gs_ds_slot *s = &ds->slot[slot];
        /* named before it is mapped: a launch thread that sees the record sees whose it is */
        memcpy(s->name, name, strlen(name) + 1); /* gs_pol_valid_name: shorter than the field */
        if (gs_ds_map_slot(ds, slot, fd, 0) == 0) {
            s->state = GS_DS_SLOT_PEER;
            s->dev = (uint64_t)st->st_dev;
            s->ino = (uint64_t)st->st_ino;
        } else {
            gs_ds_clear_slot(ds, slot);
        }
    }
    close(fd);
}

/* A neighbour with no live process left (they left, or were killed without freeing their records: only
 * their own slice may free them) gives its slot back; a scan maps it again when one comes. */
static void drop_if_gone(struct gs_devstate *ds, int slot, int64_t now)
{
    const struct gs_ds_proc *p = gs_ds_proc(ds, slot * GS_DS_SLOT_PROCS);
    if (records_live(p, GS_DS_SLOT_PROCS, gs_devstate_pidns(), now) != 1) gs_ds_clear_slot(ds, slot);
}

static int due(struct gs_devstate *ds, int64_t now, int force)
{
    if (force) return 1;
    if (now - ds->mtime_checked_ns < GS_DS_MTIME_NS) return 0;
    ds->mtime_checked_ns = now;
    struct stat st;
    int moved = fstat(ds->dfd, &st) == 0 && ts_ns(&st.st_mtim) != ds->folder_mtime_ns;
    return moved || now - ds->scanned_ns >= GS_DS_SCAN_NS;
}

/* A file the folder lists that no slot holds (sized: some process joined it once). */
struct candidate {
    struct stat st;
    char name[GS_POL_GRANT_LEN];
};

/* Look at up to GS_DS_SCAN_MAX_OPENS of the n candidates, starting where the last scan stopped: with more
 * idle files than that, every one is looked at within a few scans (a fixed start would look at the same
 * first ones every time and never see a neighbour past them: review of issue 15). */
static void look_at_some(struct gs_devstate *ds, const struct candidate *c, int n, uint8_t *seen, int64_t now)
{
    int k = n < GS_DS_SCAN_MAX_OPENS ? n : GS_DS_SCAN_MAX_OPENS;
    int from = ds->scan_from < n ? ds->scan_from : 0;
    for (int j = 0; j < k; j++) {
        const struct candidate *x = &c[(from + j) % n];
        look_at(ds, x->name, &x->st, now);
        int slot = gs_ds_find_slot(ds, (uint64_t)x->st.st_dev, (uint64_t)x->st.st_ino);
        if (slot >= 0) seen[slot] = 1;
    }
    ds->unseen += (uint64_t)(n - k);
    ds->scan_from = n ? (from + k) % n : 0;
}

void gs_devstate_scan_locked(struct gs_devstate *ds, int64_t now, int force)
{
    if (ds->dfd < 0 || !due(ds, now, force)) return;
    struct stat fst;
    if (fstat(ds->dfd, &fst) == 0) ds->folder_mtime_ns = ts_ns(&fst.st_mtim);
    ds->scanned_ns = ds->mtime_checked_ns = now;
    int dup_fd = dup(ds->dfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    struct candidate *c = d ? malloc(GS_DS_SCAN_MAX_ENTRIES * sizeof *c) : NULL;
    if (!c) {
        if (d) closedir(d);
        else if (dup_fd >= 0) close(dup_fd);
        return; /* out of descriptors or memory: keep what is mapped */
    }
    rewinddir(d);
    uint8_t seen[GS_DS_MAX_SLICES] = {0};
    ds->unseen = 0;
    int entries = 0, n = 0;
    struct dirent *de = NULL;
    for (; entries < GS_DS_SCAN_MAX_ENTRIES && (de = readdir(d)); entries++) {
        if (de->d_name[0] == '.' || !gs_pol_valid_name(de->d_name)) continue;
        struct stat st;
        if (fstatat(ds->dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        int slot = gs_ds_find_slot(ds, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
        if (slot >= 0) {
            seen[slot] = 1;
            continue;
        }
        if (st.st_size == 0) continue; /* made by the node's manager; no process has joined it yet */
        c[n].st = st;
        memcpy(c[n].name, de->d_name, strlen(de->d_name) + 1); /* gs_pol_valid_name: shorter than the field */
        n++;
    }
    int cut = entries >= GS_DS_SCAN_MAX_ENTRIES && readdir(d) != NULL; /* entries left unread */
    closedir(d);
    look_at_some(ds, c, n, seen, now);
    free(c);
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        if (ds->slot[i].state != GS_DS_SLOT_PEER) continue; /* our own file stays ours, listed or not */
        if (!seen[i] && !cut) gs_ds_clear_slot(ds, i); /* a cut scan may not have reached it */
        else drop_if_gone(ds, i, now);
    }
}
