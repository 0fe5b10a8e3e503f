/* The device's policy roster (gs_policy_read; policy.h): what a pacer takes as every slice's share, mode,
 * weight, priority and co-location. Pins: a file is read only when it is a regular file of one link,
 * owned by root or by us and writable by nobody else, parses as a slice file and names the grant it is
 * named after; a folder others may write (or a link, or a file in its place: a tenant took the name) is a
 * roster that lists nobody, never "no roster" (which would send pacers back to the records every tenant
 * writes); a read cut short by running out of file descriptors keeps the set read before; on a
 * read-only mount any owner is trusted (a pod's mount in a user namespace); an unchanged folder is not
 * read again, a renamed-in file is; lookups find every listed grant and nothing else. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "gpuslice/config.h"
#include "gpuslice/controller.h"
#include "gpuslice/policy.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char dir[64], folder[128];
static const char *uuid = "GPU-00000000-1111-2222-3333-444444444444";

/* written in place, then renamed (as the writers do): `mode` is the file's */
static void put(const char *name, const char *text, mode_t mode)
{
    char tmp[256], path[256];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", folder, name);
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *f = fopen(tmp, "w");
    if (!f) { perror(tmp); exit(2); }
    fputs(text, f);
    fclose(f);
    chmod(tmp, mode);
    if (rename(tmp, path) != 0) { perror(path); exit(2); }
}

static void policy(const char *grant, int compute, const char *mode, int priority, int weight, const char *coloc)
{
    char text[512];
    snprintf(text, sizeof text, "version=1\ngrant=%s\ncompute=%d\nmode=%s\npriority=%d\nweight=%d\ncolocation=%s\n", grant,
             compute, mode, priority, weight, coloc);
    put(grant, text, 0644);
}

static void rm_rf(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
}

/* gs_policy_read with this process out of descriptors but `spare` (1: the folder opens, its files do not). */
static int read_without_fds(const struct gs_policy_set *prev, struct gs_policy_set *out, int spare)
{
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    low = old;
    low.rlim_cur = 64;
    int fds[64], n = 0;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "lower the descriptor limit");
    while (n < 64 && (fds[n] = dup(0)) >= 0) n++;
    CHECK(errno == EMFILE, "descriptors used up (%d)", n);
    for (int k = 0; k < spare && n > 0; k++) close(fds[--n]);
    int changed = gs_policy_read(dir, uuid, prev, out);
    while (n > 0) close(fds[--n]);
    setrlimit(RLIMIT_NOFILE, &old);
    return changed;
}

/* The folder read with this process out of descriptors: `prev` (4 grants) must stand in `out`. */
static void out_of_fds_keeps_the_set(struct gs_policy_set *prev, struct gs_policy_set *out)
{
    /* the folder has just changed (g-3 renamed in): the read must happen; first the folder's own open
     * fails, then (one descriptor spare) each file's */
    int changed = read_without_fds(prev, out, 1);
    CHECK(changed == 0 && out->present && out->n == prev->n && out->ino == 0,
          "EMFILE on the files: the set read before stands (changed %d, n %d of %d)", changed, out->n, prev->n);
    changed = read_without_fds(prev, out, 0);
    CHECK(changed == 0 && out->present && out->n == prev->n && gs_policy_find(out, "k-pod-a"),
          "EMFILE: the set read before stands (changed %d, n %d of %d)", changed, out->n, prev->n);
    CHECK(out->ino == 0, "and the next look reads the folder again");
    CHECK(gs_policy_read(dir, uuid, out, prev) == 1, "which it does");
    memcpy(out, prev, sizeof *out);
}

/* In a mount namespace of a child's own: the folder bind-mounted read-only and owned by the overflow uid,
 * as root's roster looks inside a pod with a user namespace; its files are read (mode bits aside). Needs root (CI runs the
 * suite as root); without it the case cannot be set up and is reported, not passed. */
static void readonly_mount_is_trusted(void)
{
    if (geteuid() != 0) {
        printf("test_policy: read-only mount case not run (needs root)\n");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        struct gs_policy_set *x = calloc(2, sizeof *x);
        if (!x || unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) _exit(10);
        if (chown(folder, 65534, 65534) != 0) _exit(11);
        if (gs_policy_read(dir, uuid, NULL, &x[0]) != 1 || !x[0].present || x[0].n != 0) _exit(12); /* not ours, writable mount */
        if (mount(folder, folder, NULL, MS_BIND, NULL) != 0 ||
            mount(NULL, folder, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0)
            _exit(13);
        /* the 0666 file too: on a read-only mount nobody can write it; the hard link and the liar stay out */
        if (gs_policy_read(dir, uuid, &x[0], &x[1]) != 1 || x[1].n != 5 || !gs_policy_find(&x[1], "g-3") ||
            !gs_policy_find(&x[1], "writable") || gs_policy_find(&x[1], "hard"))
            _exit(14);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(chown(folder, 0, 0) == 0, "folder back to root");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "read-only mount owned by uid 65534: trusted, its 5 files read (child exit %d: 10 namespace, 11 chown, "
          "12 trusted on a writable mount, 13 bind, 14 not read)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/gs-policy-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(folder, sizeof folder, "%s/%s.policy", dir, uuid);
    struct gs_policy_set a, b;

    CHECK(gs_policy_read(dir, uuid, NULL, &a) == 1 && !a.present && a.n == 0, "no folder: no roster");
    CHECK(read_without_fds(&a, &b, 0) == 0 && !b.present, "out of descriptors on a node without a roster: still none");

    mkdir(folder, 0755);
    chmod(folder, 0755);
    policy("k-pod-a", 30, "hard", 0, 1, "preemptive");
    policy("g-2", 55, "soft", 1, 4, "shared");
    policy("dra-3", 0, "off", 1, 16, "preemptive");
    CHECK(gs_policy_read(dir, uuid, &a, &b) == 1 && b.present && b.n == 3, "three files read: present %d n %d", b.present, b.n);
    const struct gs_pol *p = gs_policy_find(&b, "k-pod-a");
    CHECK(p && p->share_bp == 3000 && p->mode == GS_CTL_HARD && p->priority == 0 && p->weight == 1 &&
              p->colocation == GS_COLOC_PREEMPTIVE, "k-pod-a as written");
    p = gs_policy_find(&b, "g-2");
    CHECK(p && p->share_bp == 5500 && p->mode == GS_CTL_SOFT && p->priority == 1 && p->weight == 4 &&
              p->colocation == GS_COLOC_SHARED, "g-2 as written");
    p = gs_policy_find(&b, "dra-3");
    CHECK(p && p->share_bp == 0 && p->mode == GS_CTL_OFF && p->weight == 16, "dra-3 as written");
    CHECK(!gs_policy_find(&b, "k-pod") && !gs_policy_find(&b, "") && !gs_policy_find(&b, "zzz"), "nothing else is found");
    CHECK(strcmp(b.e[0].grant, "dra-3") == 0 && strcmp(b.e[2].grant, "k-pod-a") == 0, "kept sorted by grant");

    /* unchanged: not read again, the same set */
    uint64_t gen = b.generation;
    CHECK(gs_policy_read(dir, uuid, &b, &a) == 0 && a.n == 3 && a.generation == gen, "unchanged folder: same set");

    /* what is left out, each counted */
    uint64_t refused = a.refused;
    put("writable", "version=1\ngrant=writable\ncompute=90\npriority=0\n", 0666);       /* others may write it */
    put("liar", "version=1\ngrant=k-pod-a\ncompute=90\npriority=0\n", 0644);            /* speaks for another grant */
    put("broken", "version=1\ngrant=broken\ncompute=lots\n", 0644);                      /* not a slice file */
    char big[GS_POL_FILE_MAX + 64];
    memset(big, '#', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    put("big", big, 0644);                                                              /* larger than the bound */
    char target[256], lnk[256], hard[256];
    snprintf(target, sizeof target, "%s/outside", dir);
    FILE *f = fopen(target, "w");
    fputs("version=1\ngrant=linked\ncompute=90\npriority=0\n", f);
    fclose(f);
    chmod(target, 0644);
    snprintf(lnk, sizeof lnk, "%s/linked", folder);
    CHECK(symlink(target, lnk) == 0, "symlink");                                        /* a link: never followed */
    snprintf(hard, sizeof hard, "%s/hard", folder);
    put("hard", "version=1\ngrant=hard\ncompute=90\npriority=0\n", 0644);
    char hard2[256];
    snprintf(hard2, sizeof hard2, "%s/hard-copy", dir);
    CHECK(link(hard, hard2) == 0, "hard link");                                          /* two links: refused */
    CHECK(gs_policy_read(dir, uuid, &a, &b) == 0 && b.n == 3, "none of the six is read: n %d", b.n);
    CHECK(b.refused == refused + 6, "each left out is counted: %llu", (unsigned long long)(b.refused - refused));
    CHECK(gs_policy_find(&b, "k-pod-a")->priority == 0 && gs_policy_find(&b, "k-pod-a")->share_bp == 3000,
          "the liar did not change k-pod-a");

    /* a live change: a new file renamed over the old one is read at the next look */
    policy("g-2", 20, "hard", 0, 2, "preemptive");
    CHECK(gs_policy_read(dir, uuid, &b, &a) == 1 && a.generation == b.generation + 1, "a renamed-in file is a change");
    p = gs_policy_find(&a, "g-2");
    CHECK(p && p->share_bp == 2000 && p->priority == 0 && p->mode == GS_CTL_HARD, "g-2's new policy");

    /* out of file descriptors part way: the set read before stands, and the next look reads again */
    policy("g-3", 10, "hard", 1, 1, "preemptive");
    out_of_fds_keeps_the_set(&a, &b);
    CHECK(b.n == 4 && gs_policy_find(&b, "g-3"), "read again once descriptors are back: n %d", b.n);

    /* a read-only mount is trusted whoever owns it */
    readonly_mount_is_trusted();

    /* a folder others may write lists nobody, whatever it holds */
    chmod(folder, 0777);
    CHECK(gs_policy_read(dir, uuid, &b, &a) == 1 && a.present && a.n == 0, "a folder others may write: lists nobody");
    chmod(folder, 0755);
    CHECK(gs_policy_read(dir, uuid, &a, &b) == 1 && b.n == 4, "made ours again (its ctime moved): read again");
    /* nor does a link to a folder, or a file in its place */
    char real[128];
    snprintf(real, sizeof real, "%s/real.policy", dir);
    CHECK(rename(folder, real) == 0 && symlink(real, folder) == 0, "folder swapped for a link");
    CHECK(gs_policy_read(dir, uuid, &b, &a) == 1 && a.present && a.n == 0, "a link in the folder's place: lists nobody");
    unlink(folder);
    FILE *sq = fopen(folder, "w");
    if (sq) fclose(sq);
    CHECK(gs_policy_read(dir, uuid, &a, &b) == 0 && b.present && b.n == 0, "a file in the folder's place: lists nobody");
    unlink(folder);
    CHECK(gs_policy_read(dir, uuid, &b, &a) == 1 && !a.present, "nothing at the name: no roster (records)");

    /* packing, for the launch paths */
    struct gs_pol x = {9999, GS_CTL_SOFT, 16, 1, GS_COLOC_TIDAL}, y;
    CHECK(gs_pol_unpack(gs_pol_pack(&x), &y) && memcmp(&x, &y, sizeof x) == 0, "pack and unpack");
    CHECK(!gs_pol_unpack(0, &y), "0 is not a policy");

    rm_rf();
    printf("test_policy: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
