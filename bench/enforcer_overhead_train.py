"""PyTorch training-loop throughput for the enforcer-overhead comparison (run with and without the
enforcer by bench/gpu/mem_acceptance.py). A launch-heavy model on purpose: many small kernels per
step is where a per-launch hook would show. Prints one JSON line: {"steps_per_s": ..., "steps": ...}.

    python3 enforcer_overhead_train.py [--seconds 8] [--width 1024] [--layers 12] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.LayerNorm(a.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.width, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a.batch, a.width, device="cuda")
    y = torch.randint(0, 10, (a.batch,), device="cuda")
    lossf = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(30):  # warm-up: cuBLAS handles, allocator, kernels loaded
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        for _ in range(20):
            step()
        n += 20
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"steps_per_s": n / dt, "steps": n, "seconds": dt}))


if __name__ == "__main__":
    main()
