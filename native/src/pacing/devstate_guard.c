/* gpuslice per-device state: what keeps a neighbour's hostile act on the shared file from crashing or
 * hanging this process (trust model: native/README.md; issue 15).
 *
 * The file is mode 0666 by design (every tenant's pacer writes it), and write permission is all
 * ftruncate needs: a tenant that truncates it makes every other process's access to the mapping past
 * the new end fault with SIGBUS. No file mode, owner or seal prevents that for a shared writable
 * regular file, so the fault itself is handled: a process-wide SIGBUS handler that recognises an
 * address inside a registered mapping replaces the whole mapping, in place, with private zeroed memory
 * (mmap MAP_FIXED is one system call, safe in a handler; the faulting access is retried on it and
 * succeeds). The process then paces alone on that private copy (its own share, no neighbours seen)
 * until gs_ds_guard_recover, called outside the handler by the next lock, restores the file's size and
 * maps it again (at most once per GS_DS_RECOVER_EVERY_NS). A SIGBUS anywhere else goes on to the handler
 * that was there before ours, or to the default action (the process dies as it would have).
 *
 * The guard holds while the program leaves SIGBUS to the handler chain gpuslice installed into (a
 * program that installs its own SIGBUS handler later and does not chain to the previous one takes it
 * away; Python's faulthandler chains after printing its report). */
#define _GNU_SOURCE
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

static struct {
    unsigned char *base; /* NULL = free; written with atomics (the handler reads it) */
    int lost;            /* the handler replaced the mapping with private memory */
} slots[GS_DS_GUARD_SLOTS];
static struct sigaction prev_bus;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int installed;
static uint64_t faults_caught;

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

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

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    unsigned char *a = si ? (unsigned char *)si->si_addr : NULL;
    for (int i = 0; a && i < GS_DS_GUARD_SLOTS; i++) {
        unsigned char *base = __atomic_load_n(&slots[i].base, __ATOMIC_ACQUIRE);
        if (!base || a < base || a >= base + GS_DS_FILE_SIZE) continue;
        void *m = mmap(base, GS_DS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) break;
        __atomic_store_n(&slots[i].lost, 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&faults_caught, 1, __ATOMIC_RELAXED);
        errno = saved;
        return;
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
        unsigned char *none = NULL; /* a free slot's lost flag is 0 (gs_ds_guard_remove) */
        if (__atomic_compare_exchange_n(&slots[i].base, &none, ds->map, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            ds->guard = i;
            return 0;
        }
    }
    return -1;
}

void gs_ds_guard_remove(struct gs_devstate *ds)
{
    if (ds->guard < 0 || ds->guard >= GS_DS_GUARD_SLOTS) return;
    __atomic_store_n(&slots[ds->guard].lost, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slots[ds->guard].base, NULL, __ATOMIC_RELEASE);
    ds->guard = -1;
}

int gs_ds_guard_lost(const struct gs_devstate *ds)
{
    return ds->guard >= 0 && ds->guard < GS_DS_GUARD_SLOTS && __atomic_load_n(&slots[ds->guard].lost, __ATOMIC_ACQUIRE);
}

uint64_t gs_devstate_faults_caught(void) { return __atomic_load_n(&faults_caught, __ATOMIC_RELAXED); }

/* Outside the handler, with the private copy in place: give the file back its size and map it again
 * at the same address (the engine's pointers into the map stay valid). Under the file's flock, like
 * creation: a file cut to nothing is initialised again (gs_ds_reinit_locked). 0 = shared again. */
int gs_ds_guard_recover(struct gs_devstate *ds)
{
    int64_t now = mono_ns();
    if (now < __atomic_load_n(&ds->recover_at_ns, __ATOMIC_RELAXED)) return -1;
    __atomic_store_n(&ds->recover_at_ns, now + GS_DS_RECOVER_EVERY_NS, __ATOMIC_RELAXED);
    if (gs_ds_flock_bounded(ds->fd) != 0) return -1;
    int rc = -1;
    struct stat st;
    if (fstat(ds->fd, &st) == 0 && (st.st_size >= GS_DS_FILE_SIZE || ftruncate(ds->fd, GS_DS_FILE_SIZE) == 0)) {
        /* cleared first: a truncation right after the map below must leave it set */
        __atomic_store_n(&slots[ds->guard].lost, 0, __ATOMIC_RELEASE);
        if (mmap(ds->map, GS_DS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, ds->fd, 0) != MAP_FAILED)
            rc = gs_ds_adopt_locked(ds, NULL, 0);
        if (rc != 0) {
            /* a header we do not know (or no map): stay on a private copy rather than write into it */
            mmap(ds->map, GS_DS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            __atomic_store_n(&slots[ds->guard].lost, 1, __ATOMIC_RELEASE);
        }
    }
    flock(ds->fd, LOCK_UN);
    return rc;
}
