/* The spatial engine in the process: before the driver starts, a spatial slice's MPS client settings
 * are the slice's (pipe directory, compute share as active-thread percentage, memory limit as pinned
 * limit, a low-priority preemptive slice as a below-normal client), the environment may only lower the
 * threads, the limit and the priority, launches are not paced (no pacing file is ever
 * opened), and memory is accounted and refused exactly as for a time-sliced slice. A time-sliced
 * slice with the same share does open its pacing file (the control case) and touches no MPS variable.
 * Also run with the enforcer LD_PRELOADed (GS_TEST_PRELOAD=1). */
#include "enforcer_api.h"

#include <dirent.h>
#include "gpuslice/devstate.h"

static char devdir[300];

/* A slice of device 0 alone, its pacing files under devdir, with extra key=value lines. */
static void slice1(const char *extra)
{
    char path[320], u0[64];
    t_uuid(0, u0);
    snprintf(devdir, sizeof devdir, "%s/dev", t_dir);
    snprintf(path, sizeof path, "%s/slice.conf", t_dir);
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    fprintf(f, "version=1\ngrant=sp\ndevices=%s\nregion=%s\ndevice_state_dir=%s\nmemory_limit=1g\n"
               "context_overhead=%llu\ncompute=25\nmode=hard\n%s", u0, t_region, devdir, CTX, extra);
    fclose(f);
    setenv("GPUSLICE_SLICE", path, 1);
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

static void s_low_priority_is_a_below_normal_client(void)
{
    setenv("CUDA_MPS_CLIENT_PRIORITY", "0", 1); /* a low-priority tenant asking to be normal */
    slice1("engine=spatial\npriority=1\n");
    up(0);
    CHECK(!strcmp(env("CUDA_MPS_CLIENT_PRIORITY"), "1"), "low, preemptive: priority %s", env("CUDA_MPS_CLIENT_PRIORITY"));
    unsetenv("CUDA_MPS_CLIENT_PRIORITY");
    slice1("engine=spatial\npriority=0\n");
    up(0);
    CHECK(!strcmp(env("CUDA_MPS_CLIENT_PRIORITY"), "(unset)"), "high: priority %s", env("CUDA_MPS_CLIENT_PRIORITY"));
    setenv("CUDA_MPS_CLIENT_PRIORITY", "1", 1); /* a high-priority slice may lower itself */
    slice1("engine=spatial\npriority=0\n");
    up(0);
    CHECK(!strcmp(env("CUDA_MPS_CLIENT_PRIORITY"), "1"), "high, lowered by its env: priority %s", env("CUDA_MPS_CLIENT_PRIORITY"));
    unsetenv("CUDA_MPS_CLIENT_PRIORITY");
    slice1("engine=spatial\npriority=1\ncolocation=shared\n"); /* shared: nobody yields */
    up(0);
    CHECK(!strcmp(env("CUDA_MPS_CLIENT_PRIORITY"), "(unset)"), "low, shared: priority %s", env("CUDA_MPS_CLIENT_PRIORITY"));
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
    SCENARIO(s_timeslice_is_paced_and_leaves_mps_alone);
    SCENARIO(s_spatial_of_two_devices_refuses);
    fprintf(stderr, "test_enforcer_spatial%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
