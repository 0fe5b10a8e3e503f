/* The spatial engine in the process: before the driver starts, a spatial slice's MPS client settings
 * are the slice's (pipe directory, compute share as active-thread percentage, memory limit as pinned
 * limit, a low-priority preemptive slice as a below-normal client, and such a slice with no share of its
 * own capped at GS_MPS_YIELD_THREADS when the device's roster lists a high-priority preemptive slice at
 * its start), the environment may only lower the
 * threads, the limit and the priority, launches are not paced (no pacing file is ever
 * opened), and memory is accounted and refused exactly as for a time-sliced slice. A time-sliced
 * slice with the same share does open its pacing file (the control case) and touches no MPS variable.
 * Also run with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <dirent.h>
#include <sys/stat.h>
#include "gpuslice/devstate.h"
#include "gpuslice/mps.h"

static char devdir[300];

/* A slice of device 0 alone with this compute share, its pacing files under devdir, with extra key=value
 * lines. */
static void slice_c(int compute, const char *extra)
{
    char path[320], u0[64];
    t_uuid(0, u0);
    snprintf(devdir, sizeof devdir, "%s/dev", t_dir);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=sp\ndevices=%s\nregion=%s\ndevice_state_dir=%s\nmemory_limit=1g\n"
               "context_overhead=%llu\ncompute=%d\nmode=hard\n%s", u0, t_region, devdir, CTX, compute, extra);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
}

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
    CHECK_EQ(pacing_files(), 0); /* the pacer never joined the device */
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
    cleanup_devdir();
    CHECK(!strcmp(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "(unset)"), "threads %s", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CHECK(!strcmp(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "(unset)"), "pinned %s", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
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
    SCENARIO(s_env_may_only_lower_the_mps_limits);
    SCENARIO(s_env_cannot_raise_the_mps_limits);
    SCENARIO(s_low_priority_is_a_below_normal_client);
    SCENARIO(s_yielding_client_is_capped_beside_a_high_priority_slice);
    SCENARIO(s_timeslice_is_paced_and_leaves_mps_alone);
    SCENARIO(s_spatial_of_two_devices_refuses);
    fprintf(stderr, "test_enforcer_spatial%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
