/* gpuslice per-device policy roster (issue 15): the share, mode, weight, priority and co-location of
 * every slice on a device, as the node's root manager wrote them; read by every pacer of the device.
 *
 * Why: the pacing file (devstate.h) is written by every tenant on the device, so a policy read from it
 * is whatever any tenant wrote there: a low-priority tenant could say it was high priority (and its
 * neighbours would yield to it), give itself a larger share or weight in its neighbours' allocation,
 * or lower a neighbour's share (the neighbour's own pacer took its share from that record). The roster
 * is written by root alone, so a pacer takes every slice's policy, its own included, from the roster
 * and never from a record a tenant can write.
 *
 * Layout: a folder <device_state_dir>/<uuid>.policy/ with one file per grant, named by the grant id and
 * written in the slice-file syntax (config.c parses it: version=1, grant=, compute=, mode=, weight=,
 * priority=, colocation=, and for a spatial slice engine=spatial and mps_pipe_dir=, its MPS daemon; other
 * keys are allowed and ignored here). The local agent writes it at grant,
 * resize and release (gpuslice.enforcer.policy); in Kubernetes the device plugin and the DRA driver
 * write it on the host and mount the folder read-only into the container.
 *
 * Trust: the folder and each file must be owned by root or by this process's effective user (a user may
 * fool only themselves), must not be writable by group or others, must be a real folder / a regular file
 * with one link (never followed), and each file names the grant it is named after. A file that fails any
 * of this is left out and counted; a folder that fails it (or is missing) means "no roster": the pacer
 * then reads policy from the records, as before (a node without a root manager has no tenants to
 * protect from each other).
 *
 * Live changes: the folder is stat'ed at most every GS_POL_RECHECK_NS and read again when its mtime,
 * ctime or inode changed (writers replace files by rename, which changes the folder's mtime). */
#ifndef GPUSLICE_POLICY_H
#define GPUSLICE_POLICY_H
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define GS_POL_MAX 64                   /* grants listed per device (twice the slices a pacing file holds) */
#define GS_POL_GRANT_LEN 128            /* as the pacing file's grant field */
#define GS_POL_FILE_MAX 4096            /* a policy file is a few lines; a larger one is refused */
/* How often a pacer looks at the folder. A live resize reaches the pacers within this; a stat() every
 * 100 ms is nothing beside a poller that runs every ms. */
#define GS_POL_RECHECK_NS 100000000LL

struct gs_pol {
    uint32_t share_bp;   /* set share, basis points (0 and 10000: not paced) */
    uint8_t mode;        /* controller.h: GS_CTL_HARD, GS_CTL_SOFT, GS_CTL_OFF */
    uint8_t weight;      /* 1..16 */
    uint8_t priority;    /* 0 high, 1 low */
    uint8_t colocation;  /* config.h's enum gs_colocation */
};

struct gs_pol_entry {
    char grant[GS_POL_GRANT_LEN];
    struct gs_pol pol;
    /* A spatial slice's MPS daemon: a hash of the entry's mps_pipe_dir= (the daemon's pipe directory on the
     * node; nonzero), or 0 when the entry names none (a time-sliced slice, or a writer that does not say).
     * The yield cap (mps.h) is for a high-priority neighbour of the same daemon. */
    uint64_t mps_id;
};

struct gs_policy_set {
    int present;                 /* 0: no folder (no root manager; policy from the records); 1: a roster,
                                    empty when the folder is not trusted (a tenant took the name) */
    int trusted;                 /* the folder passed the trust rules (part of its stamp) */
    int n;
    uint64_t generation;         /* changes whenever what was read changes */
    uint64_t refused;            /* files left out (owner, mode, links, syntax, size, name), ever */
    struct gs_pol_entry e[GS_POL_MAX];
    /* what the folder looked like when it was last read */
    dev_t dev;
    ino_t ino;
    struct timespec mtime, ctime;
};

/* A grant id as a file name (a roster entry's, a slice file's): what the writers allow
 * (gpuslice.enforcer.policy's _GRANT_RE). 1 if valid. */
int gs_pol_valid_name(const char *s);
/* Read <dir>/<uuid>.policy into `out` (out->present = 0 when there is no trusted folder). Never fails:
 * whatever cannot be trusted is left out. `prev` (may be NULL) is the set read before: when the folder
 * has not changed since, `out` is a copy of it and nothing is opened. 1 if what was read differs from
 * prev, else 0. */
int gs_policy_read(const char *dir, const char *uuid, const struct gs_policy_set *prev, struct gs_policy_set *out);
/* gs_pol_entry.mps_id of a daemon's pipe directory (nonzero). */
uint64_t gs_pol_mps_id(const char *pipe_dir);
/* The entry of `grant`, or NULL (not listed). */
const struct gs_pol *gs_policy_find(const struct gs_policy_set *set, const char *grant);
/* Packed into one word, so that launch paths read a neighbour's policy with one atomic load
 * (pacer_core.c keeps one per slice record). Bit 63 set: valid. */
uint64_t gs_pol_pack(const struct gs_pol *p);
int gs_pol_unpack(uint64_t w, struct gs_pol *p); /* 1 if valid */

#endif
