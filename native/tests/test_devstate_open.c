/* How the per-device state file is created and opened (gs_devstate_open; trust model in README.md): in a
 * folder every tenant may write to, a link is never followed, a FIFO is never opened for long, a file with
 * other hard links is not used, an existing file is never chmod'ed, and only a file the call created is
 * made 0666. Issue 15: a user's link here turned a root-owned 0600 file into 0666. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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

int main(void)
{
    struct gs_devstate ds;
    char err[256];
    snprintf(dir, sizeof dir, "/tmp/gs-dsopen-XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(victim, sizeof victim, "%s/victim", dir);
    int v = open(victim, O_CREAT | O_WRONLY, 0600);
    close(v);
    chmod(victim, 0600);

    /* a link in place of the file: refused, its target untouched */
    snprintf(path, sizeof path, "%s/GPU-link.dev", dir);
    CHECK(symlink(victim, path) == 0, "symlink");
    CHECK(gs_devstate_open(&ds, dir, "GPU-link", err, sizeof err) != 0, "a link must be refused");
    CHECK(strstr(err, "symbolic link") != NULL, "err names the link: %s", err);
    CHECK(mode_of(victim) == 0600 && size_of(victim) == 0, "the link's target stays 0600 and empty (mode %o)",
          (unsigned)mode_of(victim));

    /* a FIFO: refused at once (no hang), untouched */
    snprintf(path, sizeof path, "%s/GPU-fifo.dev", dir);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo");
    CHECK(gs_devstate_open(&ds, dir, "GPU-fifo", err, sizeof err) != 0, "a FIFO must be refused");

    /* another hard link to a file: refused (it would write through to the other name) */
    snprintf(path, sizeof path, "%s/GPU-hard.dev", dir);
    CHECK(link(victim, path) == 0, "link");
    CHECK(gs_devstate_open(&ds, dir, "GPU-hard", err, sizeof err) != 0, "a file with two links must be refused");
    CHECK(mode_of(victim) == 0600 && size_of(victim) == 0, "the hard-linked file stays 0600 and empty");

    /* a missing file: created 0666 whatever the umask */
    mode_t old = umask(077);
    CHECK(gs_devstate_open(&ds, dir, "GPU-new", err, sizeof err) == 0, "create: %s", err);
    gs_devstate_close(&ds);
    umask(old);
    snprintf(path, sizeof path, "%s/GPU-new.dev", dir);
    CHECK(mode_of(path) == 0666, "created 0666, got %o", (unsigned)mode_of(path));

    /* an existing file of another mode: used, never chmod'ed */
    chmod(path, 0644);
    CHECK(gs_devstate_open(&ds, dir, "GPU-new", err, sizeof err) == 0, "reopen: %s", err);
    gs_devstate_close(&ds);
    CHECK(mode_of(path) == 0644, "an existing file keeps its mode, got %o", (unsigned)mode_of(path));

    /* the folder itself a link: refused */
    char linkdir[128];
    snprintf(linkdir, sizeof linkdir, "%s/dirlink", dir);
    CHECK(symlink(dir, linkdir) == 0, "symlink dir");
    CHECK(gs_devstate_open(&ds, linkdir, "GPU-new", err, sizeof err) != 0, "a linked folder must be refused");

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_devstate_open: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
