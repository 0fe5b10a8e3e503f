/* CUDA graph memory: the memory an executable graph's memory nodes take (the double: GSDOUBLE_GRAPH_BYTES,
 * backed at upload or first launch, kept after the graph is destroyed until cuDeviceGraphMemTrim) is
 * counted in the slice when the driver backs it and given back when the driver does; counted even past
 * the limit (the driver already holds it), after which the slice's allocations are refused. Also run
 * with the enforcer LD_PRELOADed. */
#include "enforcer_api.h"

CUresult cuGraphInstantiateWithFlags(CUgraphExec *, void *, unsigned long long);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuDeviceGraphMemTrim(CUdevice);

#define GRAPH (256 * MiB)

/* A 1 GiB slice whose graphs take GRAPH each when backed. */
static void graph_slice(void)
{
    setenv("GSDOUBLE_GRAPH_BYTES", "268435456", 1);
    t_slice("memory_limit=1g\ncontext_overhead=%llu\n", CTX);
    up(0);
}

static void s_upload_counts_trim_gives_back(void)
{
    graph_slice();
    CUgraphExec g;
    CHECK_EQ(cuGraphInstantiateWithFlags(&g, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX); /* instantiated, not backed yet */
    CHECK_EQ(cuGraphUpload(g, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + GRAPH);
    CHECK_EQ(cuGraphLaunch(g, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(g, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + GRAPH); /* launches reuse what was backed */
    CHECK_EQ(cuGraphExecDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + GRAPH); /* the driver keeps it for the next graph */
    CHECK_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
}

static void s_first_launch_counts(void)
{
    graph_slice();
    CUgraphExec a, b;
    CHECK_EQ(cuGraphInstantiateWithFlags(&a, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(cuGraphInstantiateWithFlags(&b, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(b, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 2 * GRAPH);
    size_t f, t;
    CHECK_EQ(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    CHECK_EQ(f, 1024 * MiB - CTX - 2 * GRAPH); /* the slice's programs see it taken */
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1024 * MiB - CTX - 2 * GRAPH + 1), CUDA_ERROR_OUT_OF_MEMORY);
}

/* A graph launched into another graph being captured is a node of that graph: its own first run, which backs its
 * memory, is still to come and is counted when it comes. */
extern void *gsdouble_capture_stream;
extern __thread unsigned long gsdouble_capture_calls; /* this thread's (the double's comment) */
CUresult cuStreamEndCapture(CUstream, CUgraph *);
static void s_launch_into_a_capture_is_not_the_first_run(void)
{
    graph_slice();
    CUgraphExec a;
    CUstream cap = (CUstream)0x5150;
    CHECK_EQ(cuGraphInstantiateWithFlags(&a, NULL, 0), CUDA_SUCCESS);
    unsigned long r0 = gsdouble_capture_calls;
    gsdouble_capture_stream = cap;
    CHECK_EQ(cuGraphLaunch(a, cap), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "no question to the driver inside the capture (%lu)", gsdouble_capture_calls - r0);
    CUgraph graph = NULL;
    CHECK_EQ(cuStreamEndCapture(cap, &graph), CUDA_SUCCESS);
    CHECK(gsdouble_capture_calls == r0, "the catch-up asks only once the capture ended (%lu)", gsdouble_capture_calls - r0);
    CHECK_EQ(t_used(0), CTX); /* nothing backed yet */
    CHECK_EQ(cuGraphLaunch(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + GRAPH); /* its first run backs and is counted */
    CHECK_EQ(cuGraphExecDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
}

/* A trim gives a live graph's idle memory back too, and the driver backs it again at the graph's next launch:
 * that launch is read as a first one (a launch, a trim and a launch again held it uncounted before). */
static void s_launch_after_a_trim_is_counted_again(void)
{
    graph_slice();
    CUgraphExec a;
    CHECK_EQ(cuGraphInstantiateWithFlags(&a, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + GRAPH);
    CHECK_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX);
    CHECK_EQ(gsdouble_used(0), 0);
    CHECK_EQ(cuGraphLaunch(a, NULL), CUDA_SUCCESS);
    CHECK_EQ(gsdouble_used(0), GRAPH);
    CHECK_EQ(t_used(0), CTX + GRAPH);
    CHECK_EQ(cuGraphExecDestroy(a), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
}

/* Past the limit: counted all the same (the books say what the device holds); allocations refused. */
static void s_graph_memory_past_the_limit_is_counted(void)
{
    setenv("GSDOUBLE_GRAPH_BYTES", "805306368", 1); /* 768 MiB */
    t_slice("memory_limit=512m\ncontext_overhead=%llu\n", CTX);
    up(0);
    CUgraphExec g;
    CHECK_EQ(cuGraphInstantiateWithFlags(&g, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(cuGraphUpload(g, NULL), CUDA_SUCCESS);
    CHECK_EQ(t_used(0), CTX + 768 * MiB);
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc_v2(&p, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(cuGraphExecDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc_v2(&p, 512 * MiB - CTX), CUDA_SUCCESS);
}

int main(void)
{
    setvbuf(stderr, NULL, _IOLBF, 0);
    setenv("GPUSLICE_LOG_LEVEL", "error", 1);
    SCENARIO(s_upload_counts_trim_gives_back);
    SCENARIO(s_first_launch_counts);
    SCENARIO(s_graph_memory_past_the_limit_is_counted);
    SCENARIO(s_launch_into_a_capture_is_not_the_first_run);
    SCENARIO(s_launch_after_a_trim_is_counted_again);
    fprintf(stderr, "test_enforcer_graph%s: %d scenarios checked, %d failed\n", getenv("GS_TEST_PRELOAD") ? " (LD_PRELOAD)" : "",
            t_checks, t_failures);
    return t_failures ? 1 : 0;
}
