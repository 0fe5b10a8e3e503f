"""What a pair of CUDA events adds to the kernel between them, on a queue the GPU is busy with (issue 12).

The pacer charges a measured launch the time between an event recorded before it and one after it. The
packing benchmark found the smallest such pair of each ResNet-50 kernel about 1.7 us above the kernel's
share of the same request queued eagerly (6.4-6.6 us a pair against 4.7 us a launch), whatever the
cost model's band. This program takes the CPU out of it: a spin kernel holds the stream while everything
below is queued behind it, so no record waits for the CPU, and it reports, per kernel size:
  back_to_back_us   (E1 - E0) / n for n kernels between two events: the kernel's marginal cost
  pair_us           Ee - Es around one kernel, n such pairs queued one after another
  empty_us          Eb - Ea, two events with nothing between, queued
  pair_minus_marginal_us: what a pair adds: the figure the pacer must take off each pair

  python3 bench/gpu/event_overhead.py [--n 400]      (CuPy; one JSON line per size, then a summary)
"""

from __future__ import annotations

import argparse
import json
import statistics

SRC = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void tiny(int *x) { if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(x, 1); }
"""


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    a = ap.parse_args()
    mod = cp.RawModule(code=SRC)
    spin, tiny = mod.get_function("spin"), mod.get_function("tiny")
    x = cp.zeros(1, dtype=cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    clock = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1e3  # Hz
    sizes = {"tiny": None, "spin 2us": 2e-6, "spin 5us": 5e-6, "spin 20us": 20e-6}

    def launch(kind):
        if sizes[kind] is None:
            tiny((1,), (32,), (x,), stream=s)
        else:
            spin((1,), (32,), (cp.int64(int(sizes[kind] * clock)),), stream=s)

    def hold():  # everything after this is queued before the GPU reaches it
        spin((1,), (32,), (cp.int64(int(0.02 * clock)),), stream=s)

    def ev():
        e = cp.cuda.Event()
        e.record(s)
        return e

    out = {}
    for kind in sizes:
        for _ in range(3):
            launch(kind)
        s.synchronize()
        hold()
        e0 = ev()
        for _ in range(a.n):
            launch(kind)
        e1 = ev()
        e1.synchronize()
        marginal = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.n
        hold()
        trip = []
        for _ in range(a.n):
            ea, eb = ev(), ev()
            launch(kind)
            ec = ev()
            trip.append((ea, eb, ec))
        trip[-1][2].synchronize()
        empty = [cp.cuda.get_elapsed_time(p, q) * 1e3 for p, q, _ in trip]
        pair = [cp.cuda.get_elapsed_time(q, r) * 1e3 for _, q, r in trip]
        rec = {"kind": kind, "back_to_back_us": marginal, "pair_us": statistics.median(pair),
               "pair_min_us": min(pair), "empty_us": statistics.median(empty), "empty_min_us": min(empty)}
        rec["pair_minus_marginal_us"] = rec["pair_us"] - marginal
        out[kind] = rec
        print(json.dumps(rec), flush=True)
    print("kernel | back to back us | pair us (min) | empty pair us (min) | pair - back to back us")
    for k, r in out.items():
        print(f"{k} | {r['back_to_back_us']:.2f} | {r['pair_us']:.2f} ({r['pair_min_us']:.2f}) | "
              f"{r['empty_us']:.2f} ({r['empty_min_us']:.2f}) | {r['pair_minus_marginal_us']:.2f}")


if __name__ == "__main__":
    main()
