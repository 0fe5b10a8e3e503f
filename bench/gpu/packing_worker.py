"""One inference service of the packing benchmark (bench/gpu/packing.py drives it over stdin/stdout).

A launch-bound loop, as a packed inference service is: one request at a time, batch 8, fp16, random
weights and inputs (no network), ``model(x)`` then ``torch.cuda.synchronize()``. Kinds:
  resnet50  torchvision ResNet-50, 8 x 3 x 224 x 224, channels-last (~160 kernels a request)
  encoder   a 6-layer transformer encoder, d_model 512, 8 heads, 8 sequences of 128 tokens
  fake      no GPU: sleeps 2 ms a request (the orchestration's dry run on a CPU)
  double    no GPU: 20 launches a request through the CUDA driver found as libcuda.so.1 (the CPU double of
            native/tests/double in the tests, so the enforcer's hooks and pacer really run), 50 us of CPU
            between them

Protocol, one JSON object per line each way:
  -> (start)                                   <- {"ready": pid, "kind": ...} after loading and warming up
  -> {"run": [t0, t_measure, t1]}               waits until t0 (time.time()), serves requests until t1,
                                                <- {"iters": requests completed in [t_measure, t1], ...}
  -> {"calibrate": n}                           <- {"gpu_s_per_iter": ...}: the model's GPU time per request,
                                                   from n replays of a CUDA graph of it (no CPU gaps), taken
                                                   while nothing else runs: the benchmark's ruler for each
                                                   service's share of the device's time (rate x this); and
                                                   "eager_s_per_iter": one request launched eagerly but
                                                   queued whole before it runs (eager_queued)
  a run's answer also holds "launch_p50_s": the CPU time a request's launches took (median), and under
  gpuslice "pacer": what the enforcer's charge counters (gpuslice_pacer_stats) gained over the measured span
  -> {"quit": 1}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build(kind: str, batch: int):
    """(step, graph_step_or_None): step() serves one request and waits for it."""
    if kind == "fake":
        return (lambda: time.sleep(0.002)), None
    if kind == "double":
        return double_step(), None
    import torch

    torch.backends.cudnn.benchmark = False  # no autotuning storm when many services start at once
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if kind == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(dev).half().eval().to(memory_format=torch.channels_last)
        x = torch.randn(batch, 3, 224, 224, device=dev).half().to(memory_format=torch.channels_last)
    elif kind == "encoder":
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(dev).half().eval()
        x = torch.randn(batch, 128, 512, device=dev).half()
    else:
        raise SystemExit(f"packing_worker: kind {kind!r} is not known (resnet50, encoder, fake)")

    def step() -> float:
        """Serve one request; returns the CPU time its launches took (before the wait for the GPU):
        what the enforcer's launch path costs shows here, the GPU's share in the wait."""
        t = time.perf_counter()
        with torch.inference_mode():
            model(x)
        t = time.perf_counter() - t
        torch.cuda.synchronize()
        return t

    def forward() -> None:
        with torch.inference_mode():
            model(x)

    return step, forward


def double_launcher():
    """cuLaunchKernel of libcuda.so.1 (the CPU driver double on a dry run's library path) in a current
    context: launch(None, gridX, 1, 1, 1, 1, 1, 0, None, None, None) -> CUresult. Also coloc_worker's."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    if cu.cuInit(0) or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) or cu.cuCtxSetCurrent(ctx):
        raise SystemExit("the driver gave no context")
    launch = cu.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    return launch


def double_step():
    launch = double_launcher()

    def step() -> float:
        t0 = time.perf_counter()
        for k in range(20):
            if launch(None, 1 + k, 1, 1, 1, 1, 1, 0, None, None, None):
                raise SystemExit("packing_worker: a launch failed")
            t = time.perf_counter() + 50e-6
            while time.perf_counter() < t:
                pass
        return time.perf_counter() - t0  # all of it is launching: no GPU to wait for

    return step


def calibrate(forward, n: int) -> dict:
    """GPU time per request: a CUDA graph of one forward, replayed n times back to back."""
    if forward is None:
        return {"gpu_s_per_iter": 0.0008, "how": "fake"}
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(s)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward()
        run = g.replay
        how = "cuda graph"
    except Exception as exc:  # a model the graph cannot hold: back-to-back eager (CPU-bound: an upper bound)
        run, how = forward, f"eager back to back ({type(exc).__name__})"
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        run()
    b.record()
    b.synchronize()
    return {"gpu_s_per_iter": a.elapsed_time(b) / 1000.0 / n, "how": how, **eager_queued(forward)}


def eager_queued(forward, n: int = 20) -> dict:
    """The second ruler: one request launched eagerly (as the services do) while the GPU is held by a
    spin kernel long enough that every kernel is queued before the first runs, timed by events around
    the request alone. It holds what eager launches cost the GPU (a kernel's own front-end work, which
    the graph saves) but no CPU gap: what the pacer should charge a request. Median of n."""
    import statistics

    import torch

    if not hasattr(torch.cuda, "_sleep"):
        return {"eager_s_per_iter": None, "eager_how": "no torch.cuda._sleep"}
    torch.cuda.synchronize()
    t = time.perf_counter()
    forward()
    cpu = time.perf_counter() - t
    torch.cuda.synchronize()
    cycles = int(max(0.005, 3 * cpu) * 2.0e9)  # 3x the launch time at up to 2 GHz
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        torch.cuda._sleep(cycles)
        a.record()
        forward()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    return {"eager_s_per_iter": statistics.median(times), "eager_launch_cpu_s": cpu,
            "eager_how": f"eager, queued behind a {cycles / 2e9 * 1e3:.0f}-ms spin, median of {n}"}


def pacer_stats():
    """A reader of the preloaded enforcer's charge counters on device 0 (gpuslice_pacer_stats), or None
    when gpuslice is not preloaded or paces nothing: returns a function giving the counters as a dict."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).gpuslice_pacer_stats
    except AttributeError:
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
    buf = ctypes.create_string_buffer(1024)

    def read() -> dict | None:
        n = fn(0, buf, len(buf))
        return json.loads(buf.value) if 0 < n < len(buf) else None

    return read


def counters_since(before: dict | None, after: dict | None) -> dict | None:
    """What the counters gained over a measured phase (path, mean cost and pair bias: their values at its end)."""
    if not after:
        return None
    before = before or {}
    return {k: (v if k in ("path", "cost_avg_ns", "pair_bias_ns") else v - before.get(k, 0)) for k, v in after.items()}


def serve(step, t0: float, tm: float, t1: float, stats=None) -> dict:
    while time.time() < t0:
        time.sleep(0.0005)
    c0 = before = None
    n, lat, cpu = 0, [], []
    while True:
        if stats and c0 is None:
            # the counters as they were before this request: should it be the first counted one, its own
            # launches belong to the span (read after it, a run could count one request more than its
            # counters held: 7760 launches for 389 requests of 20 on a loaded CI box)
            before = stats() or {}
        s = time.time()
        if s >= t1:
            break
        c = step()
        e = time.time()
        if stats and c0 is None and e >= tm:
            c0 = before
        if e >= tm and e <= t1:
            n += 1
            lat.append(e - s)
            if c is not None:
                cpu.append(c)
    lat.sort()
    cpu.sort()
    pick = (lambda v, q: v[min(len(v) - 1, int(q * len(v)))] if v else None)
    out = {"iters": n, "p50_s": pick(lat, 0.5), "p99_s": pick(lat, 0.99), "launch_p50_s": pick(cpu, 0.5)}
    if stats:
        # from the start of the first request that ended in the measured span: its n requests and at most
        # one more (the request under way at t1)
        out["pacer"] = counters_since(c0, stats())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=30)
    a = ap.parse_args()
    step, forward = build(a.kind, a.batch)
    for _ in range(a.warmup):
        step()
    stats = pacer_stats()
    print(json.dumps({"ready": os.getpid(), "kind": a.kind}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if "quit" in msg:
            break
        if "run" in msg:
            out = serve(step, *msg["run"], stats=stats)
        elif "calibrate" in msg:
            out = calibrate(forward, int(msg["calibrate"]))
        else:
            out = {"error": f"unknown message {sorted(msg)}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
