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
                                                   service's share of the device's time (rate x this)
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

    def step() -> None:
        with torch.inference_mode():
            model(x)
        torch.cuda.synchronize()

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

    def step() -> None:
        for k in range(20):
            if launch(None, 1 + k, 1, 1, 1, 1, 1, 0, None, None, None):
                raise SystemExit("packing_worker: a launch failed")
            t = time.perf_counter() + 50e-6
            while time.perf_counter() < t:
                pass

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
    return {"gpu_s_per_iter": a.elapsed_time(b) / 1000.0 / n, "how": how}


def serve(step, t0: float, tm: float, t1: float) -> dict:
    while time.time() < t0:
        time.sleep(0.0005)
    n, lat = 0, []
    while True:
        s = time.time()
        if s >= t1:
            break
        step()
        e = time.time()
        if e >= tm and e <= t1:
            n += 1
            lat.append(e - s)
    lat.sort()
    pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None)
    return {"iters": n, "p50_s": pick(0.5), "p99_s": pick(0.99)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=30)
    a = ap.parse_args()
    step, forward = build(a.kind, a.batch)
    for _ in range(a.warmup):
        step()
    print(json.dumps({"ready": os.getpid(), "kind": a.kind}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if "quit" in msg:
            break
        if "run" in msg:
            out = serve(step, *msg["run"])
        elif "calibrate" in msg:
            out = calibrate(forward, int(msg["calibrate"]))
        else:
            out = {"error": f"unknown message {sorted(msg)}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
