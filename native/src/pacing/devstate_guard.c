/* gpuslice per-device state: what keeps a slice file cut short from crashing this process (trust
 * model: native/README.md; issue 15).
 *
 * Write permission is all ftruncate needs: a slice's process may cut its own slice's file short, and
 * then every process that maps it (its slice-mates read-write, its neighbours read-only) faults with
 * SIGBUS on the pages past the new end. No file mode, owner or seal prevents that for a shared regular
 * file, so the fault itself is handled: a process-wide SIGBUS handler that recognises an address inside
 * a registered handle's slot ranges replaces that page, in place, with private zeroed memory (mmap
 * MAP_FIXED is one system call, safe in a handler; the faulting access is retried on it and succeeds) and
 * marks the slot lost. The next lock (gs_ds_guard_recover, outside the handler) drops a neighbour's slot
 * (the scan maps it again once the file is whole) and gives our own file its size back and maps it again
 * (at most once per GS_DS_RECOVER_EVERY_NS; until then the slot paces on its private copy). A SIGBUS
 * anywhere else goes on to the handler that was there before ours, or to the default action (the process
 * dies as it would have).
 *
 * A synchronous SIGBUS on a thread that blocks it kills the process whatever the handler, so the threads
 * that read neighbours' files unblock it once (gs_devstate_thread_ready: the launching threads and the
 * poller; a program that blocks SIGBUS could not have survived a bus error in that thread anyway). The
 * guard holds while the program leaves SIGBUS to the handler chain gpuslice installed into (a program
 * that installs its own SIGBUS handler later and does not chain to the previous one takes it away).
 * Python's faulthandler, enabled after gpuslice, reports the fault and re-raises it without its address:
 * that re-raise reaches the default action, and the process dies (README-compute.md "Hostile
 * neighbours"). */
#define _GNU_SOURCE
#include "gpuslice/clock.h"
#include "gpuslice/devstate.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GS_DS_GUARD_SLOTS 64
#define GS_DS_RECOVER_EVERY_NS 1000000000LL

static struct gs_devstate *slots[GS_DS_GUARD_SLOTS]; /* NULL = free; atomics (the handler reads them) */
static struct sigaction prev_bus;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int installed;
static uint64_t faults_caught;

/* Not ours: what would have happened without us. SIG_DFL/SIG_IGN: reset to the default and return,
 * so the retried access faults again and the process dies of SIGBUS as before (ignoring a fault
 * would spin forever). */
static void chain(int sig, siginfo_t *si, void *uc)
{
    if ((prev_bus.sa_flags & SA_SIGINFO) && prev_bus.sa_sigaction) {
        prev_bus.sa_sigaction(sig, si, uc);
        return;
    }
    if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN && prev_bus.sa_handler) {
        prev_bus.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
}

/* The page of `a` inside one of ds's slot ranges made private zeros: 1 if it was one of ds's. */
static int catch_in(struct gs_devstate *ds, unsigned char *a)
{
    unsigned char *bases[2] = {ds->sbase, ds->pbase};
    size_t span = GS_DS_MAX_SLICES * ds->page;
    for (int r = 0; r < 2; r++) {
        if (!bases[r] || a < bases[r] || a >= bases[r] + span) continue;
        size_t slot = (size_t)(a - bases[r]) / ds->page;
        void *m = mmap(bases[r] + slot * ds->page, ds->page, PROT_READ | PROT_WRITE,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 0;
        __atomic_store_n(&ds->slot[slot].lost, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&ds->lost_any, 1, __ATOMIC_RELEASE); /* after the slot's: whoever clears it sees the slot's */
        __atomic_add_fetch(&faults_caught, 1, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    unsigned char *a = si ? (unsigned char *)si->si_addr : NULL;
    for (int i = 0; a && i < GS_DS_GUARD_SLOTS; i++) {
        struct gs_devstate *ds = __atomic_load_n(&slots[i], __ATOMIC_ACQUIRE);
        if (ds && catch_in(ds, a)) {
            errno = saved;
            return;
        }
    }
    errno = saved;
    chain(sig, si, uc);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    installed = sigaction(SIGBUS, &sa, &prev_bus) == 0;
}

int gs_ds_guard_add(struct gs_devstate *ds)
{
    pthread_once(&install_once, install);
    ds->guard = -1;
    if (!installed) return -1;
    for (int i = 0; i < GS_DS_GUARD_SLOTS; i++) {
        struct gs_devstate *none = NULL;
        if (__atomic_compare_exchange_n(&slots[i], &none, ds, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            ds->guard = i;
            return 0;
        }
    }
    return -1;
}

void gs_ds_guard_remove(struct gs_devstate *ds)
{
    if (ds->guard < 0 || ds->guard >= GS_DS_GUARD_SLOTS) return;
    __atomic_store_n(&slots[ds->guard], NULL, __ATOMIC_RELEASE);
    ds->guard = -1;
}

void gs_devstate_thread_ready(void)
{
    static _Thread_local int ready;
    if (ready) return;
    ready = 1;
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
}

uint64_t gs_devstate_faults_caught(void) { return __atomic_load_n(&faults_caught, __ATOMIC_RELAXED); }

/* Our own file after a fault: its size back, mapped again in place (the engine's indexes stay valid), a
 * file cut to nothing initialised again (its records are gone: the engine joins again, own_locked). */
static void recover_own(struct gs_devstate *ds, int slot, int64_t now)
{
    if (now < ds->recover_at_ns) { /* stays on its private copy until then: look again at the next lock */
        __atomic_store_n(&ds->lost_any, 1, __ATOMIC_RELEASE);
        return;
    }
    ds->recover_at_ns = now + GS_DS_RECOVER_EVERY_NS;
    struct gs_ds_slot *s = &ds->slot[slot];
    struct stat st;
    __atomic_store_n(&s->lost, 0, __ATOMIC_RELEASE); /* cleared first: a truncation right after must set it again */
    if (fstat(s->fd, &st) == 0 && (st.st_size >= GS_DS_FILE_SIZE || ftruncate(s->fd, GS_DS_FILE_SIZE) == 0) &&
        gs_ds_map_slot(ds, slot, s->fd, 1) == 0) {
        char err[200];
        if (gs_ds_adopt_locked(ds, slot, err, sizeof err) == 0) return;
        gs_ds_private_pages(ds, slot); /* a header we do not know: stay private rather than write into it */
    }
    /* still ours (an engine's launch threads write its records without the lock): private until the next try */
    __atomic_store_n(&s->lost, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&ds->lost_any, 1, __ATOMIC_RELEASE);
}

void gs_ds_guard_recover(struct gs_devstate *ds)
{
    /* nothing lost since the last lock: the usual case, one load (a fault after this exchange sets it again
     * for the next lock) */
    if (!__atomic_exchange_n(&ds->lost_any, 0, __ATOMIC_ACQ_REL)) return;
    int64_t now = gs_mono_ns();
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) {
        if (!__atomic_load_n(&ds->slot[i].lost, __ATOMIC_ACQUIRE)) continue;
        if (ds->slot[i].state == GS_DS_SLOT_OWN) recover_own(ds, i, now);
        else gs_ds_clear_slot(ds, i); /* a neighbour's: the scan maps it again once whole */
    }
}
