/* Neighbours' slice files that claim what they are not must not cut a listed slice's rate in its own
 * pacer's allocation (issue 15's review). Since version 5 each slice writes only its own file, whose name
 * its manager chose: a slice is the grant its file is named after, whatever its record claims. With
 * root's roster on the device, gs_engine_rate must give a listed 30 % low-priority hard slice its 30 %
 * whatever files are beside it:
 *  1. 31 files of grants the roster does not list, each claiming 99.99 % soft, active: unlisted slices
 *     take no capacity (before the roster: each kept its claimed share, 3.1 % left);
 *  2. 31 files whose records claim to be a listed 90 % high-priority grant: each is the grant it is named
 *     after (before version 5 a record's claim was taken, and only the copies counted once);
 *  3. files claiming the victim's own grant: not the victim, not a rival;
 *  4. the control: real listed neighbours still count (a 40 % high-priority one leaves the victim its
 *     30 %, a 90 % one 10 %, both together nothing), so the test measures the allocation, not a constant;
 *  5. a roster file the reader leaves out is logged (its slice counts as unlisted in this process);
 *  6. a launch time stamped ahead of now keeps no grant active;
 *  7. a writer flipping 30 records' in-use flags or names while the victim recounts: the victim's rate is
 *     30 % at every one of 2,000 recounts (before the one-snapshot rule: 0-20 % in 83 % / 28 % of them).
 * Over the engine alone (no GPU, no driver double), under ASan/UBSan. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"
#include "gpuslice/pacer_core.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static const char *uuid = "GPU-records-0000";
static char dir[64], folder[160], slices[160];

static int noop_record(void *c, int i, void *s) { (void)c; (void)i; (void)s; return 0; }
static int noop_query(void *c, int i) { (void)c; (void)i; return 1; }
static int64_t noop_elapsed(void *c, int i) { (void)c; (void)i; return 1000; }
static const struct gs_gpu_ops OPS = {noop_record, noop_record, noop_query, noop_elapsed, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A roster file of root's, renamed into place as gpuslice.enforcer.policy writes it. */
static void listed(const char *grant, int compute, int priority)
{
    char tmp[256], path[256];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", folder, grant);
    snprintf(path, sizeof path, "%s/%s", folder, grant);
    FILE *f = fopen(tmp, "w");
    if (!f) { perror(tmp); exit(2); }
    fprintf(f, "version=1\ngrant=%s\ncompute=%d\nmode=hard\npriority=%d\n", grant, compute, priority);
    fclose(f);
    chmod(tmp, 0644);
    if (rename(tmp, path) != 0) { perror(path); exit(2); }
}

/* What a tenant can write since version 5: its own slice file (here made as a manager would, and
 * written as its process would), whose record claims any grant and share, launched just now, with a
 * live process record. */
enum { FORGED_MAX = GS_DS_MAX_SLICES };
static struct { char name[64]; unsigned char *map; } forged[FORGED_MAX];
static int nforged;
static void forge(const char *file, const char *claim, uint32_t share_bp, int mode, int priority, int64_t now)
{
    char path[320];
    snprintf(path, sizeof path, "%s/%s", slices, file);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0644);
    unsigned char *m = fd >= 0 && ftruncate(fd, GS_DS_FILE_SIZE) == 0
                           ? mmap(NULL, GS_DS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    if (m == MAP_FAILED || nforged >= FORGED_MAX) { perror(path); exit(2); }
    struct gs_ds_header *h = (struct gs_ds_header *)m;
    *h = (struct gs_ds_header){.magic = GS_DS_MAGIC, .version = GS_DS_VERSION, .size = GS_DS_FILE_SIZE,
                               .max_procs = GS_DS_SLOT_PROCS, .slice_off = GS_DS_SLICE_OFF, .slice_size = GS_DS_SLICE_SIZE,
                               .proc_off = GS_DS_PROC_OFF, .proc_size = GS_DS_PROC_SIZE};
    struct gs_ds_slice *s = (struct gs_ds_slice *)(m + GS_DS_SLICE_OFF);
    snprintf(s->grant, sizeof s->grant, "%s", claim);
    s->share_bp = share_bp;
    s->mode = (uint8_t)mode;
    s->weight = 16;
    s->priority = (uint8_t)priority;
    s->paced = 1;
    s->last_active_ns = now;
    s->flags = GS_DS_SLICE_IN_USE;
    struct gs_ds_proc *p = (struct gs_ds_proc *)(m + GS_DS_PROC_OFF);
    *p = (struct gs_ds_proc){.pid = getpid(), .flags = GS_DS_PROC_IN_USE, .id = 100u + (uint32_t)nforged,
                             .heartbeat_ns = now_ns(), .pidns = gs_devstate_pidns()};
    snprintf(forged[nforged].name, sizeof forged[nforged].name, "%s", file);
    forged[nforged++].map = m;
}

/* n slices named <prefix>-0 .. <prefix>-(n-1), each claiming `claim` (NULL: its own name) */
static void forge_many(int n, const char *prefix, const char *claim, uint32_t share_bp, int mode, int priority)
{
    for (int k = 0; k < n; k++) {
        char g[48];
        snprintf(g, sizeof g, "%s-%d", prefix, k);
        forge(g, claim ? claim : g, share_bp, mode, priority, now_ns());
    }
}

static struct gs_ds_slice *forged_slice(int k) { return (struct gs_ds_slice *)(forged[k].map + GS_DS_SLICE_OFF); }

static int flipper_mode, flipper_stop;

/* The race of the review: every record past the first two flips its in-use flag (mode 0) or its name
 * between a listed grant and an unlisted one (mode 1), as fast as it can, without the lock. */
static void *flipper(void *arg)
{
    (void)arg;
    for (unsigned k = 0; !__atomic_load_n(&flipper_stop, __ATOMIC_RELAXED); k++) {
        for (int i = 1; i < nforged; i++) {
            struct gs_ds_slice *s = forged_slice(i);
            __atomic_store_n(&s->last_active_ns, now_ns(), __ATOMIC_RELAXED);
            if (flipper_mode == 0) {
                __atomic_store_n(&s->flags, ((k + (unsigned)i) & 1) ? GS_DS_SLICE_IN_USE : 0u, __ATOMIC_RELAXED);
            } else {
                /* byte stores: the reader's private copy may catch any mix, which names neither */
                const char *name = ((k + (unsigned)i) & 1) ? "hp" : "zz";
                for (int b = 0; b < 3; b++) __atomic_store_n(&s->grant[b], name[b], __ATOMIC_RELAXED);
                __atomic_store_n(&s->flags, GS_DS_SLICE_IN_USE, __ATOMIC_RELAXED);
            }
        }
    }
    return NULL;
}

/* The forged files gone (their slices left the device). */
static void clear_others(void)
{
    for (int k = 0; k < nforged; k++) {
        char path[320];
        snprintf(path, sizeof path, "%s/%s", slices, forged[k].name);
        unlink(path);
        munmap(forged[k].map, GS_DS_FILE_SIZE);
    }
    nforged = 0;
}

/* The victim's rate as its poller works it out: policy packed, then the allocation (under the lock). */
static uint32_t rate_now(struct gs_engine *e)
{
    int64_t now = now_ns();
    e->pol_checked_ns = 0; /* look at the roster now, not in 100 ms */
    gs_eng_policy_refresh(e, now);
    if (gs_devstate_lock(e->ds) != 0) return 0;
    gs_devstate_scan_locked(e->ds, now, 1); /* the files as they are now, not in GS_DS_SCAN_NS */
    gs_eng_policy_locked(e, gs_ds_slice(e->ds, e->slice));
    uint32_t r = gs_engine_rate(e, now);
    gs_devstate_unlock(e->ds);
    return r;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/gs-records-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(folder, sizeof folder, "%s/%s.policy", dir, uuid);
    mkdir(folder, 0755);
    chmod(folder, 0755);
    listed("victim", 30, 1);
    listed("hp", 40, 0);
    listed("big", 90, 0);

    struct gs_devstate ds;
    char err[256];
    CHECK(gs_devstate_open(&ds, dir, uuid, err, sizeof err) == 0, "open: %s", err);
    struct gs_engine e;
    CHECK(gs_engine_init(&e, &ds, "victim", 3000, GS_CTL_HARD, 1, 1, getpid(), 1, &OPS, NULL, now_ns()) == 0, "init");
    CHECK(rate_now(&e) == 3000, "alone: its 30 %%");

    snprintf(slices, sizeof slices, "%s/%s%s", dir, uuid, GS_DS_FOLDER_SUFFIX);

    /* 1. unlisted slices */
    forge_many(GS_DS_MAX_SLICES - 1, "mine", NULL, GS_BP_FULL - 1, GS_CTL_SOFT, 1); /* 100 % would be unpaced: no claim */
    uint32_t r = rate_now(&e);
    printf("  31 unlisted slices claiming 99.99 %% soft: the listed 30 %% slice's rate %.1f %%\n", r / 100.0);
    CHECK(r == 3000, "31 unlisted slices: rate %u bp, expected 3000", r);

    /* 2. files claiming a listed high-priority grant */
    clear_others();
    forge_many(GS_DS_MAX_SLICES - 1, "claims-big", "big", 9000, GS_CTL_HARD, 0);
    r = rate_now(&e);
    printf("  31 files claiming a listed 90 %% high-priority grant: rate %.1f %%\n", r / 100.0);
    CHECK(r == 3000, "31 files claiming big: rate %u bp, expected 3000 (each is the grant it is named after: unlisted)", r);

    /* 3. files claiming the victim's own grant */
    clear_others();
    forge_many(GS_DS_MAX_SLICES - 1, "claims-victim", "victim", GS_BP_FULL, GS_CTL_SOFT, 0);
    r = rate_now(&e);
    CHECK(r == 3000, "31 files claiming its own grant: rate %u bp, expected 3000", r);

    /* 4. control: real listed neighbours count */
    clear_others();
    forge("hp", "hp", 4000, GS_CTL_HARD, 0, now_ns());
    CHECK((r = rate_now(&e)) == 3000, "beside hp (40 %% high): %u bp, expected 3000", r);
    forge("big", "big", 9000, GS_CTL_HARD, 0, now_ns());
    r = rate_now(&e);
    printf("  beside listed 40 %% and 90 %% high-priority slices: rate %.1f %%\n", r / 100.0);
    CHECK(r == 0, "hp 40 %% + big 90 %% high priority leave the low-priority victim nothing: %u bp", r);
    clear_others();
    forge("big", "big", 9000, GS_CTL_HARD, 0, now_ns());
    CHECK((r = rate_now(&e)) == 1000, "beside big (90 %% high): %u bp, expected 1000", r);

    /* 6. a launch time ahead of now is forged: it keeps no grant active */
    clear_others();
    forge("big", "big", 9000, GS_CTL_HARD, 0, now_ns() + 10000000000LL);
    CHECK((r = rate_now(&e)) == 3000, "big stamped 10 s ahead counts as idle: %u bp, expected 3000", r);

    /* 7. a writer flipping 30 records' in-use flags, and then their names, while the victim recounts: every
     *    recount sees each record once (before: below 20 % in 83 % / 28 % of recounts) */
    for (int m = 0; m < 2; m++) {
        clear_others();
        forge("hp", "hp", 4000, GS_CTL_HARD, 0, now_ns());
        forge_many(GS_DS_MAX_SLICES - 2, "flip", "hp", 4000, GS_CTL_HARD, 0);
        flipper_mode = m;
        __atomic_store_n(&flipper_stop, 0, __ATOMIC_RELAXED);
        pthread_t th;
        CHECK(pthread_create(&th, NULL, flipper, NULL) == 0, "flipper");
        int below = 0, n = 2000;
        for (int k = 0; k < n; k++) {
            below += rate_now(&e) != 3000;
            usleep(20);
        }
        __atomic_store_n(&flipper_stop, 1, __ATOMIC_RELAXED);
        pthread_join(th, NULL);
        printf("  %s flipped under the recount: %d of %d recounts off 30 %%\n", m ? "names" : "in-use flags", below, n);
        CHECK(below == 0, "%s flipped: %d of %d recounts not 30 %%", m ? "names" : "flags", below, n);
    }
    clear_others();

    /* 5. a roster file left out is said (its slice counts as unlisted here) */
    char bad[256], logpath[128];
    snprintf(bad, sizeof bad, "%s/mallory", folder);
    FILE *bf = fopen(bad, "w");
    if (bf) {
        fputs("version=1\ngrant=mallory\ncompute=90\npriority=0\n", bf);
        fclose(bf);
    }
    chmod(bad, 0666); /* writable by others: left out */
    snprintf(logpath, sizeof logpath, "%s/stderr.log", dir);
    fflush(stderr);
    int saved = dup(2), lf = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(lf, 2);
    close(lf);
    rate_now(&e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char said[2048] = {0};
    FILE *lg = fopen(logpath, "r");
    size_t got = lg ? fread(said, 1, sizeof said - 1, lg) : 0;
    if (lg) fclose(lg);
    said[got] = '\0';
    CHECK(strstr(said, "1 file(s) left out") && strstr(said, ".policy"), "the refusal is logged: %s", said);

    gs_engine_fini(&e);
    gs_devstate_close(&ds);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
    printf("test_pacer_records: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
