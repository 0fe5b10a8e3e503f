/* Per-device shared state: layout, many processes joining at once, a holder SIGKILLed inside the
 * lock, dead-process reclaim by slice-mates and hiding by neighbours, refusal of unknown versions,
 * neighbours mapped read-only, a late joiner found by the scan. `--write-sample DIR` writes a state file
 * with known contents for the Python reader's test (tests/native/test_compute_state.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char dir[256];

static int count_procs(struct gs_devstate *ds)
{
    int n = 0;
    for (int i = 0; i < gs_ds_nprocs(ds); i++) n += (gs_ds_proc(ds, i)->flags & GS_DS_PROC_IN_USE) != 0;
    return n;
}

static int count_slices(struct gs_devstate *ds)
{
    int n = 0;
    for (int i = 0; i < gs_ds_nslices(ds); i++) n += (gs_ds_slice(ds, i)->flags & GS_DS_SLICE_IN_USE) != 0;
    return n;
}

/* Records in use in a slice file, read from the file itself (not through a handle, which hides the dead). */
static int file_records(const char *uuid, const char *grant, struct gs_ds_header *h)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s%s/%s", dir, uuid, GS_DS_FOLDER_SUFFIX, grant);
    int fd = open(path, O_RDONLY);
    struct gs_ds_proc recs[GS_DS_SLOT_PROCS];
    int n = -1;
    if (fd >= 0 && pread(fd, h, sizeof *h, 0) == (ssize_t)sizeof *h &&
        pread(fd, recs, sizeof recs, GS_DS_PROC_OFF) == (ssize_t)sizeof recs) {
        n = 0;
        for (int i = 0; i < GS_DS_SLOT_PROCS; i++) n += (recs[i].flags & GS_DS_PROC_IN_USE) != 0;
    }
    if (fd >= 0) close(fd);
    return n;
}

static void test_concurrent_join(void)
{
    /* 16 processes x 50 join/leave cycles, four to a grant, each grant's file made by whichever joins
     * first: no lost record, no corruption, each file ends with exactly its survivors */
    enum { N = 16 };
    pid_t kids[N];
    for (int k = 0; k < N; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            struct gs_devstate ds;
            char err[256];
            if (gs_devstate_open(&ds, dir, "GPU-join", err, sizeof err)) _exit(10);
            char grant[32];
            snprintf(grant, sizeof grant, "g%d", k % 4);
            int s = -1, p = -1;
            for (int r = 0; r < 50; r++) {
                if (gs_devstate_lock(&ds)) _exit(11);
                if (gs_devstate_join_locked(&ds, grant, 2500, GS_CTL_HARD, 1 + k % 16, k % 2, 1, getpid(), 0, &s, &p)) _exit(12);
                gs_ds_slice(&ds, s)->busy_total_ns += 1;
                gs_devstate_unlock(&ds);
                if (gs_devstate_lock(&ds)) _exit(13);
                if (r < 49) gs_devstate_leave_locked(&ds, p);
                gs_devstate_unlock(&ds);
            }
            _exit(0); /* keeps its last record: a slice-mate frees it once we are gone */
        }
    }
    for (int k = 0; k < N; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", k, st);
    }
    for (int g = 0; g < 4; g++) {
        char grant[16];
        snprintf(grant, sizeof grant, "g%d", g);
        struct gs_ds_header h;
        int n = file_records("GPU-join", grant, &h);
        CHECK(n == N / 4, "%s: %d records in its file, expected %d", grant, n, N / 4);
        CHECK(gs_ds_header_ok(&h) == 0, "%s: a valid header", grant);
    }
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-join", err, sizeof err) == 0, "open: %s", err);
    CHECK(count_procs(&ds) == 0 && count_slices(&ds) == 0,
          "neighbours whose processes all died read as empty (%d procs, %d slices)", count_procs(&ds), count_slices(&ds));
    int s, p;
    gs_devstate_lock(&ds);
    CHECK(gs_devstate_join_locked(&ds, "g0", 2500, GS_CTL_HARD, 1, 0, 1, getpid(), 0, &s, &p) == 0, "join g0: %s", ds.why);
    int freed = gs_devstate_reap_locked(&ds, NULL);
    gs_devstate_unlock(&ds);
    CHECK(freed == N / 4, "a slice's process frees its dead slice-mates' records: %d, expected %d", freed, N / 4);
    CHECK(count_procs(&ds) == 1 && count_slices(&ds) == 1, "%d procs %d slices: only ours", count_procs(&ds), count_slices(&ds));
    gs_devstate_close(&ds);
}

static void test_sigkill_in_lock(void)
{
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-kill", err, sizeof err) == 0, "open: %s", err);
    int pfd[2];
    if (pipe(pfd)) { perror("pipe"); exit(1); }
    pid_t kid = fork();
    if (kid == 0) {
        struct gs_devstate c;
        if (gs_devstate_open(&c, dir, "GPU-kill", err, sizeof err)) _exit(10);
        int s, p;
        gs_devstate_lock(&c);
        gs_devstate_join_locked(&c, "victim", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 0, &s, &p);
        gs_ds_proc(&c, p)->flags |= GS_DS_PROC_BUSY;
        if (write(pfd[1], "x", 1) != 1) _exit(11);
        pause(); /* killed here, holding the lock */
        _exit(0);
    }
    char x;
    CHECK(read(pfd[0], &x, 1) == 1, "child ready");
    gs_devstate_scan_locked(&ds, 0, 1); /* the victim's file, live */
    CHECK(count_procs(&ds) == 1, "the victim is seen while it lives (%d)", count_procs(&ds));
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    /* the next locker gets the lock (the kernel released it) and, at its next scan, no longer sees the victim */
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the holder was killed");
    gs_devstate_scan_locked(&ds, 0, 1);
    CHECK(count_procs(&ds) == 0, "dead holder's records hidden (%d left)", count_procs(&ds));
    int s, p;
    CHECK(gs_devstate_join_locked(&ds, "next", 3000, GS_CTL_SOFT, 2, 1, 1, getpid(), 7, &s, &p) == 0, "join after recovery");
    gs_devstate_unlock(&ds);
    CHECK(gs_devstate_lock(&ds) == 0, "lock again");
    gs_devstate_leave_locked(&ds, p);
    gs_devstate_unlock(&ds);
    CHECK(count_procs(&ds) == 0 && count_slices(&ds) == 0, "leave frees the record and the slice");
    gs_devstate_close(&ds);
    close(pfd[0]);
    close(pfd[1]);
}

static void test_refuse_unknown(void)
{
    struct gs_devstate ds;
    char err[256], path[600];
    int s, p;
    CHECK(gs_devstate_open(&ds, dir, "GPU-ver", err, sizeof err) == 0, "open: %s", err);
    gs_devstate_lock(&ds);
    CHECK(gs_devstate_join_locked(&ds, "ver", 1000, GS_CTL_HARD, 1, 1, 1, getpid(), 0, &s, &p) == 0, "join: %s", ds.why);
    gs_ds_hdr(&ds, s)->version = 99;
    gs_devstate_unlock(&ds);
    gs_devstate_close(&ds);
    CHECK(gs_devstate_open(&ds, dir, "GPU-ver", err, sizeof err) == 0, "open: %s", err);
    gs_devstate_lock(&ds);
    CHECK(count_slices(&ds) == 0 && ds.unseen == 1, "a neighbour's file of version 99 is not mapped (%d, %llu unseen)",
          count_slices(&ds), (unsigned long long)ds.unseen);
    /* our own file with a header we do not know (only the slice's own processes can write it): initialised
     * again and used, so a tenant cannot escape its pacing by spoiling its own file, nor slip onto a private
     * copy neighbours do not see */
    CHECK(gs_devstate_join_locked(&ds, "ver", 1000, GS_CTL_HARD, 1, 1, 1, getpid(), 0, &s, &p) == 0 &&
              !ds.slot[s].private_copy && gs_ds_header_ok(gs_ds_hdr(&ds, s)) == 0,
          "version 99: initialised again, used");
    CHECK(strstr(ds.why, "version 99") != NULL && strstr(ds.why, "initialised again"), "said: %s", ds.why);
    gs_devstate_leave_locked(&ds, p);
    snprintf(path, sizeof path, "%s/GPU-ver%s/size", dir, GS_DS_FOLDER_SUFFIX);
    int fd = open(path, O_CREAT | O_RDWR, 0644);
    CHECK(fd >= 0 && ftruncate(fd, 100) == 0, "short file");
    close(fd);
    CHECK(gs_devstate_join_locked(&ds, "size", 1000, GS_CTL_HARD, 1, 1, 1, getpid(), 0, &s, &p) == 0 && !ds.slot[s].private_copy,
          "wrong size: made whole and used: %s", ds.why);
    struct stat sz;
    CHECK(stat(path, &sz) == 0 && sz.st_size == GS_DS_FILE_SIZE, "the file has its size back");
    gs_devstate_leave_locked(&ds, p);
    CHECK(gs_devstate_join_locked(&ds, "../x", 1000, GS_CTL_HARD, 1, 1, 1, getpid(), 0, &s, &p) != 0, "a grant with a slash is refused");
    gs_devstate_unlock(&ds);
    gs_devstate_close(&ds);
    CHECK(gs_devstate_open(&ds, dir, "../x", err, sizeof err) != 0, "a uuid with a slash is refused");
}

/* A neighbour's file is mapped read-only: a write into it from this process faults, so no bug of ours
 * (and no scribbling tenant library) can change a neighbour's records. */
static void test_neighbours_read_only(void)
{
    struct gs_devstate a, b;
    char err[256];
    int s, p, ns, np;
    CHECK(gs_devstate_open(&a, dir, "GPU-ro", err, sizeof err) == 0 && gs_devstate_open(&b, dir, "GPU-ro", err, sizeof err) == 0,
          "open: %s", err);
    gs_devstate_lock(&a);
    gs_devstate_join_locked(&a, "mine", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 0, &s, &p);
    gs_devstate_unlock(&a);
    gs_devstate_lock(&b);
    gs_devstate_join_locked(&b, "theirs", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 1, &ns, &np);
    gs_devstate_unlock(&b);
    gs_devstate_lock(&a);
    gs_devstate_scan_locked(&a, 0, 1);
    gs_devstate_unlock(&a);
    int them = -1;
    for (int i = 0; i < gs_ds_nslices(&a); i++)
        if (!strcmp(gs_ds_slice(&a, i)->grant, "theirs")) them = i;
    CHECK(them >= 0 && !gs_ds_own(&a, them) && gs_ds_own(&a, s), "the neighbour is mapped, not as ours");
    pid_t kid = fork();
    if (kid == 0) {
        gs_ds_slice(&a, them)->share_bp = 10000; /* must fault */
        _exit(0);
    }
    int st;
    waitpid(kid, &st, 0);
    /* (under ASan the fault is reported and the child exits 1; plain, SIGSEGV) */
    CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "a write into a neighbour's record faults (status %d)", st);
    CHECK(gs_ds_slice(&b, ns)->share_bp == 5000, "their record unchanged");
    gs_devstate_close(&a);
    gs_devstate_close(&b);
}

/* With more idle files (sized once, no live process) than a scan opens, a neighbour that joins one past
 * them is still seen within a few scans: each scan starts where the last one stopped (review: 60 idle files
 * hid a live neighbour for good). */
static void test_many_idle_files(void)
{
    struct gs_devstate ds, nb;
    char err[256], path[600];
    CHECK(gs_devstate_open(&ds, dir, "GPU-idle", err, sizeof err) == 0, "open: %s", err);
    for (int k = 0; k < 60; k++) {
        snprintf(path, sizeof path, "%s/GPU-idle%s/idle-%02d", dir, GS_DS_FOLDER_SUFFIX, k);
        int fd = open(path, O_CREAT | O_RDWR, 0644);
        CHECK(fd >= 0 && ftruncate(fd, GS_DS_FILE_SIZE) == 0, "idle file %d", k);
        if (fd >= 0) close(fd);
    }
    int s, p;
    CHECK(gs_devstate_open(&nb, dir, "GPU-idle", err, sizeof err) == 0, "open: %s", err);
    gs_devstate_lock(&nb);
    CHECK(gs_devstate_join_locked(&nb, "live-one", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 5, &s, &p) == 0, "join: %s", nb.why);
    gs_devstate_unlock(&nb);
    int scans = 0;
    gs_devstate_lock(&ds);
    for (; scans < 10 && count_slices(&ds) == 0; scans++) gs_devstate_scan_locked(&ds, 0, 1);
    gs_devstate_unlock(&ds);
    CHECK(count_slices(&ds) == 1, "the live neighbour among 61 files is seen (after %d scans)", scans);
    CHECK(scans <= 3, "within ceil(61 / %d) scans: %d", GS_DS_SCAN_MAX_OPENS, scans);
    gs_devstate_close(&nb);
    gs_devstate_close(&ds);
}

/* An engine's own slot stays its own while pinned, even when a slice-mate makes its record look dead and a
 * reap frees it: launch threads write the slot's records without the lock, and a slot given back could be
 * mapped to a neighbour's read-only file next (attacker's review). The engine then joins again there. */
static void test_pinned_slot_is_kept(void)
{
    struct gs_devstate ds, nb;
    char err[256];
    int s, p, ns, np;
    CHECK(gs_devstate_open(&ds, dir, "GPU-pin", err, sizeof err) == 0 && gs_devstate_open(&nb, dir, "GPU-pin", err, sizeof err) == 0,
          "open: %s", err);
    gs_devstate_lock(&ds);
    gs_devstate_join_locked(&ds, "me", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 1, &s, &p);
    gs_devstate_unlock(&ds);
    gs_devstate_lock(&nb);
    gs_devstate_join_locked(&nb, "other", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 2, &ns, &np);
    gs_devstate_unlock(&nb);
    struct gs_ds_proc *me = gs_ds_proc(&ds, p);
    me->pidns = 1; /* another namespace, as far as the record says, with no heartbeat: dead to a reaper */
    me->heartbeat_ns = 0;
    gs_devstate_lock(&ds);
    int freed = gs_devstate_reap_locked(&ds, NULL);
    gs_devstate_scan_locked(&ds, 0, 1);
    CHECK(freed == 1 && gs_ds_own(&ds, s) && ds.slot[s].pins == 1, "record freed, slot kept (own %d, pins %d)", gs_ds_own(&ds, s),
          ds.slot[s].pins);
    int s2, p2;
    CHECK(gs_devstate_join_locked(&ds, "me", 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 1, &s2, &p2) == 0 && s2 == s, "joined again there");
    gs_devstate_unpin_locked(&ds, s);
    CHECK(ds.slot[s].pins == 1 && gs_ds_own(&ds, s), "one pin left");
    gs_devstate_leave_locked(&ds, p2);
    CHECK(!gs_ds_own(&ds, s), "given back once the engine left");
    gs_devstate_unlock(&ds);
    gs_devstate_close(&nb);
    gs_devstate_close(&ds);
}

/* A neighbour's file that a manager made before its process started (empty, so the folder's mtime does
 * not move when it joins) is seen within one scan period; one whose processes all died is hidden and
 * comes back with a live process. */
static void test_scan_finds_late_joiner(void)
{
    struct gs_devstate a, b;
    char err[256], path[600];
    int s, p;
    CHECK(gs_devstate_open(&a, dir, "GPU-late", err, sizeof err) == 0, "open: %s", err);
    snprintf(path, sizeof path, "%s/GPU-late%s/late", dir, GS_DS_FOLDER_SUFFIX);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0644);
    CHECK(fd >= 0, "made empty, as a manager does");
    close(fd);
    gs_devstate_lock(&a);
    gs_devstate_scan_locked(&a, 0, 1);
    gs_devstate_unlock(&a);
    CHECK(count_slices(&a) == 0, "an empty file is nobody yet");
    CHECK(gs_devstate_open(&b, dir, "GPU-late", err, sizeof err) == 0, "open: %s", err);
    gs_devstate_lock(&b);
    CHECK(gs_devstate_join_locked(&b, "late", 5000, GS_CTL_HARD, 1, 0, 1, getpid(), 3, &s, &p) == 0, "join: %s", b.why);
    gs_devstate_unlock(&b);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == GS_DS_FILE_SIZE, "the joiner sized it");
    /* not yet due: the folder's mtime did not move */
    int64_t t = a.scanned_ns + GS_DS_MTIME_NS;
    gs_devstate_scan_locked(&a, t, 0);
    CHECK(count_slices(&a) == 0, "not before the scan period");
    gs_devstate_scan_locked(&a, a.scanned_ns + GS_DS_SCAN_NS + 1, 0);
    CHECK(count_slices(&a) == 1 && count_procs(&a) == 1, "seen after one scan period (%d slices)", count_slices(&a));
    gs_devstate_close(&a);
    gs_devstate_close(&b);
}

/* A file with known contents for the Python reader. */
static int write_sample(const char *d)
{
    struct gs_devstate ds;
    char err[256];
    if (gs_devstate_open(&ds, d, "GPU-00000000-1111-2222-3333-444444444444", err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int s, p;
    gs_devstate_lock(&ds);
    gs_devstate_join_locked(&ds, "train-a", 3000, GS_CTL_HARD, 2, 1, 1, getpid(), 0, &s, &p);
    gs_ds_slice(&ds, s)->achieved_bp = 2987;
    gs_ds_slice(&ds, s)->throttled_bp = 6500;
    gs_ds_slice(&ds, s)->rate_bp = 3000;
    gs_ds_slice(&ds, s)->busy_total_ns = 123456789;
    gs_ds_slice(&ds, s)->throttled_total_ns = 987654321;
    gs_ds_slice(&ds, s)->launches = 4242;
    gs_ds_proc(&ds, p)->busy_total_ns = 123456789;
    gs_ds_proc(&ds, p)->flags = (gs_ds_proc(&ds, p)->flags | GS_DS_PROC_BUSY | GS_DS_PROC_TURNS) & ~GS_DS_PROC_LIGHT;
    gs_ds_proc(&ds, p)->path = GS_DS_PATH_TURNS;
    gs_ds_proc(&ds, p)->offered_bp = 123456; /* 12.3456 */
    gs_devstate_join_locked(&ds, "serve-b", 10000, GS_CTL_SOFT, 1, 0, 0, getpid(), 1, &s, &p);
    gs_ds_slice(&ds, s)->achieved_bp = -1;
    gs_devstate_unlock(&ds);
    gs_devstate_close(&ds);
    printf("%d\n", (int)getpid());
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-sample")) return write_sample(argv[2]);
    snprintf(dir, sizeof dir, "/tmp/gs-test-devstate-%d", (int)getpid());
    test_concurrent_join();
    test_sigkill_in_lock();
    test_refuse_unknown();
    test_neighbours_read_only();
    test_scan_finds_late_joiner();
    test_pinned_slot_is_kept();
    test_many_idle_files();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    printf("test_devstate: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
