/* The spatial engine in the process: before the driver starts, a spatial slice's MPS client settings
 * are the slice's (pipe directory, compute share as active-thread percentage, memory limit as pinned
 * limit, a low-priority preemptive slice as a below-normal client, and such a slice with no share of its
 * own capped at GS_MPS_YIELD_THREADS when the device's roster lists a high-priority preemptive slice at
 * its start), the environment may only lower the
 * threads, the limit and the priority, launches are never paced to the share (no pacing file is opened;
 * with GPUSLICE_SPATIAL_YIELD=1 a preemptive slice runs the pacer for the yield gate only: a low-priority one
 * holds its launches while a high-priority neighbour that asked too has a backlog), and memory is accounted and
 * refused exactly as for a time-sliced slice. A time-sliced slice with the same share is paced to it
 * (the control case) and touches no MPS variable.
 * Also run with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <dirent.h>
#include <poll.h>
#include <sys/stat.h>
#include "gpuslice/devstate.h"
#include "gpuslice/mps.h"

static char devdir[300];

/* Grant `grant`'s slice of device 0 alone with this compute share, its pacing files under devdir, with extra
 * key=value lines; "sp" is the case's own (slice.conf, t_region), another grant a neighbour of its own. */
static void slice_of(const char *grant, int compute, const char *extra)
{
    char path[320], region[320], u0[64];
    t_uuid(0, u0);
    int own = !strcmp(grant, "sp");
    snprintf(devdir, sizeof devdir, "%s/dev", t_dir);
    snprintf(path, sizeof path, "%s/%s.conf", t_dir, own ? "slice" : grant);
    snprintf(region, sizeof region, "%s", t_region);
    if (!own) snprintf(region, sizeof region, "%s/%s.region", t_dir, grant);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=%s\ndevices=%s\nregion=%s\ndevice_state_dir=%s\nmemory_limit=1g\n"
               "context_overhead=%llu\ncompute=%d\nmode=hard\n%s", grant, u0, region, devdir, CTX, compute, extra);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
}

static void slice_c(int compute, const char *extra) { slice_of("sp", compute, extra); }

static void slice1(const char *extra) { slice_c(25, extra); }

/* A grant in device 0's roster under devdir, as the node side writes it (root's or ours, 0644, in a
 * folder only its owner may write: policy.h's trust rules). */
static void roster_of(const char *grant, int priority, const char *coloc, const char *daemon);
static void roster(const char *grant, int priority, const char *coloc) { roster_of(grant, priority, coloc, NULL); }

/* ... naming the MPS daemon the slice is a client of (its pipe directory), as the node side writes a spatial
 * slice's entry; NULL: none named */
static void roster_of(const char *grant, int priority, const char *coloc, const char *daemon)
{
    char u0[64], path[512];
    t_uuid(0, u0);
    mkdir(devdir, 0755);
    snprintf(path, sizeof path, "%s/%s.policy", devdir, u0);
    mkdir(path, 0755);
    chmod(path, 0755);
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "/%s", grant);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=%s\ncompute=0\npriority=%d\ncolocation=%s\n", grant, priority, coloc);
    if (daemon) fprintf(f, "engine=spatial\nmps_pipe_dir=%s\n", daemon);
    fclose(f);
    chmod(path, 0644);
}

static int pacing_files(void)
{
    DIR *d = opendir(devdir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, GS_DS_FOLDER_SUFFIX) != NULL;
    closedir(d);
    return n;
}

static void cleanup_devdir(void)
{
    char p[600];
    snprintf(p, sizeof p, "rm -rf '%s'", devdir); /* the devices' folders and their slice files */
    if (system(p) != 0) fprintf(stderr, "could not remove %s\n", devdir);
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

static void launch_some(void)
{
    for (int i = 0; i < 5; i++) CHECK_EQ(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuStreamSynchronize(NULL), CUDA_SUCCESS);
}

/* The pacer path of this process on device 0 as its stats say (GS_DS_PATH_*), -1 when it paces nothing
 * there. Weak: the sanitized build links the enforcer, the LD_PRELOAD build finds it in the preloaded one. */
extern int gpuslice_pacer_stats(int dev, char *buf, size_t len) __attribute__((weak));
static int pacer_path(void)
{
    char buf[1024];
    if (!gpuslice_pacer_stats || gpuslice_pacer_stats(0, buf, sizeof buf) < 0) return -1;
    const char *p = strstr(buf, "\"path\": ");
    return p ? atoi(p + 8) : -1;
}

static void s_spatial_sets_the_client_and_is_not_paced(void)
{
    unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    unsetenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/elsewhere", 1); /* the slice's pipe directory governs */
    char extra[400];
    snprintf(extra, sizeof extra, "engine=spatial\nmps_pipe_dir=%s/mps\n", t_dir);
    slice1(extra);
    up(0);
    char want[320];
    snprintf(want, sizeof want, "%s/mps", t_dir);
    CHECK(!strcmp(env("CUDA_MPS_PIPE_DIRECTORY"), want), "pipe %s", env("CUDA_MPS_PIPE_DIRECTORY"));
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25"), "threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=1024M"), "pinned %s", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
    launch_some();
    CHECK_EQ(pacing_files(), 0); /* the pacer never joined the device: the yield gate was not asked for */
    CHECK(pacer_path() == -1, "path %d, expected no pacer", pacer_path());
    cleanup_devdir();
    /* memory: the same books and the same refusal as a time-sliced slice */
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB - CTX), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(t_used(0), 1024 * MiB);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(t, 1024 * MiB);
}

/* Asked for, the yield gate joins the device, but the slice's 25 % is MPS's: never paced to it */
static void s_spatial_yield_gate_is_not_paced_to_the_share(void)
{
    setenv("GPUSLICE_SPATIAL_YIELD", "1", 1);
    slice1("engine=spatial\n");
    up(0);
    launch_some();
    CHECK_EQ(pacing_files(), 1);
    CHECK(pacer_path() == GS_DS_PATH_LIGHT, "path %d, expected light (unpaced)", pacer_path());
    cleanup_devdir();
}

/* Not asked for, a high-priority spatial process records no drains either: no pacer (the gate's cost to a server,
 * 1-2 ms a request on the H200, is paid only by one that asked) */
static void s_high_priority_not_asking_runs_no_pacer(void)
{
    unsetenv("GPUSLICE_SPATIAL_YIELD");
    slice1("engine=spatial\npriority=0\n");
    up(0);
    launch_some();
    CHECK_EQ(pacing_files(), 0);
    CHECK(pacer_path() == -1, "path %d, expected no pacer", pacer_path());
    cleanup_devdir();
}

/* Asked for where the device-state folder cannot be searched: the gate is off, the GPU work goes on (it holds no
 * limit; before the gate a spatial slice never needed that folder), whatever fail_open says */
static void s_spatial_yield_gate_that_cannot_start_refuses_nothing(void)
{
    char path[320], file[320], u0[64];
    t_uuid(0, u0);
    snprintf(file, sizeof file, "%s/not-a-folder", t_dir);
    FILE *f = fopen(file, "w");
    if (!f) { perror(file); exit(2); }
    fclose(f);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=sp\ndevices=%s\nregion=%s\ndevice_state_dir=%s/ds\nmemory_limit=1g\n"
               "context_overhead=%llu\nengine=spatial\nfail_open=0\n", u0, t_region, file, CTX);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
    setenv("GPUSLICE_SPATIAL_YIELD", "1", 1);
    up(0); /* cuInit succeeds: CHECK_EQ inside */
    launch_some();
    CHECK(pacer_path() == -1, "path %d, expected no pacer", pacer_path());
}

static void s_env_may_only_lower_the_mps_limits(void)
{
    setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "10", 1);      /* lower: kept */
    setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=512M", 1);   /* lower: kept */
    slice1("engine=spatial\n");
    up(0);
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "10"), "threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=512M"), "pinned %s", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
}

static void s_env_cannot_raise_the_mps_limits(void)
{
    setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100", 1);
    setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4G", 1);
    setenv("GPUSLICE_MEMORY_LIMIT", "300m", 1); /* a process limit lowers the pinned limit too */
    slice1("engine=spatial\n");
    up(0);
    unsetenv("GPUSLICE_MEMORY_LIMIT");
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25"), "threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=300M"), "pinned %s", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
}

/* One case of a scenario in a process of its own: the enforcer reads its configuration once per process,
 * so a second up() in the same process would check nothing. */
#define CASE(fn) CHECK(t_fork(fn) == 0, "case %s", #fn)

/* MPS client priority, starting from `have` in the environment ("" = unset) */
static const char *prio_of(const char *have, const char *extra)
{
    if (*have) setenv("CUDA_MPS_CLIENT_PRIORITY", have, 1);
    else unsetenv("CUDA_MPS_CLIENT_PRIORITY");
    slice1(extra);
    up(0);
    return env("CUDA_MPS_CLIENT_PRIORITY");
}

static void p_low_asking_normal(void) /* a low-priority tenant asking to be normal */
{
    CHECK(!strcmp(prio_of("0", "engine=spatial\npriority=1\n"), "1"), "low, preemptive");
}
static void p_high(void) { CHECK(!strcmp(prio_of("", "engine=spatial\npriority=0\n"), "(unset)"), "high"); }
static void p_high_lowered(void) /* a high-priority slice may lower itself */
{
    CHECK(!strcmp(prio_of("1", "engine=spatial\npriority=0\n"), "1"), "high, lowered by its env");
}
static void p_low_shared(void) /* shared: nobody yields */
{
    CHECK(!strcmp(prio_of("", "engine=spatial\npriority=1\ncolocation=shared\n"), "(unset)"), "low, shared");
}

static void s_low_priority_is_a_below_normal_client(void)
{
    CASE(p_low_asking_normal);
    CASE(p_high);
    CASE(p_high_lowered);
    CASE(p_low_shared);
}

/* The active-thread percentage the slice starts with, from `have` in the environment ("" = unset); the
 * roster is what the case wrote. */
static const char *threads_of(const char *have)
{
    if (*have) setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", have, 1);
    else unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    up(0);
    return env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
}

/* A spatial slice of this share and extra lines, and an empty roster (the cases run one after another) */
static void spatial_slice(int compute, const char *extra)
{
    char lines[200];
    snprintf(lines, sizeof lines, "engine=spatial\n%s", extra);
    slice_c(compute, lines);
    cleanup_devdir();
}

static char yield_cap[8];

static void y_low_beside_high(void) /* the trainer started after the server: capped */
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    roster("sp", 1, "preemptive");
    CHECK(!strcmp(threads_of(""), yield_cap), "low beside high: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_env_cannot_raise_it(void)
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of("100"), yield_cap), "env 100: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_env_may_lower_it(void)
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of("20"), "20"), "env 20: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_alone(void) /* no high-priority neighbour: every SM */
{
    spatial_slice(0, "priority=1\n");
    roster("sp", 1, "preemptive");
    roster("other-low", 1, "preemptive");
    CHECK(!strcmp(threads_of(""), "(unset)"), "alone: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_high_shared(void) /* a high-priority slice that asks nobody to yield */
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "shared");
    CHECK(!strcmp(threads_of(""), "(unset)"), "beside a shared high: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_low_shared(void) /* a low-priority slice that does not yield */
{
    spatial_slice(0, "priority=1\ncolocation=shared\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "(unset)"), "low shared: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_own_share(void) /* a share of its own is its cap, beside a server or not */
{
    spatial_slice(80, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "80"), "compute 80: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_every_sm(void) /* compute 100: every SM, asked for */
{
    spatial_slice(100, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "(unset)"), "compute 100: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_high_itself(void) /* the server is never capped by its own entry or another server's */
{
    spatial_slice(0, "priority=0\n");
    roster("sp", 0, "preemptive");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "(unset)"), "high: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_roster_others_may_write(void) /* a roster folder a tenant could write lists nobody */
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    char u0[64], path[512];
    t_uuid(0, u0);
    snprintf(path, sizeof path, "%s/%s.policy", devdir, u0);
    chmod(path, 0777);
    CHECK(!strcmp(threads_of(""), "(unset)"), "untrusted roster: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}

static void y_env_compute_cannot_raise_it(void) /* GPUSLICE_COMPUTE may lower a share; 99 is no share of its own */
{
    setenv("GPUSLICE_COMPUTE", "99", 1);
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), yield_cap), "GPUSLICE_COMPUTE=99: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_env_compute_lowers_it(void)
{
    setenv("GPUSLICE_COMPUTE", "30", 1);
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "30"), "GPUSLICE_COMPUTE=30: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_only_its_own_entry_is_high(void) /* its own grant is no neighbour, whatever its entry says */
{
    spatial_slice(0, "priority=1\n");
    roster("sp", 0, "preemptive");
    CHECK(!strcmp(threads_of(""), "(unset)"), "own entry high: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_mig_instance(void) /* a MIG instance's roster is named GPU-<hex>, as the pacer names the device */
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive"); /* GPU-<device 0's hex>.policy */
    char path[320], u0[64];
    t_uuid(0, u0);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=sp\ndevices=MIG-%s\nregion=%s\ndevice_state_dir=%s\nmemory_limit=1g\n"
               "engine=spatial\npriority=1\n", u0 + 4, t_region, devdir);
    fclose(f);
    unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    (void)cuInit(0); /* the double has no such MIG instance: only the settings made before it matter here */
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), yield_cap), "MIG: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_set_back_before_cuinit(void) /* changed after the first hooked call, before cuInit */
{
    spatial_slice(0, "priority=1\n");
    roster("srv", 0, "preemptive");
    unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    size_t total;
    (void)cuDeviceTotalMem_v2(&total, 0); /* the enforcer starts here: settings made */
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), yield_cap), "after the first call: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100", 1);
    unsetenv("CUDA_MPS_CLIENT_PRIORITY");
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), yield_cap), "at cuInit: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_CLIENT_PRIORITY"), "1"), "at cuInit: priority %s", env("CUDA_MPS_CLIENT_PRIORITY"));
}

static void y_same_daemon(void) /* the server a client of our own daemon: capped */
{
    spatial_slice(0, "priority=1\n");
    roster_of("sp", 1, "preemptive", "/state/mps/dev-1000/pipe");
    roster_of("srv", 0, "preemptive", "/state/mps/dev-1000/pipe");
    CHECK(!strcmp(threads_of(""), yield_cap), "same daemon: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_other_daemon(void) /* another user's server: its own daemon, time-sliced against ours anyway */
{
    spatial_slice(0, "priority=1\n");
    roster_of("sp", 1, "preemptive", "/state/mps/dev-1000/pipe");
    roster_of("srv", 0, "preemptive", "/state/mps/dev-1001/pipe");
    CHECK(!strcmp(threads_of(""), "(unset)"), "other daemon: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}
static void y_daemon_not_named(void) /* a writer that names no daemon: counted, as before daemons were named */
{
    spatial_slice(0, "priority=1\n");
    roster_of("sp", 1, "preemptive", "/state/mps/dev-1000/pipe");
    roster_of("srv", 0, "preemptive", NULL);
    CHECK(!strcmp(threads_of(""), yield_cap), "neighbour names none: threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}

static void s_yielding_client_is_capped_beside_a_high_priority_slice(void)
{
    snprintf(yield_cap, sizeof yield_cap, "%d", GS_MPS_YIELD_THREADS);
    CASE(y_low_beside_high);
    CASE(y_env_cannot_raise_it);
    CASE(y_env_may_lower_it);
    CASE(y_alone);
    CASE(y_high_shared);
    CASE(y_low_shared);
    CASE(y_own_share);
    CASE(y_every_sm);
    CASE(y_high_itself);
    CASE(y_roster_others_may_write);
    CASE(y_env_compute_cannot_raise_it);
    CASE(y_env_compute_lowers_it);
    CASE(y_only_its_own_entry_is_high);
    CASE(y_mig_instance);
    CASE(y_set_back_before_cuinit);
    CASE(y_same_daemon);
    CASE(y_other_daemon);
    CASE(y_daemon_not_named);
    cleanup_devdir();
}

static void s_timeslice_is_paced_and_leaves_mps_alone(void)
{
    unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    unsetenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    slice1("");
    up(0);
    launch_some();
    CHECK_EQ(pacing_files(), 1);
    CHECK(pacer_path() == GS_DS_PATH_FREE, "path %d, expected free (paced to its 25 %%)", pacer_path());
    cleanup_devdir();
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "(unset)"), "threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "(unset)"), "pinned %s", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
}

/* A high-priority spatial server whose queue never drains (the double's events stay pending), launching
 * every millisecond until told to stop on `stop` (a pipe: readable = stop); says "up" on `ready` once it
 * has launched. */
extern int gsdouble_events_pending;
static void serve_a_backlog(int ready, int stop, int ask)
{
    if (ask) setenv("GPUSLICE_SPATIAL_YIELD", "1", 1); /* the server asks for the gate */
    else unsetenv("GPUSLICE_SPATIAL_YIELD");
    slice_of("srv", 0, "engine=spatial\npriority=0\n");
    up(0);
    gsdouble_events_pending = 1;
    CHECK_EQ(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    if (write(ready, "u", 1) != 1) exit(2);
    close(ready);
    /* until told to stop, the case gone (EOF), or 60 s: a broken case must not leave it spinning */
    struct pollfd pf = {.fd = stop, .events = POLLIN};
    for (int ms = 0; ms < 60000 && poll(&pf, 1, 1) == 0; ms++)
        CHECK_EQ(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    fflush(NULL);
    _exit(t_failures ? 1 : 0);
}

/* The longest of this case's launches, in seconds, over `n` launches (or until one is held 1 s) made while a
 * high-priority spatial server beside it (which asked for the gate) has a backlog; our slice as `extra`
 * says, and `ask` whether we ask for the gate too. The yield holds a launch at most GS_CTL_YIELD_HOLD_MAX
 * (2 s): a launch of 1 s or more was held by the yield, never by a loaded box. */
static double longest_beside_a_backlog(const char *extra, int ask, int server_asks, int n, int *path)
{
    int ready[2], stop[2];
    if (pipe(ready) || pipe(stop)) exit(2);
    snprintf(devdir, sizeof devdir, "%s/dev", t_dir);
    cleanup_devdir();
    roster("srv", 0, "preemptive");
    roster("sp", 1, strstr(extra, "colocation=shared") ? "shared" : "preemptive");
    fflush(NULL);
    pid_t srv = fork();
    if (srv == 0) {
        close(ready[0]);
        close(stop[1]);
        serve_a_backlog(ready[1], stop[0], server_asks);
    }
    close(ready[1]); /* a server that dies before it is up: EOF, not a hang */
    close(stop[0]);
    char c;
    CHECK(read(ready[0], &c, 1) == 1, "the server came up");
    close(ready[0]);
    if (ask) setenv("GPUSLICE_SPATIAL_YIELD", "1", 1);
    else unsetenv("GPUSLICE_SPATIAL_YIELD");
    slice_c(0, extra);
    up(0);
    double longest = 0;
    for (int i = 0; i < n && longest < 1.0; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CHECK_EQ(cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double t = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
        if (t > longest) longest = t;
        usleep(2000);
    }
    *path = pacer_path();
    if (write(stop[1], "s", 1) != 1) exit(2);
    close(stop[1]);
    int st = 0;
    waitpid(srv, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server's checks (status 0x%x)", st);
    return longest;
}

static void h_low_holds_for_the_server(void) /* both asked: held while the server is queued */
{
    int path;
    double t = longest_beside_a_backlog("engine=spatial\npriority=1\n", 1, 1, 2000, &path);
    /* held until the cap (GS_CTL_YIELD_HOLD_MAX, 2 s: a forged backlog holds nobody longer), then let go */
    CHECK(t >= 1.0 && t < 6.0, "a launch beside the server's backlog was held %.3f s, expected the 2 s cap", t);
    CHECK(path == GS_DS_PATH_YIELD, "path %d, expected yield", path);
}
static void h_low_shared_does_not(void) /* shared: nobody yields, and no pacer at all, asked or not */
{
    int path;
    double t = longest_beside_a_backlog("engine=spatial\npriority=1\ncolocation=shared\n", 1, 1, 100, &path);
    CHECK(t < 1.0, "a shared slice's launch was held %.3f s", t);
    CHECK(path == -1, "path %d, expected no pacer", path);
}
static void h_low_not_asking_does_not(void) /* the server cannot turn the gate on for a trainer */
{
    int path;
    double t = longest_beside_a_backlog("engine=spatial\npriority=1\n", 0, 1, 100, &path);
    CHECK(t < 1.0, "a trainer that did not ask was held %.3f s", t);
    CHECK(path == -1, "path %d, expected no pacer", path);
}
static void h_server_not_asking_holds_nobody(void) /* a trainer cannot make a server record drains */
{
    int path;
    double t = longest_beside_a_backlog("engine=spatial\npriority=1\n", 1, 0, 100, &path);
    CHECK(t < 1.0, "a trainer beside a server that did not ask was held %.3f s", t);
    CHECK(path == GS_DS_PATH_LIGHT, "path %d, expected light (no neighbour in the records to yield to)", path);
}

static void s_yielding_client_holds_while_the_server_is_queued(void)
{
    CASE(h_low_holds_for_the_server);
    CASE(h_low_shared_does_not);
    CASE(h_low_not_asking_does_not);
    CASE(h_server_not_asking_holds_nobody);
    cleanup_devdir();
}

static void s_spatial_of_two_devices_refuses(void)
{
    t_slice("engine=spatial\nmemory_limit=1g\n"); /* devices 0 and 1 */
    CHECK_EQ(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_spatial_sets_the_client_and_is_not_paced);
    SCENARIO(s_spatial_yield_gate_is_not_paced_to_the_share);
    SCENARIO(s_high_priority_not_asking_runs_no_pacer);
    SCENARIO(s_spatial_yield_gate_that_cannot_start_refuses_nothing);
    SCENARIO(s_env_may_only_lower_the_mps_limits);
    SCENARIO(s_env_cannot_raise_the_mps_limits);
    SCENARIO(s_low_priority_is_a_below_normal_client);
    SCENARIO(s_yielding_client_is_capped_beside_a_high_priority_slice);
    SCENARIO(s_yielding_client_holds_while_the_server_is_queued);
    SCENARIO(s_timeslice_is_paced_and_leaves_mps_alone);
    SCENARIO(s_spatial_of_two_devices_refuses);
    fprintf(stderr, "test_enforcer_spatial%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
