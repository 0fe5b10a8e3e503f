/* A hostile neighbour on the per-device state file (mode 0666 by design: every tenant's pacer writes
 * it) may distort shares but must never hang or crash another tenant's process (issue 15, attacker's
 * review). Pinned here, under ASan/UBSan:
 *  - a process that takes the state mutex and stops (SIGSTOP): a locker gives up within
 *    GS_DS_LOCK_WAIT_NS (+ slack), then only tries without waiting during the back-off, and takes the
 *    lock again once the holder lets go; the engine's join (a process's first launch) fails, not hangs;
 *  - a process that holds the file's flock and stops: opening the file fails within the bound;
 *  - the file truncated under a mapping (to 0 and to 100 bytes): the next access does not die of
 *    SIGBUS; the handle works on a private copy, and the next lock gives the file its size back and
 *    maps it again, shared with the other processes;
 *  - garbage written over the bytes that held version 3's mutex: the lock is taken as before;
 *  - records scribbled over (a debt of 2^63, indexes out of the tables): back in range at the next lock;
 *  - a SIGBUS that is not about the state file still kills the process (the guard swallows nothing).
 * On the code before the fix the first case blocks forever: alarm() turns that into a failure. */
#define _GNU_SOURCE
#include <errno.h>
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
        if (flock_only ? flock(ds.fd, LOCK_EX) != 0 : gs_devstate_lock(&ds) != 0) _exit(11);
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
    CHECK(gs_devstate_open(&ds, dir, "GPU-flock", err, sizeof err) == 0, "create: %s", err);
    gs_devstate_close(&ds);
    pid_t holder = stopped_holder("GPU-flock", 1);
    CHECK(holder > 0, "holder stopped with the flock");
    int64_t t0 = now_ns();
    CHECK(gs_devstate_open(&ds, dir, "GPU-flock", err, sizeof err) != 0, "open refused while the flock is held");
    CHECK(now_ns() - t0 < BOUND_NS, "open gave up within the bound");
    CHECK(strstr(err, "held by another process") != NULL, "the reason says so: %s", err);
    release(holder);
    CHECK(gs_devstate_open(&ds, dir, "GPU-flock", err, sizeof err) == 0, "open once released: %s", err);
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
    snprintf(path, sizeof path, "%s/GPU-trunc.dev", dir);
    uint64_t caught = gs_devstate_faults_caught();
    CHECK(truncate(path, size) == 0, "truncate to %lld", (long long)size);
    /* the lock-free launch path: an atomic on the slice's credit, past the new end of the file */
    __atomic_sub_fetch(&ds.slices[s].credit_ns, 1000, __ATOMIC_RELAXED);
    ds.procs[p].last_launch_ns = now_ns();
    CHECK(gs_devstate_faults_caught() == caught + 1, "the SIGBUS was caught (%llu)", (unsigned long long)(gs_devstate_faults_caught() - caught));
    CHECK(gs_ds_guard_lost(&ds), "the handle knows its mapping is private now");
    /* the next lock maps the file again: full size, a header, our record re-joinable */
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the truncation");
    CHECK(!gs_ds_guard_lost(&ds), "shared again");
    CHECK(ds.hdr->magic == GS_DS_MAGIC && ds.hdr->version == GS_DS_VERSION, "a valid header (re-initialised when cut to 0)");
    CHECK(gs_devstate_join_locked(&ds, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 8, &s, &p) == 0, "join again");
    gs_devstate_unlock(&ds);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == GS_DS_FILE_SIZE, "the file has its size back");
    CHECK(gs_devstate_open(&other, dir, "GPU-trunc", err, sizeof err) == 0, "another process opens it: %s", err);
    CHECK((other.procs[p].flags & GS_DS_PROC_IN_USE) && other.procs[p].id == 8, "and sees the record: shared, not private");
    gs_devstate_close(&other);
    gs_devstate_close(&ds);
    unlink(path);
}

/* Version 3 kept a pthread mutex in the file; garbage there hung or aborted neighbours. The lock is the
 * kernel's now: garbage over those bytes costs a reap (the "held" hint), never a wait. */
static void test_garbage_over_the_lock_bytes(void)
{
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-garbage", err, sizeof err) == 0, "open: %s", err);
    memset(ds.hdr->lock, 0xA5, sizeof ds.hdr->lock);
    int64_t t0 = now_ns();
    CHECK(gs_devstate_lock(&ds) == 0, "garbage over the lock bytes: the lock is still taken");
    gs_devstate_unlock(&ds);
    CHECK(now_ns() - t0 < GS_DS_LOCK_WAIT_NS / 2, "without waiting (%lld ms)", (long long)((now_ns() - t0) / 1000000));
    for (int k = 0; k < 3; k++) {
        memset(ds.hdr->lock, 0xff - k, sizeof ds.hdr->lock);
        CHECK(gs_devstate_lock(&ds) == 0, "again (%d)", k);
        gs_devstate_unlock(&ds);
    }
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
    struct gs_ds_slice *r = &ds.slices[s];
    r->credit_ns = INT64_MIN;
    r->share_bp = 50000;
    r->rate_bp = 99999;
    r->mode = 7;
    r->weight = 0;
    r->priority = 9;
    memset(r->grant, 'x', sizeof r->grant);
    ds.procs[p + 1].flags = GS_DS_PROC_IN_USE;
    ds.procs[p + 1].slice = 1000000;
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the scribbles");
    CHECK(r->credit_ns == -GS_CTL_DEBT_MAX_NS, "debt clamped: %lld", (long long)r->credit_ns);
    CHECK(r->share_bp == GS_BP_FULL && r->rate_bp == GS_BP_FULL, "share and rate at most the device");
    CHECK(r->mode == GS_CTL_HARD && r->weight == 1 && r->priority == 1, "mode, weight, priority in range");
    CHECK(memchr(r->grant, 0, sizeof r->grant) != NULL, "the grant name is terminated");
    CHECK(!(ds.procs[p + 1].flags & GS_DS_PROC_IN_USE), "a record naming no slice is freed");
    gs_devstate_unlock(&ds);
    gs_devstate_close(&ds);
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
    test_garbage_over_the_lock_bytes();
    test_scribbled_records_are_brought_into_range();
    test_other_sigbus_still_kills();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {
    }
    printf("test_devstate_hostile: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
