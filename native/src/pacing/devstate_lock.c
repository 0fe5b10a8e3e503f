/* gpuslice per-device state: the lock every update takes (layout and rules: gpuslice/devstate.h).
 *
 * The lock is the kernel's: an exclusive flock() on the device's folder, opened read-only (every slice's
 * processes can read the folder; none can write a neighbour's file). Nothing that decides who holds it
 * lives in a file a tenant writes: until version 3 a process-shared robust pthread mutex in the shared
 * file did, and a tenant who wrote over it could hang or crash its neighbours (issue 15, attacker's
 * review); version 4 took an OFD lock on a byte of that file. A holder's death releases the lock, and a
 * handle's threads take it in turn through a process-local mutex (a flock belongs to the open file, not
 * to a thread). The wait is bounded (GS_DS_LOCK_WAIT_NS, then GS_DS_LOCK_BACKOFF_NS of tries without
 * waiting): a holder that stops (SIGSTOP) costs a locker at most one wait per back-off period, and the
 * locker goes on without the shared state.
 *
 * Each lock also: looks at the folder when due (devstate_scan.c; before the flock, with only the handle's
 * mutex held), maps again what the SIGBUS guard made private (devstate_guard.c), counts the update in our own files' headers and brings our own records back
 * into range (a slice-mate may have scribbled on them). */
#define _GNU_SOURCE
#include "gpuslice/clock.h"
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The kernel's lock, polled until `until`: a legitimate holder keeps it for microseconds, so a few
 * yields usually see it free; then sleeps from 10 us doubling to 1 ms. */
static int take_file_lock(int fd, int64_t until)
{
    for (int attempt = 0;; attempt++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (gs_mono_ns() >= until) {
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

/* Under the lock: values no gpuslice writer produces are brought back into range in our own slices'
 * records (a slice-mate may scribble on them; a neighbour's we cannot write, and every reader range-checks
 * what it takes from them), so a scribbled record costs at most what a legitimate one could (a debt of
 * DEBT_MAX, a rate of the device). */
static void sanitize_slot(struct gs_devstate *ds, int slot)
{
    struct gs_ds_slice *s = gs_ds_slice(ds, slot);
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
    struct gs_ds_header *h = gs_ds_hdr(ds, slot);
    h->uuid[sizeof h->uuid - 1] = 0;
    h->updates++;
}

int gs_devstate_lock(struct gs_devstate *ds)
{
    int64_t now = gs_mono_ns();
    int64_t until = now < __atomic_load_n(&ds->backoff_until_ns, __ATOMIC_RELAXED) ? now : now + GS_DS_LOCK_WAIT_NS;
    struct timespec abs = {(time_t)(until / 1000000000LL), (long)(until % 1000000000LL)};
    int rc = ds->dfd < 0 ? EBADF : pthread_mutex_clocklock(&ds->local, CLOCK_MONOTONIC, &abs);
    if (rc == 0) gs_devstate_scan_locked(ds, now, 0); /* before the flock: a scan holds up no other process */
    if (rc == 0 && take_file_lock(ds->dfd, until) != 0) {
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
    gs_ds_guard_recover(ds);
    for (int i = 0; i < GS_DS_MAX_SLICES; i++)
        if (gs_ds_own(ds, i)) sanitize_slot(ds, i);
    return 0;
}

void gs_devstate_unlock(struct gs_devstate *ds)
{
    flock(ds->dfd, LOCK_UN);
    pthread_mutex_unlock(&ds->local);
}
