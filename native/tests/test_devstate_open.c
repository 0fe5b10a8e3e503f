/* How a slice's own file is made and opened (gs_devstate_join_locked; trust model in README.md): in a
 * device folder others may write to (no root manager: 01777), a link is never followed, a FIFO is never
 * opened for long, a file with other hard links is not used, a file another user made first is not used,
 * an existing file is never chmod'ed, and a file the call made is 0644 whatever the umask (neighbours of
 * other users read it). The device folder itself is never followed. Issue 15: a user's link to the
 * shared pacing file turned a root-owned 0600 file into 0666. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gpuslice/controller.h"
#include "gpuslice/devstate.h"

static int failures, checks;
#define CHECK(cond, ...) do { checks++; if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static char dir[64], victim[128], path[160];

static mode_t mode_of(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? st.st_mode & 07777 : 0;
}

static off_t size_of(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? st.st_size : -1;
}

/* Join `grant` on the test device: 0 (its file used), 1 (the file refused: paced on a private copy, the reason
 * in ds->why), -1 (failed). */
static int join(struct gs_devstate *ds, const char *grant)
{
    int s, p, rc = -1;
    if (gs_devstate_lock(ds) == 0) {
        rc = gs_devstate_join_locked(ds, grant, 5000, GS_CTL_HARD, 1, 1, 1, getpid(), 0, &s, &p);
        if (rc == 0) {
            rc = ds->slot[s].private_copy;
            gs_devstate_leave_locked(ds, p);
        }
        gs_devstate_unlock(ds);
    }
    return rc;
}

int main(void)
{
    struct gs_devstate ds;
    char err[256], folder[128];
    snprintf(dir, sizeof dir, "/tmp/gs-dsopen-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(victim, sizeof victim, "%s/victim", dir);
    int v = open(victim, O_CREAT | O_WRONLY, 0600);
    close(v);
    chmod(victim, 0600);
    CHECK(gs_devstate_open(&ds, dir, "GPU-open", err, sizeof err) == 0, "open: %s", err);
    snprintf(folder, sizeof folder, "%s/GPU-open%s", dir, GS_DS_FOLDER_SUFFIX);
    CHECK(mode_of(folder) == 01777, "no manager: the device folder is made 01777, got %o", (unsigned)mode_of(folder));

    /* a link in place of the file: refused, its target untouched */
    snprintf(path, sizeof path, "%s/link", folder);
    CHECK(symlink(victim, path) == 0, "symlink");
    CHECK(join(&ds, "link") == 1, "a link must be refused (a private copy)");
    CHECK(strstr(ds.why, "symbolic link") != NULL, "the reason names the link: %s", ds.why);
    CHECK(mode_of(victim) == 0600 && size_of(victim) == 0, "the link's target stays 0600 and empty (mode %o)",
          (unsigned)mode_of(victim));

    /* a FIFO: refused at once (no hang), untouched */
    snprintf(path, sizeof path, "%s/fifo", folder);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    CHECK(join(&ds, "fifo") == 1, "a FIFO must be refused (a private copy)");

    /* another hard link to a file: refused (it would write through to the other name) */
    snprintf(path, sizeof path, "%s/hard", folder);
    CHECK(link(victim, path) == 0, "link");
    CHECK(join(&ds, "hard") == 1, "a file with two links must be refused (a private copy)");
    CHECK(mode_of(victim) == 0600 && size_of(victim) == 0, "the hard-linked file stays 0600 and empty");

    /* a missing file: made 0644 whatever the umask, sized */
    mode_t old = umask(077);
    CHECK(join(&ds, "new") == 0, "make: %s", ds.why);
    umask(old);
    snprintf(path, sizeof path, "%s/new", folder);
    CHECK(mode_of(path) == 0644 && size_of(path) == GS_DS_FILE_SIZE, "made 0644, got %o", (unsigned)mode_of(path));

    /* an existing file of another mode: used, never chmod'ed */
    chmod(path, 0600);
    CHECK(join(&ds, "new") == 0, "reopen: %s", ds.why);
    CHECK(mode_of(path) == 0600, "an existing file keeps its mode, got %o", (unsigned)mode_of(path));

    /* a file another user made first (a sticky folder lets anyone make any name): not ours to use */
    if (geteuid() == 0) {
        snprintf(path, sizeof path, "%s/theirs", folder);
        int t = open(path, O_CREAT | O_WRONLY, 0666);
        CHECK(t >= 0 && fchown(t, 65533, 65533) == 0 && fchmod(t, 0666) == 0, "a file of uid 65533, writable by all");
        if (t >= 0) close(t);
        if (seteuid(65532) == 0) {
            CHECK(join(&ds, "theirs") == 1 && strstr(ds.why, "another user"), "refused: %s", ds.why);
            /* the overflow uid's too: in a folder no manager keeps, any user's file may show as that */
            CHECK(seteuid(0) == 0, "back to root");
            snprintf(path, sizeof path, "%s/overflow", folder);
            int o = open(path, O_CREAT | O_WRONLY, 0666);
            CHECK(o >= 0 && fchown(o, 65534, 65534) == 0 && fchmod(o, 0666) == 0, "a file of the overflow uid");
            if (o >= 0) close(o);
            CHECK(seteuid(65532) == 0, "as another user");
            CHECK(join(&ds, "overflow") == 1, "the overflow uid's file in an open folder is refused: %s", ds.why);
            if (seteuid(0) != 0) return 2;
        }
    }
    gs_devstate_close(&ds);

    /* a manager's folder (root's, 0755): any file in it is the one made for its grant, whoever owns it (a
     * process of the grant running as root uses its user's file) */
    if (geteuid() == 0) {
        char managed[128];
        snprintf(managed, sizeof managed, "%s/GPU-managed%s", dir, GS_DS_FOLDER_SUFFIX);
        CHECK(mkdir(managed, 0755) == 0 && chmod(managed, 0755) == 0, "a manager's folder");
        snprintf(path, sizeof path, "%s/users-grant", managed);
        int m = open(path, O_CREAT | O_WRONLY, 0644);
        CHECK(m >= 0 && fchown(m, 65533, 65533) == 0, "the grant's file, its user's");
        if (m >= 0) close(m);
        CHECK(gs_devstate_open(&ds, dir, "GPU-managed", err, sizeof err) == 0 && ds.managed, "open: managed");
        CHECK(join(&ds, "users-grant") == 0, "used, not a private copy: %s", ds.why);
        gs_devstate_close(&ds);
    }

    /* a folder of the overflow uid on the host (no user namespace): nobody's, not a manager's */
    if (geteuid() == 0) {
        char nob[128];
        snprintf(nob, sizeof nob, "%s/GPU-nobody%s", dir, GS_DS_FOLDER_SUFFIX);
        CHECK(mkdir(nob, 0755) == 0 && chown(nob, 65534, 65534) == 0, "a folder of uid 65534");
        CHECK(gs_devstate_open(&ds, dir, "GPU-nobody", err, sizeof err) == 0 && !ds.managed,
              "the overflow uid's folder is a manager's only inside a user namespace");
        gs_devstate_close(&ds);
    }

    /* the folders themselves links: refused */
    char linkdir[128];
    snprintf(linkdir, sizeof linkdir, "%s/dirlink", dir);
    CHECK(symlink(dir, linkdir) == 0, "symlink dir");
    CHECK(gs_devstate_open(&ds, linkdir, "GPU-open", err, sizeof err) != 0, "a linked folder must be refused");
    snprintf(path, sizeof path, "%s/GPU-linked%s", dir, GS_DS_FOLDER_SUFFIX);
    CHECK(symlink(folder, path) == 0, "symlink device folder");
    CHECK(gs_devstate_open(&ds, dir, "GPU-linked", err, sizeof err) != 0 && strstr(err, "link"),
          "a linked device folder must be refused: %s", err);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_devstate_open: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
