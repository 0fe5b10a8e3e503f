"""One service (or trainer) of bench/gpu/spatial.sh: random weights, no network, fp16.

Models: ``resnet50`` (ResNet-50 inference, batch 8, 224x224), ``encoder`` (a 6-layer transformer encoder,
d_model 512, 8 heads, batch 8 x 128 tokens), ``train`` (ResNet-50 training step, batch 32, SGD + autocast).
Protocol with the runner (bench/gpu/spatial_bench.py):
  1. build the model, warm up (cudnn autotuning included), write ``<ready>`` (the SM count this process
     sees: under MPS with an active-thread percentage it is the client's share of the SMs);
  2. wait for ``<go>`` (it holds the start time t0 of the measured window);
  3. run requests back to back (each one a forward pass and a synchronize: its latency), count those that
     end inside [t0, t0 + window], keep running until t0 + window + tail so neighbours stay loaded;
  4. write ``--out`` (JSON) and exit 0. A CUDA error ends it with exit 3 and the error in the JSON.
``--serve S``: the fault experiment's mode: no window; run S seconds, appending a line per 0.2 s to
``--events`` (``{"t": time, "ok": requests so far}``) and one line for the first error.
``--fault illegal``: touch the GPU once, then launch a kernel that stores to address 8 (PTX, JIT-compiled
by the driver through ctypes: no compiler needed) and synchronize; the driver reports
CUDA_ERROR_ILLEGAL_ADDRESS (700) to this process; under MPS the fault reaches the server's other clients.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry gs_bad()
{
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  mov.u64 %rd1, 8;
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""


def illegal_address() -> int:
    """Launch a kernel that writes to address 8; the CUresult of the synchronize (700 expected)."""
    cu = ctypes.CDLL("libcuda.so.1")
    ctx, mod, fn, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)), ("cuCtxSetCurrent", (ctx,)),
                       ("cuModuleLoadData", (ctypes.byref(mod), ctypes.c_char_p(PTX))),
                       ("cuModuleGetFunction", (ctypes.byref(fn), mod, b"gs_bad"))):
        r = getattr(cu, call)(*args)
        if r != 0:
            return -r
    r = cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    return r if r != 0 else cu.cuCtxSynchronize()


def bottleneck(torch, nn, cin: int, mid: int, stride: int):
    cout = mid * 4
    down = None
    if stride != 1 or cin != cout:
        down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = down

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))
    return Block()


def resnet50(torch, nn):
    layers, cin = [], 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(bottleneck(torch, nn, cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


def build_dry(kind: str):
    """The bench's dry run on a machine without a GPU: a step that sleeps like a small model."""
    per = {"resnet50": 0.005, "encoder": 0.004, "train": 0.03}[kind]

    def step():
        time.sleep(per)
    return step, 32 if kind == "train" else 8


def build(kind: str):
    """(step function, items per step). Each step ends with a synchronize."""
    import torch
    import torch.nn as nn

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(dev).half().eval()
        x = torch.randn(8, 128, 512, device=dev, dtype=torch.half)

        def step():
            with torch.inference_mode():
                model(x)
            torch.cuda.synchronize()
        return step, 8
    net = resnet50(torch, nn).to(dev).to(memory_format=torch.channels_last)
    if kind == "train":
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(32, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (32,), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
        return step, 32
    net = net.half().eval()
    x = torch.randn(8, 3, 224, 224, device=dev, dtype=torch.half).to(memory_format=torch.channels_last)

    def step():
        with torch.inference_mode():
            net(x)
        torch.cuda.synchronize()
    return step, 8


def wait_file(path: Path, limit: float) -> str:
    deadline = time.time() + limit
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit:g} s")
        time.sleep(0.002)
    return path.read_text()


def measure(args, step, items) -> dict:
    t0 = float(wait_file(Path(args.go), 300).strip())
    end, stop = t0 + args.window, t0 + args.window + args.tail
    latencies, done = [], 0
    while time.time() < t0:
        step()  # keep busy until the window opens (neighbours start together)
    while True:
        a = time.time()
        step()
        b = time.time()
        if b > end:
            break
        if a >= t0:
            latencies.append(b - a)
            done += 1
    while time.time() < stop:
        step()
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else None
    return {"requests": done, "items_per_s": done * items / args.window, "p50_ms": p(0.50), "p99_ms": p(0.99)}


def serve(args, step, items) -> None:
    events = open(args.events, "a", buffering=1)
    start, ok, last = time.time(), 0, 0.0
    while time.time() - start < args.serve:
        try:
            step()
        except Exception as exc:  # the fault experiment: what reaches a neighbour of the faulting client
            events.write(json.dumps({"t": time.time(), "ok": ok, "error": str(exc)[:300]}) + "\n")
            raise SystemExit(3)
        ok += 1
        if time.time() - last >= 0.2:
            last = time.time()
            events.write(json.dumps({"t": last, "ok": ok}) + "\n")
    events.write(json.dumps({"t": time.time(), "ok": ok, "done": True}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("resnet50", "encoder", "train"), default="resnet50")
    ap.add_argument("--ready"), ap.add_argument("--go"), ap.add_argument("--out")
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--tail", type=float, default=0.5)
    ap.add_argument("--serve", type=float, default=0.0)
    ap.add_argument("--events")
    ap.add_argument("--fault", choices=("illegal",))
    ap.add_argument("--dry", action="store_true", help="no GPU: sleep instead of computing (tests the bench)")
    args = ap.parse_args()
    if args.fault:
        r = 700 if args.dry else illegal_address()
        print(json.dumps({"t": time.time(), "fault": args.fault, "cu_result": r}), flush=True)
        return 0 if r == 700 else 4
    result: dict = {"pid": os.getpid(), "model": args.model}
    try:
        step, items = build_dry(args.model) if args.dry else build(args.model)
        for _ in range(30):
            step()
        if not args.dry:
            import torch

            result["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
            result["free_total"] = list(torch.cuda.mem_get_info())
        if args.serve:
            if args.ready:
                Path(args.ready).write_text(json.dumps(result))
            serve(args, step, items)
            return 0
        Path(args.ready).write_text(json.dumps(result))
        result.update(measure(args, step, items))
        if not args.dry:
            result["max_reserved"] = torch.cuda.max_memory_reserved()
        code = 0
    except SystemExit:
        raise
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        code = 3
    if args.out:
        Path(args.out).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
