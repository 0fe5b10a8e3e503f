"""GPU workloads for the compute benchmark; each records its own progress, never the enforcer's.

kinds:
  matmul   loops of 100 bf16 4096x4096 matmuls, then a synchronize (progress unit: one matmul)
  resnet   torchvision ResNet-50 training step, batch 128, bf16 autocast, random data (unit: step);
           batch 128 keeps the GPU busy (~95 %) so the share is limited by the enforcer, not the CPU
  mlp      the launch-heavy training loop of bench/enforcer_overhead_train.py (12 x Linear 1024 +
           LayerNorm + GELU, AdamW, batch 256; ~4 ms a step, hundreds of small kernels): where a
           per-launch cost of the enforcer would show first (unit: step; synchronize every 20)
  infer    ResNet-18 inference, batch 8, fp16, one request at a time with 2 ms think time; records
           per-request latency (the high-priority "online" loop)

Phases: --schedule "50:5,30:5" runs 5 s at share 50 then 5 s at share 30. The share is set live in
the device's roster (gpuslice.enforcer.policy.set_share) when the process runs under the enforcer
with a paced slice; "x" leaves it alone. All processes of a group start their first phase together
through a file barrier (--barrier DIR --peers N), after their warm-up.

Output: one JSON file (--out) with the phases, the (time, cumulative units) progress samples taken
at every synchronize, latencies (infer) and the enforcer's own achieved-share readings once a second
(for comparison only: the benchmark's numbers come from progress).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def parse_schedule(s: str) -> list[tuple[str, float]]:
    out = []
    for part in s.split(","):
        share, secs = part.split(":")
        out.append((share, float(secs)))
    return out


def barrier(d: str | None, peers: int) -> float:
    """Wait until `peers` processes are ready; all return the same start time."""
    if not d:
        return time.time() + 0.2
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True)
    tmp = p / f".ready.{os.getpid()}"
    tmp.write_text(str(time.time()))
    tmp.rename(p / f"ready.{os.getpid()}")  # atomic: a peer never reads a half-written time
    deadline = time.time() + 120
    while True:
        files = list(p.glob("ready.*"))
        if len(files) >= peers:
            return max(float(f.read_text() or 0) for f in files) + 0.5
        if time.time() > deadline:
            sys.exit(f"barrier {d}: only {len(files)} of {peers} peers")
        time.sleep(0.02)


def enforcer_view(state_dir: str | None, grant: str | None) -> list:
    """[achieved, set, rate, throttled] as the enforcer publishes them (None when unknown)."""
    if not state_dir or not grant:
        return [None] * 4
    try:
        from gpuslice.enforcer import devstate as compute

        for dev in compute.read_all(state_dir):
            for s in dev.slices:
                if s.grant == grant:
                    return [s.achieved_share, s.set_share, s.rate, s.throttled_share]
    except Exception:  # the benchmark must not die on a reader problem; the fields stay empty
        return [None] * 4
    return [None] * 4


def set_share(state_dir: str | None, grant: str | None, share: str) -> None:
    """A live share through the device's roster (``gpuslice.enforcer.policy.set_share``), as a resize does: the
    pacers take every slice's policy from there, never from the slices' own record files (issue 15)."""
    if share == "x" or not state_dir or not grant:
        return
    from gpuslice.enforcer import policy
    from gpuslice.enforcer.slicefile import read_slice_file

    slice_file = os.environ.get("GPUSLICE_SLICE")
    config = read_slice_file(slice_file) if slice_file else None
    if config is None or config.grant != grant or not policy.set_share(state_dir, config, int(float(share))):
        print(f"workload: grant {grant} has no slice file or no slice records folder in {state_dir}; share {share} "
              "not applied", file=sys.stderr)


def clear_share(state_dir: str | None, grant: str | None) -> None:
    """Take this workload's roster entries off again, and a roster it leaves empty: the next scenario's processes
    in the same state folder must not find a roster that lists none of them (they would all count as low
    priority to each other)."""
    if not state_dir or not grant:
        return
    from gpuslice.enforcer import policy

    policy.remove_policies(state_dir, grant)
    for folder in Path(state_dir).glob(f"*{policy.SUFFIX}"):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty (another workload's entry), or gone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["matmul", "resnet", "infer", "mlp"], required=True)
    ap.add_argument("--schedule", default="x:5")
    ap.add_argument("--out", required=True)
    ap.add_argument("--barrier")
    ap.add_argument("--peers", type=int, default=1)
    ap.add_argument("--state-dir")
    ap.add_argument("--grant")
    ap.add_argument("--delay", type=float, default=0.0, help="idle this long after the barrier before working")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--gate", help="wait for this file before touching the GPU (imports overlap the previous group)")
    a = ap.parse_args()
    import torch  # here, not at the top: dry_workload.py borrows this module's helpers on a CPU

    if a.kind not in ("matmul", "mlp"):
        import torchvision  # noqa: F401  (import before the gate: it is the slow part)
    if a.gate:
        while not os.path.exists(a.gate):
            time.sleep(0.01)

    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.kind == "matmul":
        x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        y = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(x)

        def step() -> int:
            for _ in range(100):
                torch.mm(x, y, out=out)
            torch.cuda.synchronize()
            return 100
    elif a.kind == "mlp":
        torch.manual_seed(0)
        layers: list = []
        for _ in range(12):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.LayerNorm(1024), torch.nn.GELU()]
        mlp = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10)).to(dev)
        mopt = torch.optim.AdamW(mlp.parameters(), lr=1e-4)
        mx = torch.randn(256, 1024, device=dev)
        my = torch.randint(0, 10, (256,), device=dev)
        mlossf = torch.nn.CrossEntropyLoss()

        def step() -> int:
            for _ in range(20):
                mopt.zero_grad(set_to_none=True)
                mlossf(mlp(mx), my).backward()
                mopt.step()
            torch.cuda.synchronize()
            return 20
    elif a.kind == "resnet":
        import torchvision

        model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        data = torch.randn(128, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        target = torch.randint(0, 1000, (128,), device=dev)
        lossf = torch.nn.CrossEntropyLoss()

        def step() -> int:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = lossf(model(data), target)
            loss.backward()
            opt.step()
            loss.item()  # the usual per-step sync of a training loop
            return 1
    else:
        import torchvision

        model = torchvision.models.resnet18().to(dev).half().eval().to(memory_format=torch.channels_last)
        data = torch.randn(8, 3, 224, 224, device=dev).half().to(memory_format=torch.channels_last)

        def step() -> int:
            with torch.no_grad():
                model(data)
            torch.cuda.synchronize()
            return 1

    t_end = time.time() + a.warmup
    while time.time() < t_end:
        step()
    sched = parse_schedule(a.schedule)
    t0 = barrier(a.barrier, a.peers)
    while time.time() < t0:
        time.sleep(0.001)
    if a.delay:
        time.sleep(a.delay)
    start = time.time()
    phases, progress, lat, view = [], [[start, 0]], [], []
    units = 0
    next_view = start + 1.0
    try:
        for share, secs in sched:
            set_share(a.state_dir, a.grant, share)
            p0 = time.time()
            while time.time() - p0 < secs:
                s0 = time.time()
                units += step()
                s1 = time.time()
                progress.append([s1, units])
                if a.kind == "infer":
                    lat.append([s0, s1 - s0])
                    time.sleep(0.002)
                if s1 >= next_view:
                    view.append([s1, *enforcer_view(a.state_dir, a.grant)])
                    next_view += 1.0
            phases.append({"share": share, "t0": p0, "t1": time.time()})
    finally:
        clear_share(a.state_dir, a.grant)
    res = {"kind": a.kind, "pid": os.getpid(), "grant": a.grant, "start": start, "phases": phases,
           "progress": progress, "latency": lat, "enforcer_view": view,
           "preloaded": "libgpuslice" in os.environ.get("LD_PRELOAD", ""),
           "mps_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    Path(a.out).write_text(json.dumps(res))


if __name__ == "__main__":
    main()
