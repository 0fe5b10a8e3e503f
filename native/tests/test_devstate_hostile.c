/* A hostile neighbour on the per-device state (each slice writes only its own file; every slice's
 * processes can take the folder's lock and cut their own file short) may distort what its own records say
 * but must never hang or crash another tenant's process (issue 15, attacker's review). Pinned here,
 * under ASan/UBSan:
 *  - a process that takes the device's lock and stops (SIGSTOP): a locker gives up within
 *    GS_DS_LOCK_WAIT_NS (+ slack), then only tries without waiting during the back-off, and takes the
 *    lock again once the holder lets go; the engine's join (a process's first launch) fails, not hangs;
 *  - a process that holds the folder's flock by hand and stops: opening needs no lock; joining fails
 *    within the bound;
 *  - our own file truncated under its mapping (to 0 and to 100 bytes, by a slice-mate): the next access
 *    does not die of SIGBUS; the slot works on a private copy, and the next lock gives the file its size
 *    back and maps it again, shared with the other processes;
 *  - a neighbour truncating its own file: our read-only view of it faults, is caught, and reads as empty
 *    until the file is whole again;
 *  - our own records scribbled over (a debt of 2^63, a share past the device): back in range at the
 *    next lock;
 *  - a reading thread that blocks SIGBUS survives a neighbour's truncation (once it is ready; without
 *    that it dies: the control);
 *  - a SIGBUS that is not about a slice file still kills the process (the guard swallows nothing).
 * On the code before version 4 the first case blocked forever: alarm() turns that into a failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"
#include "gpuslice/pacer_core.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char dir[64];
/* generous for a loaded 2-core machine; still far below "forever" */
#define BOUND_NS (GS_DS_LOCK_WAIT_NS + 2000000000LL)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "FAIL: a hostile neighbour hung this process (alarm)\n";
    if (write(2, m, sizeof m - 1)) _exit(3);
    _exit(3);
}

/* A child that does `what` on the file and stops itself; returns its pid once it is stopped. */
static pid_t stopped_holder(const char *uuid, int flock_only)
{
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        struct gs_devstate ds;
        char err[256];
        if (gs_devstate_open(&ds, dir, uuid, err, sizeof err) != 0) _exit(10);
        if (flock_only ? flock(ds.dfd, LOCK_EX) != 0 : gs_devstate_lock(&ds) != 0) _exit(11);
        if (write(pfd[1], "x", 1) != 1) _exit(12);
        raise(SIGSTOP);
        if (!flock_only) gs_devstate_unlock(&ds);
        _exit(0);
    }
    close(pfd[1]);
    char c;
    int ok = read(pfd[0], &c, 1) == 1;
    close(pfd[0]);
    int st;
    if (!ok || waitpid(pid, &st, WUNTRACED) != pid || !WIFSTOPPED(st)) return -1;
    return pid;
}

static void release(pid_t pid)
{
    int st;
    kill(pid, SIGCONT);
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "holder exit status %d", st);
}

static int noop_record(void *c, int i, void *s) { (void)c; (void)i; (void)s; return 0; }
static int noop_query(void *c, int i) { (void)c; (void)i; return 1; }
static int64_t noop_elapsed(void *c, int i) { (void)c; (void)i; return 1000; }
static const struct gs_gpu_ops OPS = {noop_record, noop_record, noop_query, noop_elapsed, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

static void test_stopped_lock_holder(void)
{
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-stop", err, sizeof err) == 0, "open: %s", err);
    pid_t holder = stopped_holder("GPU-stop", 0);
    CHECK(holder > 0, "holder stopped inside the lock");
    int64_t t0 = now_ns();
    CHECK(gs_devstate_lock(&ds) != 0, "the lock held by a stopped process is refused");
    int64_t waited = now_ns() - t0;
    CHECK(waited >= GS_DS_LOCK_WAIT_NS / 2 && waited < BOUND_NS, "gave up after %lld ms", (long long)(waited / 1000000));
    CHECK(ds.lock_timeouts == 1 && ds.lock_refused == 1, "counted: %llu timeouts, %llu refused",
          (unsigned long long)ds.lock_timeouts, (unsigned long long)ds.lock_refused);
    /* during the back-off a lock call does not wait again */
    t0 = now_ns();
    CHECK(gs_devstate_lock(&ds) != 0, "still held");
    CHECK(now_ns() - t0 < GS_DS_LOCK_WAIT_NS / 2, "back-off: no second wait (%lld ms)", (long long)((now_ns() - t0) / 1000000));
    /* a process's first launch joins the state: it fails (unpaced), within the bound */
    struct gs_devstate ds2;
    CHECK(gs_devstate_open(&ds2, dir, "GPU-stop", err, sizeof err) == 0, "open 2: %s", err);
    struct gs_engine e;
    t0 = now_ns();
    CHECK(gs_engine_init(&e, &ds2, "victim", 5000, GS_CTL_HARD, 1, 0, getpid(), 1, &OPS, NULL, t0) != 0,
          "the engine's join fails while the lock is held");
    CHECK(now_ns() - t0 < BOUND_NS, "the join gave up within the bound");
    gs_devstate_close(&ds2);
    release(holder);
    CHECK(gs_devstate_lock(&ds) == 0, "the lock is taken again once the holder lets go");
    gs_devstate_unlock(&ds);
    CHECK(ds.backoff_until_ns == 0, "a taken lock ends the back-off");
    gs_devstate_close(&ds);
}

static void test_stopped_flock_holder(void)
{
    struct gs_devstate ds;
    char err[256];
    pid_t holder = stopped_holder("GPU-flock", 1);
    CHECK(holder > 0, "holder stopped with the folder's flock");
    int64_t t0 = now_ns();
    CHECK(gs_devstate_open(&ds, dir, "GPU-flock", err, sizeof err) == 0, "open takes no lock: %s", err);
    struct gs_engine e;
    CHECK(gs_engine_init(&e, &ds, "victim", 5000, GS_CTL_HARD, 1, 0, getpid(), 1, &OPS, NULL, t0) != 0,
          "the engine's join fails while the flock is held");
    CHECK(now_ns() - t0 < BOUND_NS, "gave up within the bound");
    gs_devstate_close(&ds);
    release(holder);
    CHECK(gs_devstate_open(&ds, dir, "GPU-flock", err, sizeof err) == 0, "open once released: %s", err);
    CHECK(gs_engine_init(&e, &ds, "victim", 5000, GS_CTL_HARD, 1, 0, getpid(), 1, &OPS, NULL, now_ns()) == 0, "and join");
    gs_engine_fini(&e);
    gs_devstate_close(&ds);
}

/* Truncate the file to `size` behind the handle's back, then use the handle as a pacer would. */
static void truncate_once(off_t size)
{
    struct gs_devstate ds, other;
    char err[256], path[128];
    CHECK(gs_devstate_open(&ds, dir, "GPU-trunc", err, sizeof err) == 0, "open: %s", err);
    int s = -1, p = -1;
    CHECK(gs_devstate_lock(&ds) == 0, "lock");
    CHECK(gs_devstate_join_locked(&ds, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 7, &s, &p) == 0, "join");
    gs_devstate_unlock(&ds);
    snprintf(path, sizeof path, "%s/GPU-trunc%s/victim", dir, GS_DS_FOLDER_SUFFIX);
    uint64_t caught = gs_devstate_faults_caught();
    CHECK(truncate(path, size) == 0, "truncate to %lld", (long long)size);
    /* the lock-free launch path: an atomic on the slice's credit, past the new end of the file */
    __atomic_sub_fetch(&gs_ds_slice(&ds, s)->credit_ns, 1000, __ATOMIC_RELAXED);
    gs_ds_proc(&ds, p)->last_launch_ns = now_ns();
    CHECK(gs_devstate_faults_caught() == caught + (size == 0 ? 2 : 1), "the SIGBUS of each page past the end was caught (%llu)",
          (unsigned long long)(gs_devstate_faults_caught() - caught));
    CHECK(__atomic_load_n(&ds.slot[s].lost, __ATOMIC_ACQUIRE), "the handle knows the slot is private now");
    /* the next lock maps the file again: full size, a header, our record re-joinable */
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the truncation");
    CHECK(!ds.slot[s].lost && gs_ds_own(&ds, s), "shared again");
    CHECK(gs_ds_header_ok(gs_ds_hdr(&ds, s)) == 0, "a valid header (re-initialised when cut to 0)");
    CHECK(gs_devstate_join_locked(&ds, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 8, &s, &p) == 0, "join again");
    gs_devstate_unlock(&ds);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == GS_DS_FILE_SIZE, "the file has its size back");
    CHECK(gs_devstate_open(&other, dir, "GPU-trunc", err, sizeof err) == 0, "another process opens it: %s", err);
    gs_devstate_lock(&other);
    int seen = 0;
    for (int i = 0; i < gs_ds_nprocs(&other); i++)
        seen += (gs_ds_proc(&other, i)->flags & GS_DS_PROC_IN_USE) && gs_ds_proc(&other, i)->id == 8;
    gs_devstate_unlock(&other);
    CHECK(seen == 1, "and sees the record: shared, not private");
    gs_devstate_close(&other);
    gs_devstate_close(&ds);
    unlink(path);
}

/* Our own file cut again within GS_DS_RECOVER_EVERY_NS of its last repair: the slot stays on its private
 * copy for that long, and a later lock, with no new fault, makes the file whole again (the guard's "something
 * was lost" flag must outlive a lock that defers the repair). */
static void test_own_file_cut_again_is_repaired_later(void)
{
    struct gs_devstate ds;
    char err[256], path[128];
    int s = -1, p = -1;
    CHECK(gs_devstate_open(&ds, dir, "GPU-recut", err, sizeof err) == 0, "open: %s", err);
    CHECK(gs_devstate_lock(&ds) == 0, "lock");
    CHECK(gs_devstate_join_locked(&ds, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 7, &s, &p) == 0, "join");
    gs_devstate_unlock(&ds);
    snprintf(path, sizeof path, "%s/GPU-recut%s/victim", dir, GS_DS_FOLDER_SUFFIX);
    for (int k = 0; k < 2; k++) {
        CHECK(truncate(path, 0) == 0, "cut %d", k);
        gs_ds_proc(&ds, p)->last_launch_ns = now_ns(); /* faults: the slot goes private */
        CHECK(__atomic_load_n(&ds.slot[s].lost, __ATOMIC_ACQUIRE), "cut %d: private", k);
        CHECK(gs_devstate_lock(&ds) == 0, "lock after cut %d", k);
        gs_devstate_unlock(&ds);
    }
    CHECK(ds.slot[s].lost, "cut again within the interval: still private after a lock");
    int64_t deadline = now_ns() + 5000000000LL;
    int whole = 0;
    while (!whole && now_ns() < deadline) {
        CHECK(gs_devstate_lock(&ds) == 0, "lock");
        whole = !ds.slot[s].lost && gs_ds_own(&ds, s);
        gs_devstate_unlock(&ds);
        if (!whole) usleep(10000);
    }
    CHECK(whole, "a later lock repaired it");
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == GS_DS_FILE_SIZE, "the file has its size back");
    gs_devstate_close(&ds);
    unlink(path);
}

/* A neighbour cuts its own file short: our read-only view of it faults on the next read (a launch path's
 * scan of its records); the fault is caught, the slot reads as empty, and the scan maps the file again
 * once its owner has made it whole. */
static void test_neighbour_truncates_its_file(void)
{
    struct gs_devstate ds, nb;
    char err[256], path[128];
    int s, p, ns, np;
    CHECK(gs_devstate_open(&ds, dir, "GPU-ntrunc", err, sizeof err) == 0 && gs_devstate_open(&nb, dir, "GPU-ntrunc", err, sizeof err) == 0,
          "open: %s", err);
    gs_devstate_lock(&nb);
    gs_devstate_join_locked(&nb, "neighbour", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 2, &ns, &np);
    gs_devstate_unlock(&nb);
    gs_devstate_lock(&ds);
    gs_devstate_join_locked(&ds, "me", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 1, &s, &p);
    gs_devstate_scan_locked(&ds, 0, 1);
    gs_devstate_unlock(&ds);
    int them = s == 0 ? 1 : 0;
    CHECK(gs_ds_slice(&ds, them)->flags & GS_DS_SLICE_IN_USE, "the neighbour is seen");
    snprintf(path, sizeof path, "%s/GPU-ntrunc%s/neighbour", dir, GS_DS_FOLDER_SUFFIX);
    uint64_t caught = gs_devstate_faults_caught();
    CHECK(truncate(path, 0) == 0, "truncate");
    int n = 0;
    for (int i = 0; i < gs_ds_nprocs(&ds); i++) n += (gs_ds_proc(&ds, i)->flags & GS_DS_PROC_IN_USE) != 0;
    CHECK(gs_devstate_faults_caught() > caught, "the SIGBUS was caught");
    CHECK(n == 1, "the neighbour reads as empty (%d records)", n);
    /* its owner's first touch faults too (its own slot goes private); its next lock makes the file whole */
    for (int k = 0; k < 2; k++) {
        CHECK(gs_devstate_lock(&nb) == 0 && gs_devstate_join_locked(&nb, "neighbour", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 3, &ns, &np) == 0,
              "its owner joins again: %s", nb.why);
        gs_devstate_unlock(&nb);
    }
    gs_devstate_lock(&ds);
    gs_devstate_scan_locked(&ds, 0, 1);
    gs_devstate_unlock(&ds);
    n = 0;
    for (int i = 0; i < gs_ds_nprocs(&ds); i++) n += (gs_ds_proc(&ds, i)->flags & GS_DS_PROC_IN_USE) != 0;
    CHECK(n == 2, "seen again once whole (%d records)", n);
    gs_devstate_close(&nb);
    gs_devstate_close(&ds);
}

/* One-shot scribbles over records: brought back into range by the next lock (no index leaves the tables,
 * no debt beyond what a legitimate writer makes). */
static void test_scribbled_records_are_brought_into_range(void)
{
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-scribble", err, sizeof err) == 0, "open: %s", err);
    int s = -1, p = -1;
    CHECK(gs_devstate_lock(&ds) == 0, "lock");
    CHECK(gs_devstate_join_locked(&ds, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 1, &s, &p) == 0, "join");
    gs_devstate_unlock(&ds);
    struct gs_ds_slice *r = gs_ds_slice(&ds, s);
    r->credit_ns = INT64_MIN;
    r->share_bp = 50000;
    r->rate_bp = 99999;
    r->mode = 7;
    r->weight = 0;
    r->priority = 9;
    memset(r->grant, 'x', sizeof r->grant);
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the scribbles");
    CHECK(r->credit_ns == -GS_CTL_DEBT_MAX_NS, "debt clamped: %lld", (long long)r->credit_ns);
    CHECK(r->share_bp == GS_BP_FULL && r->rate_bp == GS_BP_FULL, "share and rate at most the device");
    CHECK(r->mode == GS_CTL_HARD && r->weight == 1 && r->priority == 1, "mode, weight, priority in range");
    CHECK(memchr(r->grant, 0, sizeof r->grant) != NULL, "the grant name is terminated");
    gs_devstate_unlock(&ds);
    gs_devstate_close(&ds);
}

/* A thread that blocks SIGBUS (thread pools often block every signal) reads a neighbour's file just cut
 * short: a blocked synchronous SIGBUS kills the process whatever the handler, so the reading threads unblock
 * it first (gs_devstate_thread_ready). Without that call (`ready` 0) the child dies of SIGBUS: the case
 * is real. In a child: a failure must not take the suite down. */
static int blocked_ready;
static struct gs_devstate *blocked_ds;
static void *blocked_reader(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    if (blocked_ready) gs_devstate_thread_ready();
    int n = 0;
    for (int i = 0; i < gs_ds_nprocs(blocked_ds); i++) n += (gs_ds_proc(blocked_ds, i)->flags & GS_DS_PROC_IN_USE) != 0;
    return (void *)(intptr_t)n;
}

static int blocked_thread_child(int ready)
{
    struct gs_devstate ds, nb;
    char err[256], path[160], uuid[32];
    int s, p;
    snprintf(uuid, sizeof uuid, "GPU-blocked%d", ready);
    if (gs_devstate_open(&ds, dir, uuid, err, sizeof err) || gs_devstate_open(&nb, dir, uuid, err, sizeof err)) return 10;
    gs_devstate_lock(&nb);
    gs_devstate_join_locked(&nb, "nbr", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 2, &s, &p);
    gs_devstate_unlock(&nb);
    gs_devstate_lock(&ds);
    gs_devstate_scan_locked(&ds, 0, 1);
    gs_devstate_unlock(&ds);
    snprintf(path, sizeof path, "%s/%s%s/nbr", dir, uuid, GS_DS_FOLDER_SUFFIX);
    if (truncate(path, 0) != 0) return 11;
    blocked_ready = ready;
    blocked_ds = &ds;
    pthread_t t;
    void *n = NULL;
    if (pthread_create(&t, NULL, blocked_reader, NULL) != 0 || pthread_join(t, &n) != 0) return 12;
    return (intptr_t)n == 0 ? 0 : 13; /* the neighbour reads as empty */
}

static void test_thread_blocking_sigbus(void)
{
    for (int ready = 1; ready >= 0; ready--) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) _exit(blocked_thread_child(ready));
        int st;
        waitpid(pid, &st, 0);
        if (ready)
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a reader thread that blocked SIGBUS survives a neighbour's "
                  "truncation once ready (status %d)", st);
        else
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "the control: without gs_devstate_thread_ready it dies of "
                  "SIGBUS (status %d)", st);
    }
}

static void test_other_sigbus_still_kills(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct gs_devstate ds;
        char err[256], path[128];
        if (gs_devstate_open(&ds, dir, "GPU-other", err, sizeof err) != 0) _exit(10);
        snprintf(path, sizeof path, "%s/not-ours", dir);
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, 4096) != 0) _exit(11);
        volatile char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED || ftruncate(fd, 0) != 0) _exit(12);
        m[0] = 1; /* SIGBUS, not in a state file */
        _exit(13);
    }
    int st;
    waitpid(pid, &st, 0);
    /* under ASan the handler before ours is the sanitizer's, which reports the BUS and aborts */
    CHECK(WIFSIGNALED(st) && (WTERMSIG(st) == SIGBUS || WTERMSIG(st) == SIGABRT),
          "a SIGBUS elsewhere still kills (status %d)", st);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(60);
    snprintf(dir, sizeof dir, "/tmp/gs-dshostile-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_stopped_lock_holder();
    test_stopped_flock_holder();
    truncate_once(0);
    truncate_once(100);
    test_own_file_cut_again_is_repaired_later();
    test_neighbour_truncates_its_file();
    test_scribbled_records_are_brought_into_range();
    test_thread_blocking_sigbus();
    test_other_sigbus_still_kills();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {
    }
    printf("test_devstate_hostile: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
