/* Per-device shared state: layout, many processes joining at once, a holder SIGKILLed inside the
 * lock, dead-process reclaim, refusal of unknown versions. `--write-sample DIR` writes a state file
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
    for (int i = 0; i < GS_DS_MAX_PROCS; i++) n += (ds->procs[i].flags & GS_DS_PROC_IN_USE) != 0;
    return n;
}

static void test_concurrent_join(void)
{
    /* 16 processes x 50 join/leave cycles on one file created concurrently: no lost record, no
     * corruption, and the file ends with exactly the survivors */
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
                ds.slices[s].busy_total_ns += 1;
                gs_devstate_unlock(&ds);
                if (gs_devstate_lock(&ds)) _exit(13);
                if (r < 49) gs_devstate_leave_locked(&ds, p);
                gs_devstate_unlock(&ds);
            }
            _exit(0); /* keeps its last record: the parent reaps it once we are gone */
        }
    }
    for (int k = 0; k < N; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", k, st);
    }
    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, "GPU-join", err, sizeof err) == 0, "open: %s", err);
    CHECK(ds.hdr->magic == GS_DS_MAGIC && ds.hdr->version == GS_DS_VERSION && ds.hdr->size == GS_DS_FILE_SIZE, "header");
    CHECK(count_procs(&ds) == N, "%d process records, expected %d", count_procs(&ds), N);
    int slices = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) slices += (ds.slices[i].flags & GS_DS_SLICE_IN_USE) != 0;
    CHECK(slices == 4, "%d slice records for 4 grants", slices);
    gs_devstate_lock(&ds);
    int freed = gs_devstate_reap_locked(&ds, NULL);
    gs_devstate_unlock(&ds);
    CHECK(freed == N, "reaped %d dead processes, expected %d", freed, N);
    slices = 0;
    for (int i = 0; i < GS_DS_MAX_SLICES; i++) slices += (ds.slices[i].flags & GS_DS_SLICE_IN_USE) != 0;
    CHECK(count_procs(&ds) == 0 && slices == 0, "all records free after reap (%d procs, %d slices)", count_procs(&ds), slices);
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
        c.procs[p].flags |= GS_DS_PROC_BUSY;
        if (write(pfd[1], "x", 1) != 1) _exit(11);
        pause(); /* killed here, holding the lock */
        _exit(0);
    }
    char x;
    CHECK(read(pfd[0], &x, 1) == 1, "child ready");
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    /* the next locker must get the lock (EOWNERDEAD recovered) and find the victim reaped */
    CHECK(gs_devstate_lock(&ds) == 0, "lock after the holder was killed");
    CHECK(count_procs(&ds) == 0, "dead holder's record reclaimed (%d left)", count_procs(&ds));
    int s, p;
    CHECK(gs_devstate_join_locked(&ds, "next", 3000, GS_CTL_SOFT, 2, 1, 1, getpid(), 7, &s, &p) == 0, "join after recovery");
    gs_devstate_unlock(&ds);
    CHECK(gs_devstate_lock(&ds) == 0, "lock again");
    gs_devstate_leave_locked(&ds, p);
    gs_devstate_unlock(&ds);
    CHECK(count_procs(&ds) == 0, "leave frees the record");
    gs_devstate_close(&ds);
    close(pfd[0]);
    close(pfd[1]);
}

static void test_refuse_unknown(void)
{
    struct gs_devstate ds;
    char err[256], path[512];
    CHECK(gs_devstate_open(&ds, dir, "GPU-ver", err, sizeof err) == 0, "open: %s", err);
    ds.hdr->version = 99;
    gs_devstate_close(&ds);
    CHECK(gs_devstate_open(&ds, dir, "GPU-ver", err, sizeof err) != 0, "version 99 must be refused");
    CHECK(strstr(err, "version 99") != NULL, "error names the version: %s", err);
    snprintf(path, sizeof path, "%s/GPU-size.dev", dir);
    int fd = open(path, O_CREAT | O_RDWR, 0666);
    CHECK(fd >= 0 && ftruncate(fd, 100) == 0, "short file");
    close(fd);
    CHECK(gs_devstate_open(&ds, dir, "GPU-size", err, sizeof err) != 0 && strstr(err, "size"), "wrong size refused: %s", err);
    CHECK(gs_devstate_open(&ds, dir, "../x", err, sizeof err) != 0, "a uuid with a slash is refused");
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
    ds.slices[s].achieved_bp = 2987;
    ds.slices[s].throttled_bp = 6500;
    ds.slices[s].rate_bp = 3000;
    ds.slices[s].busy_total_ns = 123456789;
    ds.slices[s].throttled_total_ns = 987654321;
    ds.slices[s].launches = 4242;
    ds.procs[p].busy_total_ns = 123456789;
    ds.procs[p].flags = (ds.procs[p].flags | GS_DS_PROC_BUSY | GS_DS_PROC_TURNS) & ~GS_DS_PROC_LIGHT;
    ds.procs[p].path = GS_DS_PATH_TURNS;
    ds.procs[p].offered_bp = 123456; /* 12.3456 */
    gs_devstate_join_locked(&ds, "serve-b", 10000, GS_CTL_SOFT, 1, 0, 0, getpid(), 1, &s, &p);
    ds.slices[s].achieved_bp = -1;
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
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    printf("test_devstate: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
