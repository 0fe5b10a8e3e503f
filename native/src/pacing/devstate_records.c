/* gpuslice per-device shared state: our own slice's file and its records — joining, leaving, freeing
 * the records of slice-mates that died (layout, trust and liveness: gpuslice/devstate.h). */
#define _GNU_SOURCE
#include "gpuslice/clock.h"
#include "gpuslice/devstate.h"
#include "gpuslice/policy.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int gs_ds_header_ok(const struct gs_ds_header *h)
{
    return h->magic == GS_DS_MAGIC && h->version == GS_DS_VERSION && h->size == GS_DS_FILE_SIZE &&
                   h->max_procs == GS_DS_SLOT_PROCS && h->slice_off == GS_DS_SLICE_OFF &&
                   h->slice_size == GS_DS_SLICE_SIZE && h->proc_off == GS_DS_PROC_OFF && h->proc_size == GS_DS_PROC_SIZE
               ? 0
               : -1;
}

static int alive_kill(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

/* Same PID namespace: the pid is ours to ask about. Another (or unknown) namespace: only the
 * heartbeat can tell; kill() there would ask about an unrelated process or nobody. */
int gs_ds_record_alive(const struct gs_ds_proc *p, uint64_t my_ns, int64_t now, int (*is_alive)(int32_t))
{
    if (my_ns && p->pidns == my_ns) return (is_alive ? is_alive : alive_kill)(p->pid);
    return p->heartbeat_ns > 0 && now - p->heartbeat_ns < GS_DS_STALE_NS;
}

/* Under the lock, with the slot mapped read-write: a file of zeros (just sized, or cut to nothing by a
 * slice-mate) or with a header we do not know (scribbled by the slice's own processes: a slice must not
 * escape its pacing by spoiling its own file) is initialised. 0; err says when a header was replaced. */
int gs_ds_adopt_locked(struct gs_devstate *ds, int slot, char *err, size_t errlen)
{
    struct gs_ds_header *h = gs_ds_hdr(ds, slot);
    if (h->magic != 0 && gs_ds_header_ok(h) == 0) return 0;
    if (h->magic != 0) /* scribbled by the slice's own processes (only they can write it): initialised again */
        snprintf(err, errlen, "slice file %s had a header of version %u size %u (this build: version %u size %u): "
                 "initialised again", ds->slot[slot].name, h->version, h->size, GS_DS_VERSION, (unsigned)GS_DS_FILE_SIZE);
    memset(gs_ds_hdr(ds, slot), 0, GS_DS_HEADER_SIZE + GS_DS_SLICE_SIZE);
    memset(gs_ds_proc(ds, slot * GS_DS_SLOT_PROCS), 0, GS_DS_SLOT_PROCS * GS_DS_PROC_SIZE);
    h->version = GS_DS_VERSION;
    h->size = GS_DS_FILE_SIZE;
    h->max_procs = GS_DS_SLOT_PROCS;
    h->slice_off = GS_DS_SLICE_OFF;
    h->slice_size = GS_DS_SLICE_SIZE;
    h->proc_off = GS_DS_PROC_OFF;
    h->proc_size = GS_DS_PROC_SIZE;
    h->created_ns = gs_mono_ns();
    snprintf(h->uuid, sizeof h->uuid, "%s", ds->uuid);
    __atomic_store_n(&h->magic, GS_DS_MAGIC, __ATOMIC_RELEASE); /* last: a reader that sees it sees the rest */
    return 0;
}

/* Our slice's file, read-write: the one its manager made, else (a folder that lets us: no manager) made
 * now, O_EXCL, 0644. Never followed; a regular file with one link; in a folder no manager keeps, our own
 * (a user who made it first in the sticky folder would read and write our records: refused). The fd, or -1. */
static int open_own(struct gs_devstate *ds, const char *grant)
{
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
        fd = openat(ds->dfd, grant, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0 || errno != ENOENT) break;
        fd = openat(ds->dfd, grant, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) fchmod(fd, 0644); /* made by this call: neighbours of any user read it, whatever the umask */
        else if (errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        snprintf(ds->why, sizeof ds->why, "slice file %s%s/%s: %s", ds->uuid, GS_DS_FOLDER_SUFFIX, grant,
                 e == ELOOP        ? "a symbolic link (not followed)"
                 : e == EACCES || e == EROFS ? "missing or not writable, and not ours to make (the node's manager makes it at grant)"
                                   : strerror(e));
        return -1;
    }
    struct stat st;
    const char *bad = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) bad = "not a regular file with a single link";
    else if (!ds->managed && st.st_uid != geteuid()) bad = "owned by another user, in a folder no manager keeps";
    /* cut or grown by the slice's own processes (only they can write it): made whole again, zeros, which the
     * join initialises (a slice-mate's engine finds its record gone and joins again) */
    else if (st.st_size != GS_DS_FILE_SIZE && ((st.st_size != 0 && ftruncate(fd, 0) != 0) || ftruncate(fd, GS_DS_FILE_SIZE) != 0))
        bad = strerror(errno);
    if (bad) {
        snprintf(ds->why, sizeof ds->why, "slice file %s%s/%s: %s; not used", ds->uuid, GS_DS_FOLDER_SUFFIX, grant, bad);
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

static int own_slot(const struct gs_devstate *ds, const char *grant)
{
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (ds->slot[i].state == GS_DS_SLOT_OWN && strcmp(ds->slot[i].name, grant) == 0) return i;
    return -1;
}

/* A slot for our own slice: a free one, else the last neighbour's (a neighbour less seen costs less than our
 * slice unpaced); -1 when every slot is our own. */
static int own_room(struct gs_devstate *ds)
{
    int slot = gs_ds_free_slot(ds);
    for (int i = GS_DS_MAX_SLICES - 1; slot < 0 && i >= 0; i--)
        if (ds->slot[i].state == GS_DS_SLOT_PEER) {
            gs_ds_clear_slot(ds, i);
            slot = i;
        }
    return slot;
}

/* Our own file unusable: the slice paces on private pages in a slot of its own, which neighbours do not
 * see (they neither yield to it nor count it), rather than unpaced. The slot, or -1 (no room). */
static int private_slot(struct gs_devstate *ds, const char *grant)
{
    int slot = own_room(ds);
    if (slot < 0) return -1;
    gs_ds_private_pages(ds, slot);
    struct gs_ds_slot *s = &ds->slot[slot];
    s->state = GS_DS_SLOT_OWN;
    s->private_copy = 1;
    memcpy(s->name, grant, strlen(grant) + 1); /* gs_pol_valid_name: shorter than the field */
    if (slot + 1 > ds->nslots) __atomic_store_n(&ds->nslots, slot + 1, __ATOMIC_RELEASE);
    char unused[8];
    gs_ds_adopt_locked(ds, slot, unused, sizeof unused); /* zeros: initialised */
    size_t n = strlen(ds->why);
    snprintf(ds->why + n, sizeof ds->why - n, "; paced on a private copy (neighbours do not see this slice)");
    return slot;
}

/* Map our slice's file read-write: where the scan mapped it read-only (same slot: records indexes stay),
 * else in a free slot. The slot, or -1 with ds->why set. */
static int map_own(struct gs_devstate *ds, const char *grant)
{
    int fd = open_own(ds, grant);
    if (fd < 0) return -1;
    struct stat st;
    fstat(fd, &st);
    int slot = gs_ds_find_slot(ds, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
    if (slot < 0) slot = own_room(ds);
    if (slot < 0 || gs_ds_map_slot(ds, slot, fd, 1) != 0) {
        snprintf(ds->why, sizeof ds->why, "slice file %s: %s", grant,
                 slot < 0 ? "the device has more slice files than a process maps (32)" : strerror(errno));
        if (slot >= 0) gs_ds_clear_slot(ds, slot); /* was free, or a neighbour's view: looked at again by a scan */
        close(fd);
        return -1;
    }
    struct gs_ds_slot *s = &ds->slot[slot];
    s->state = GS_DS_SLOT_OWN;
    s->fd = fd;
    s->dev = (uint64_t)st.st_dev;
    s->ino = (uint64_t)st.st_ino;
    snprintf(s->name, sizeof s->name, "%s", grant);
    if (gs_ds_adopt_locked(ds, slot, ds->why, sizeof ds->why) != 0) {
        gs_ds_clear_slot(ds, slot);
        return -1;
    }
    return slot;
}

/* Our slice has no process left on this handle's device and no engine here uses the slot: its record is
 * freed and its slot given back (the file stays: its manager removes it with the grant). An engine's
 * launch threads write its records by slot without the lock, so a pinned slot is never given back (it could
 * be mapped to a neighbour's read-only file next). */
static void release_slot(struct gs_devstate *ds, int slot)
{
    if (ds->slot[slot].pins > 0) return;
    for (int k = 0; k < GS_DS_SLOT_PROCS; k++)
        if (gs_ds_proc(ds, slot * GS_DS_SLOT_PROCS + k)->flags & GS_DS_PROC_IN_USE) return;
    memset(gs_ds_slice(ds, slot), 0, sizeof(struct gs_ds_slice));
    gs_ds_clear_slot(ds, slot);
}

static int reap_slot(struct gs_devstate *ds, int slot, uint64_t my_ns, int64_t now, int (*is_alive)(int32_t))
{
    int freed = 0, refs = 0;
    for (int k = 0; k < GS_DS_SLOT_PROCS; k++) {
        struct gs_ds_proc *p = gs_ds_proc(ds, slot * GS_DS_SLOT_PROCS + k);
        if (!(p->flags & GS_DS_PROC_IN_USE)) continue;
        if (gs_ds_record_alive(p, my_ns, now, is_alive)) {
            refs++;
            continue;
        }
        memset(p, 0, sizeof *p);
        freed++;
    }
    if (refs == 0) release_slot(ds, slot); /* not while pinned */
    return freed;
}

int gs_devstate_reap_locked(struct gs_devstate *ds, int (*is_alive)(int32_t pid))
{
    int freed = 0;
    uint64_t my_ns = gs_devstate_pidns();
    int64_t now = gs_mono_ns();
    for (int s = 0; s < GS_DS_MAX_SLICES; s++)
        if (gs_ds_own(ds, s)) freed += reap_slot(ds, s, my_ns, now, is_alive);
    return freed;
}

static int free_record(const struct gs_devstate *ds, int slot)
{
    for (int k = 0; k < GS_DS_SLOT_PROCS; k++)
        if (!(gs_ds_proc(ds, slot * GS_DS_SLOT_PROCS + k)->flags & GS_DS_PROC_IN_USE)) return slot * GS_DS_SLOT_PROCS + k;
    return -1;
}

int gs_devstate_join_locked(struct gs_devstate *ds, const char *grant, uint32_t share_bp, int mode,
                            int weight, int priority, int paced, int32_t pid, uint32_t id,
                            int *slice_idx, int *proc_idx)
{
    if (!grant || !gs_pol_valid_name(grant)) {
        snprintf(ds->why, sizeof ds->why, "grant id '%.64s' cannot name a slice file (letters, digits, '-', '_', '.')",
                 grant ? grant : "");
        return -1;
    }
    ds->why[0] = '\0';
    int s = own_slot(ds, grant);
    if (s < 0) s = map_own(ds, grant);
    int p = s >= 0 ? free_record(ds, s) : -1;
    if (s >= 0 && p < 0 && reap_slot(ds, s, gs_devstate_pidns(), gs_mono_ns(), NULL) > 0) {
        if (!gs_ds_own(ds, s)) s = map_own(ds, grant); /* every record was dead: the slot was given back */
        p = s >= 0 ? free_record(ds, s) : -1;
    }
    if (s >= 0 && p < 0)
        snprintf(ds->why, sizeof ds->why, "slice file %s: all %d process records are in use", grant, GS_DS_SLOT_PROCS);
    if (p < 0) {
        s = private_slot(ds, grant);
        p = s >= 0 ? free_record(ds, s) : -1;
    }
    if (p < 0) {
        snprintf(ds->why, sizeof ds->why, "slice %s: every one of the %d slots is this process's own", grant, GS_DS_MAX_SLICES);
        return -1;
    }
    ds->slot[s].pins++;
    struct gs_ds_slice *r = gs_ds_slice(ds, s);
    if (!(r->flags & GS_DS_SLICE_IN_USE)) {
        memset(r, 0, sizeof *r);
        snprintf(r->grant, sizeof r->grant, "%s", grant);
        r->achieved_bp = -1;
        r->flags = GS_DS_SLICE_IN_USE;
    }
    /* the latest joiner's configuration wins: all processes of a grant read the same slice file */
    r->share_bp = share_bp;
    r->mode = (uint8_t)mode;
    r->weight = (uint8_t)weight;
    r->priority = (uint8_t)priority;
    r->paced = (uint8_t)(paced != 0);
    r->rate_bp = share_bp;
    struct gs_ds_proc *q = gs_ds_proc(ds, p);
    memset(q, 0, sizeof *q);
    q->pid = pid;
    q->id = id;
    q->slice = 0; /* the file's one slice: a slot number is the handle's own and means nothing to others */
    q->last_seen_ns = gs_mono_ns();
    q->heartbeat_ns = q->last_seen_ns;
    q->joined_ns = q->last_seen_ns;
    q->pidns = gs_devstate_pidns();
    q->flags = GS_DS_PROC_IN_USE | (paced ? 0u : GS_DS_PROC_LIGHT);
    *slice_idx = s;
    *proc_idx = p;
    return 0;
}

void gs_devstate_unpin_locked(struct gs_devstate *ds, int slot)
{
    if (!gs_ds_own(ds, slot)) return;
    if (ds->slot[slot].pins > 0) ds->slot[slot].pins--;
    release_slot(ds, slot);
}

void gs_devstate_leave_locked(struct gs_devstate *ds, int proc_idx)
{
    if (proc_idx < 0 || proc_idx >= GS_DS_MAX_PROCS) return;
    int s = gs_ds_proc_slice(proc_idx);
    if (!gs_ds_own(ds, s)) return;
    memset(gs_ds_proc(ds, proc_idx), 0, sizeof(struct gs_ds_proc));
    gs_devstate_unpin_locked(ds, s);
}
