/* gpuslice per-device state: the lock every update takes (layout and rules: gpuslice/devstate.h).
 *
 * The file is mode 0666 by design, so nothing that decides who holds the lock may live in it: until
 * version 3 a process-shared robust pthread mutex did, and a tenant who wrote over it could make
 * glibc wait forever, abort on an assertion, or (rewriting the robust-list links of a mutex a victim
 * held) make the victim's next lock write through a pointer of the tenant's choosing (issue 15,
 * attacker's review). Since version 4 the lock is kept by the kernel: an open-file-description write
 * lock (F_OFD_SETLK) on byte GS_DS_LOCK_BYTE, which a holder's death releases, which garbage in the
 * file cannot affect, and which a handle's threads take in turn through a process-local mutex (an OFD
 * lock belongs to the open file, not to a thread). The wait is bounded (GS_DS_LOCK_WAIT_NS, then
 * GS_DS_LOCK_BACKOFF_NS of tries without waiting): a holder that stops (SIGSTOP) costs a locker at most
 * one wait per back-off period, and the locker goes on without the shared state.
 *
 * The first 8 bytes at GS_DS_LOCK_BYTE say "held" (the holder's pid, cleared at unlock): a locker that
 * finds it set knows the previous holder died inside the lock and reaps dead processes then, as
 * EOWNERDEAD used to tell it. A tenant may set it at will; that costs a reap (at most one per
 * GS_DS_HINT_REAP_NS per handle), nothing else. */
#define _GNU_SOURCE
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GS_DS_HINT_REAP_NS 100000000LL

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int ofd(int fd, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = GS_DS_LOCK_BYTE;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* The kernel's lock, polled until `until`: a legitimate holder keeps it for microseconds, so a few
 * yields usually see it free; then sleeps from 10 us doubling to 1 ms. */
static int take_file_lock(int fd, int64_t until)
{
    for (int attempt = 0;; attempt++) {
        if (ofd(fd, F_WRLCK) == 0) return 0;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) return -1;
        if (mono_ns() >= until) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (attempt < 8) {
            sched_yield();
            continue;
        }
        int shift = attempt - 8 < 7 ? attempt - 8 : 7;
        struct timespec ts = {0, 10000L << shift};
        nanosleep(&ts, NULL);
    }
}

/* Under the lock: values no gpuslice writer produces are brought back into range, so a record a
 * neighbour scribbled over costs at most what a legitimate one could (a debt of DEBT_MAX, a rate of
 * the device), and an index read from a record can never leave the tables. A live writer may scribble
 * again between locks: what that still does is in README-compute.md "Hostile neighbours". One pass
 * over 32 + 128 records per lock (the poll already scans them). */
static void sanitize_locked(struct gs_devstate *ds)
{
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        struct gs_ds_slice *s = &ds->slices[i];
        int64_t c = __atomic_load_n(&s->credit_ns, __ATOMIC_RELAXED);
        if (c < -GS_CTL_DEBT_MAX_NS || c > GS_CTL_WANT_CAP_NS)
            __atomic_store_n(&s->credit_ns, c < 0 ? -GS_CTL_DEBT_MAX_NS : GS_CTL_WANT_CAP_NS, __ATOMIC_RELAXED);
        if (s->share_bp > GS_BP_FULL) s->share_bp = GS_BP_FULL;
        if (s->rate_bp > GS_BP_FULL) s->rate_bp = GS_BP_FULL;
        if (s->mode > GS_CTL_OFF) s->mode = GS_CTL_HARD;
        if (s->weight < 1 || s->weight > 16) s->weight = 1;
        if (s->priority > 1) s->priority = 1;
        if (s->paced > 1) s->paced = 1;
        if (s->colocation > 2) s->colocation = 0;
        s->grant[sizeof s->grant - 1] = 0;
    }
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) {
        struct gs_ds_proc *p = &ds->procs[i];
        if ((p->flags & GS_DS_PROC_IN_USE) && (p->slice < 0 || p->slice >= GS_DS_MAX_SLICES)) memset(p, 0, sizeof *p);
    }
    ds->hdr->uuid[sizeof ds->hdr->uuid - 1] = 0;
}

static int64_t *held_hint(struct gs_devstate *ds) { return (int64_t *)(void *)(ds->map + GS_DS_LOCK_BYTE); }

int gs_devstate_lock(struct gs_devstate *ds)
{
    int64_t now = mono_ns();
    int64_t until = now < __atomic_load_n(&ds->backoff_until_ns, __ATOMIC_RELAXED) ? now : now + GS_DS_LOCK_WAIT_NS;
    struct timespec abs = {(time_t)(until / 1000000000LL), (long)(until % 1000000000LL)};
    int rc = pthread_mutex_clocklock(&ds->local, CLOCK_MONOTONIC, &abs);
    /* a truncated file, caught by the guard: map it again (rate-limited) while no other thread of this
     * handle is inside the lock; on failure the private copy serves */
    if (rc == 0 && gs_ds_guard_lost(ds)) gs_ds_guard_recover(ds);
    if (rc == 0 && take_file_lock(ds->fd, until) != 0) {
        rc = errno;
        pthread_mutex_unlock(&ds->local);
    }
    if (rc != 0) {
        if (rc == ETIMEDOUT && until > now) {
            __atomic_add_fetch(&ds->lock_timeouts, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&ds->backoff_until_ns, now + GS_DS_LOCK_BACKOFF_NS, __ATOMIC_RELAXED);
        }
        __atomic_add_fetch(&ds->lock_refused, 1, __ATOMIC_RELAXED);
        return -1;
    }
    __atomic_store_n(&ds->backoff_until_ns, 0, __ATOMIC_RELAXED);
    int64_t *held = held_hint(ds);
    if (__atomic_load_n(held, __ATOMIC_RELAXED) != 0 && now - ds->hint_reap_ns >= GS_DS_HINT_REAP_NS) {
        /* the previous holder died inside the lock: records are sums and flags; free what it held */
        ds->hint_reap_ns = now;
        gs_devstate_reap_locked(ds, NULL);
    }
    __atomic_store_n(held, (int64_t)getpid(), __ATOMIC_RELAXED);
    ds->hdr->updates++;
    sanitize_locked(ds);
    return 0;
}

void gs_devstate_unlock(struct gs_devstate *ds)
{
    __atomic_store_n(held_hint(ds), 0, __ATOMIC_RELEASE);
    ofd(ds->fd, F_UNLCK);
    pthread_mutex_unlock(&ds->local);
}
