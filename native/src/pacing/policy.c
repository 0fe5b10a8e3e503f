/* gpuslice per-device policy roster: reading it (layout, trust and why: gpuslice/policy.h). */
#define _GNU_SOURCE
#include "gpuslice/policy.h"
#include "gpuslice/config.h"
#include "gpuslice/controller.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Owned by root or by us, writable by nobody else; or on a read-only mount, which nobody can write
 * (a pod's roster mount: in a user namespace root's files show as owned by the overflow uid). Apart from
 * FUSE (refused: on_fuse), only root can make a mount other users' processes see; a tenant that makes
 * one in a mount namespace of its own fools only its own processes. */
static int trusted(const struct stat *st, int readonly)
{
    return readonly || ((st->st_uid == 0 || st->st_uid == geteuid()) && !(st->st_mode & (S_IWGRP | S_IWOTH)));
}

static int on_readonly_mount(int fd)
{
    struct statvfs v;
    return fstatvfs(fd, &v) == 0 && (v.f_flag & ST_RDONLY);
}

/* FUSE lets an ordinary user mount (setuid fusermount) a file system that reports any owner and a
 * read-only flag: a tenant who took the folder's name before root could mount one there (review of
 * issue 15's roster). Nothing gpuslice writes lives on FUSE: such a folder lists nobody. */
#define GS_FUSE_SUPER_MAGIC 0x65735546
static int on_fuse(int fd)
{
    struct statfs f;
    return fstatfs(fd, &f) == 0 && f.f_type == GS_FUSE_SUPER_MAGIC;
}

/* An error that says nothing about the folder, only about this process or the moment (out of file
 * descriptors or memory): keep the set read before rather than drop grants from it. */
static int transient(int err) { return err == EMFILE || err == ENFILE || err == ENOMEM || err == EINTR || err == EAGAIN; }

int gs_pol_valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= GS_POL_GRANT_LEN || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.'))
            return 0;
    }
    return 1;
}

static int to_ctl_mode(int mode) { return mode == GS_MODE_SOFT ? GS_CTL_SOFT : mode == GS_MODE_OFF ? GS_CTL_OFF : GS_CTL_HARD; }

/* One file, relative to the folder: 0 and *e filled, -1 (left out), or -2 (a transient error: the
 * caller keeps what it had). */
static int read_entry(int dfd, int readonly, const char *name, struct gs_config *c, struct gs_pol_entry *e)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return transient(errno) ? -2 : -1;
    struct stat st;
    char buf[GS_POL_FILE_MAX + 1];
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && trusted(&st, readonly) &&
        st.st_size <= GS_POL_FILE_MAX)
        n = pread(fd, buf, GS_POL_FILE_MAX + 1, 0);
    close(fd);
    if (n < 0 || n > GS_POL_FILE_MAX) return -1;
    char err[256];
    if (gs_config_parse_text(buf, (size_t)n, c, err, sizeof err) != 0) return -1;
    if (strcmp(c->grant, name) != 0) return -1; /* a file must speak for the grant it is named after */
    memcpy(e->grant, name, strlen(name) + 1); /* gs_pol_valid_name: shorter than the field */
    e->pol.share_bp = (uint32_t)(c->compute < 0 ? 0 : c->compute > 100 ? 100 : c->compute) * 100u;
    e->pol.mode = (uint8_t)to_ctl_mode(c->mode);
    e->pol.weight = (uint8_t)(c->weight < 1 ? 1 : c->weight > 16 ? 16 : c->weight);
    e->pol.priority = c->priority ? 1 : 0;
    e->pol.colocation = (uint8_t)c->colocation;
    e->mps_id = c->mps_pipe_dir[0] ? gs_pol_mps_id(c->mps_pipe_dir) : 0;
    return 0;
}

uint64_t gs_pol_mps_id(const char *pipe_dir)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a: an identity, not a secret (root wrote every entry) */
    for (const unsigned char *p = (const unsigned char *)pipe_dir; *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
    return h | 1; /* never 0, which says "no daemon named" */
}

static int same_stamp(const struct gs_policy_set *p, const struct stat *st)
{
    return p->dev == st->st_dev && p->ino == st->st_ino && p->mtime.tv_sec == st->st_mtim.tv_sec &&
           p->mtime.tv_nsec == st->st_mtim.tv_nsec && p->ctime.tv_sec == st->st_ctim.tv_sec &&
           p->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static int same_entries(const struct gs_policy_set *a, const struct gs_policy_set *b)
{
    if (a->present != b->present || a->n != b->n) return 0;
    return memcmp(a->e, b->e, sizeof a->e[0] * (size_t)a->n) == 0;
}

/* 0, or -1 after a transient error (out is then incomplete). */
static int read_folder(int dfd, int readonly, struct gs_policy_set *out)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -1;
    }
    struct gs_config *c = malloc(sizeof *c); /* 6 KB: not on the poller's stack */
    int rc = c ? 0 : -1;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue; /* ., .. and the writers' temporary files */
        struct gs_pol_entry e;
        memset(&e, 0, sizeof e);
        int r = !gs_pol_valid_name(de->d_name) || out->n >= GS_POL_MAX ? -1 : read_entry(dirfd(d), readonly, de->d_name, c, &e);
        if (r == -2) rc = -1;
        if (r != 0) {
            out->refused += r == -1;
            continue;
        }
        /* sorted by grant: the same folder always reads the same, whatever readdir's order */
        int at = out->n;
        while (at > 0 && strcmp(out->e[at - 1].grant, e.grant) > 0) {
            out->e[at] = out->e[at - 1];
            at--;
        }
        out->e[at] = e;
        out->n++;
    }
    closedir(d);
    free(c);
    return rc;
}

/* What a read that could not finish leaves: the set read before, present or not (a grant dropped now would
 * lose its guarantee in this process's allocation; a node without a roster stays without one), else (the
 * first read) an empty roster; either way read again at the next look. */
static void keep_previous(const struct gs_policy_set *prev, struct gs_policy_set *out)
{
    uint64_t refused = out->refused;
    if (prev) memcpy(out, prev, sizeof *out);
    else {
        memset(out, 0, offsetof(struct gs_policy_set, e));
        out->present = 1;
    }
    out->refused = refused;
    out->ino = 0; /* no folder has inode 0: the next look reads it again */
}

int gs_policy_read(const char *dir, const char *uuid, const struct gs_policy_set *prev, struct gs_policy_set *out)
{
    char path[GS_PATH_LEN + 96];
    memset(out, 0, offsetof(struct gs_policy_set, e));
    out->generation = prev ? prev->generation : 0;
    out->refused = prev ? prev->refused : 0;
    if (!dir || !*dir || !uuid || strchr(uuid, '/') || snprintf(path, sizeof path, "%s/%s.policy", dir, uuid) >= (int)sizeof path)
        goto done;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        /* No folder: no root manager on this node, policy from the records. Anything else at the name (a
         * link, a file, a folder we may not read: a tenant took the name before root) is a roster that
         * lists nobody, never a reason to believe the records: root moves the squatter aside at its next
         * grant. */
        if (errno == ENOENT) goto done;
        if (transient(errno)) {
            keep_previous(prev, out);
            goto done;
        }
        out->present = 1;
        goto done;
    }
    struct stat st;
    if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode)) {
        close(dfd);
        out->present = 1;
        goto done;
    }
    /* a mount can change the verdict without changing the folder: it is part of the stamp */
    int readonly = on_readonly_mount(dfd), trust = !on_fuse(dfd) && trusted(&st, readonly);
    if (prev && prev->present && same_stamp(prev, &st) && prev->trusted == trust) {
        close(dfd);
        memcpy(out, prev, sizeof *out);
        return 0;
    }
    out->present = 1;
    out->trusted = trust;
    out->dev = st.st_dev;
    out->ino = st.st_ino;
    out->mtime = st.st_mtim;
    out->ctime = st.st_ctim;
    if (!trust) {
        close(dfd); /* a tenant's folder: lists nobody (its stamp kept: read again once it changes) */
        goto done;
    }
    if (read_folder(dfd, readonly, out) != 0) keep_previous(prev, out);
done:;
    int changed = !prev || !same_entries(prev, out);
    if (changed) out->generation++;
    return changed;
}

const struct gs_pol *gs_policy_find(const struct gs_policy_set *set, const char *grant)
{
    int lo = 0, hi = set->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(set->e[mid].grant, grant);
        if (c == 0) return &set->e[mid].pol;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

uint64_t gs_pol_pack(const struct gs_pol *p)
{
    return (1ULL << 63) | ((uint64_t)p->share_bp << 32) | ((uint64_t)p->mode << 24) | ((uint64_t)p->weight << 16) |
           ((uint64_t)p->priority << 8) | p->colocation;
}

int gs_pol_unpack(uint64_t w, struct gs_pol *p)
{
    if (!(w >> 63)) return 0;
    p->share_bp = (uint32_t)((w >> 32) & 0x7fffffffu);
    p->mode = (uint8_t)(w >> 24);
    p->weight = (uint8_t)(w >> 16);
    p->priority = (uint8_t)(w >> 8);
    p->colocation = (uint8_t)w;
    return 1;
}
