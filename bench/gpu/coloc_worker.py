"""One process of bench/gpu/coloc.sh: an online server of one kind, or the trainer beside it (fp16, random
weights, no network).

Servers (closed loop: a request, then ``--think`` seconds of idle time, then the next; a request's latency
is from its first launch to the end of its last synchronize):
  launch   launch-bound with idle gaps: ResNet-50 inference at batch 1 (~160 short kernels whose launches
           the CPU paces), 4 ms think
  gpu      GPU-bound batched: ResNet-50 inference at batch 32, 8 ms think
  decode   a decoder's loop of many tiny kernels: 32 tokens at batch 1, each a 6-block MLP stack of width
           1024 (~40 kernels of a few us) and an argmax read back to the CPU (a sync per token), 5 ms think
Trainer (``--kind train``, GS_COLOC_TRAINER=transformer, the default): a 6-layer transformer encoder (d 1024, 16
heads, ff 4096), batch 16 x 256 tokens, AdamW under autocast, ``loss.item()`` each step: alone it keeps an H100
busy (~97 %), but not its SMs: on the H200 capping it at 60 % of the SMs cost it 0-3 %
(2026-11-29-h200-coloc-trainer-cap.md). ``GS_COLOC_TRAIN_BATCH``
(16) sets its batch: 64 makes a trainer whose kernels fill the SMs, to measure what an SM cap costs one.
GS_COLOC_TRAINER=alu or hbm puts a synthetic neighbour in the trainer's place, loading one resource (arithmetic, or
memory bandwidth and the L2): which one a server beside the trainer waits for (:func:`build_alu`, :func:`build_hbm`).

Protocol with bench/gpu/coloc_bench.py (as spatial_worker.py's): build, warm up, calibrate (a server's GPU time
per request: CUDA graphs replayed back to back, packing_worker.calibrate), write ``--ready``; wait for ``--go``
(the window's start t0); run; count what ends inside [t0, t0 + window]; keep running ``--tail`` seconds more
so the neighbour stays loaded; write ``--out`` (JSON) and exit 0 (3 on a CUDA error, named in the JSON).
``--dry``: no GPU: sleeps shaped like the kinds (tests the bench's logic on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from packing_worker import pacer_stats  # noqa: E402 - beside this file

THINK = {"launch": 0.004, "gpu": 0.008, "decode": 0.005}
TOKENS = 32


def build_dry(kind: str):
    """(request, None, GPU s per request hint) for a CPU-only dry run: sleeps shaped like the kind, each step
    also one launch through the CPU driver double when GS_COLOC_DOUBLE=1 (coloc.sh --dry-run sets it), so a
    gpuslice process's pacer really runs and publishes its path in the device state."""
    per = {"launch": 0.003, "gpu": 0.009, "decode": 0.0002, "train": 0.03}[kind]
    n = TOKENS if kind == "decode" else 1
    launch = double_launch() if os.environ.get("GS_COLOC_DOUBLE") == "1" else (lambda: None)

    def request() -> None:
        for _ in range(n):
            launch()
            time.sleep(per)
    return request, None, per * n * 0.5


def double_launch():
    """One no-op kernel launch through the CPU driver double (packing_worker.double_launcher)."""
    from packing_worker import double_launcher

    fn = double_launcher()

    def launch() -> None:
        if fn(None, 1, 1, 1, 1, 1, 1, 0, None, None, None):
            raise RuntimeError("coloc_worker: a launch failed")
    return launch


def build_server(kind: str):
    """(request, forward for the calibration graph, requests per forward: tokens for the decoder)."""
    import torch
    import torch.nn as nn
    from spatial_worker import resnet50

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    if kind == "decode":
        blocks = [nn.Sequential(nn.LayerNorm(1024), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))
                  for _ in range(6)]
        net = nn.Sequential(*blocks, nn.Linear(1024, 4096)).to(dev).half().eval()
        emb = torch.randn(4096, 1024, device=dev, dtype=torch.half)
        tok = torch.zeros(1, dtype=torch.long, device=dev)

        def forward() -> None:
            with torch.inference_mode():
                tok.copy_(net(emb[tok]).argmax(-1))

        def request() -> None:
            t = 0
            for _ in range(TOKENS):
                forward()
                t = int(tok.item())  # the sampled token goes back to the CPU: a sync per token
            del t
        return request, forward, TOKENS
    batch = 1 if kind == "launch" else 32
    net = resnet50(torch, nn).to(dev).to(memory_format=torch.channels_last).half().eval()
    x = torch.randn(batch, 3, 224, 224, device=dev, dtype=torch.half).to(memory_format=torch.channels_last)

    def forward() -> None:
        with torch.inference_mode():
            net(x)

    def request() -> None:
        forward()
        torch.cuda.synchronize()
    return request, forward, 1


TRAINERS = ("transformer", "alu", "hbm")
DEFAULT_TRAINER = TRAINERS[0]  # the GPU-saturating transformer; the others are synthetic neighbours


def trainer_name() -> str:
    """The neighbour ``--kind train`` runs: GS_COLOC_TRAINER, one of :data:`TRAINERS` (default transformer)."""
    name = os.environ.get("GS_COLOC_TRAINER", DEFAULT_TRAINER)
    if name not in TRAINERS:
        raise ValueError(f"GS_COLOC_TRAINER={name!r}: allowed {', '.join(TRAINERS)}")
    return name


def build_trainer():
    """One step of the neighbour :func:`trainer_name` names, ending in a read back to the CPU as the trainer's does."""
    return {"transformer": build_transformer, "alu": build_alu, "hbm": build_hbm}[trainer_name()]()


# Synthetic neighbours that load one resource each, to tell which one a server beside the trainer waits for (a
# decoder's weights, ~32 MiB, fit the H100's 50 MiB L2: a neighbour that streams memory evicts them, one that only
# computes does not). Each step is 16 launches and a read back: on an H100's 60 % of SMs under MPS, 8.67 ms a step
# for alu, 12.36 ms for hbm (~2.78 TB/s), their mean steps in 2026-12-06-h100-coloc-neighbour-*-raw.tgz.
ALU_ITERS = 8192


def build_alu():
    """Arithmetic alone: a dependent multiply-add chain of ALU_ITERS per element over 4 MiB (it stays in L2), in
    enough blocks to fill every SM the process may use; next to no memory traffic."""
    import torch

    spin = torch.cuda.jiterator._create_jit_fn(
        "template <typename T> T gs_spin(T x) { T a = x; for (int i = 0; i < %d; ++i) { a = a * T(0.999999f) + "
        "T(0.000001f); } return a; }" % ALU_ITERS)
    x = torch.rand(1 << 20, device="cuda")

    def step() -> None:
        y = x
        for _ in range(16):
            y = spin(x)
        y[0].item()
    return step


def build_hbm():
    """Memory bandwidth alone: copies of 1 GiB (read 1 GiB, write 1 GiB: every cached line evicted each time)."""
    import torch

    src = torch.rand(1 << 28, device="cuda")
    dst = torch.empty_like(src)

    def step() -> None:
        for _ in range(16):
            dst.copy_(src)
        dst[0].item()
    return step


def build_transformer():
    import torch
    import torch.nn as nn

    dev = torch.device("cuda")
    layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
    net = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    batch = int(os.environ.get("GS_COLOC_TRAIN_BATCH", "16"))
    if not 1 <= batch <= 512:
        raise ValueError(f"GS_COLOC_TRAIN_BATCH={batch}: allowed 1..512")
    x = torch.randn(batch, 256, 1024, device=dev)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = net(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


YIELD_KEYS = ("yield_entries", "yield_busy_ns", "yield_backlog_ns", "yield_late_ns", "yield_no_looks_ns",
              "yield_own_queue_ns")


def pacer_counters() -> dict | None:
    """This process's enforcer counters on device 0 (``gpuslice_pacer_stats``, native/README-compute.md "Charge
    counters"), or None where no pacer runs there (no gpuslice, a dry run, a spatial slice without the gate)."""
    read = pacer_stats()
    return read() if read else None


def yield_split(before: dict | None, after: dict | None) -> dict | None:
    """What the yield gate held between two reads of the counters: its launch threads' sleeps by why (ns) and how
    often it let go after a hold. None unless both reads carry them (an enforcer before these counters)."""
    if not before or not after or any(k not in before or k not in after for k in YIELD_KEYS):
        return None
    return {k: after[k] - before[k] for k in YIELD_KEYS}


def wait_go(path: Path, limit: float = 300) -> float:
    deadline = time.time() + limit
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit:g} s")
        time.sleep(0.002)
    return float(path.read_text().strip())


def pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] * 1000


def slot_of(t: float, t0: float, slot: float) -> tuple[int, float]:
    """(index, seconds into it) of the slot holding wall time t: slots of ``slot`` s from t0; the trainer works in
    those where :func:`trainer_on` (--slot: the paired protocol)."""
    k = (t - t0) // slot
    return int(k), t - t0 - k * slot


# recorded with every split result; raws without it alternated (odd = on), except the one run of becd189
# (bench/results/2026-11-30-h200-coloc-thuemorse-decode.md), which was Thue-Morse before the order was recorded
SLOT_ORDER = "thue-morse"


def trainer_on(k: int) -> bool:
    """Whether the trainer works in slot k: the Thue-Morse sequence (k's count of one bits is odd: off, on, on, off,
    on, off, off, on, ...), so that in a window of 2**n slots the trainer's slots and its rest slots have the same
    mean position and a drift of the server's speed over the window of degree below n cancels (8 slots: linear and
    quadratic). Slots alternating on/off put every on-slot after its off-slot, so a server slowing down through the
    window reads slower "on" with no trainer at all; the decoder alone leaned that way by 2-3.5 points (median
    1.020, geometric mean 1.035 over 28 repeats in 12 runs, bench/results/2026-11-30-h200-coloc-decode-null.md),
    its cause not measured. Before the window (k < 0) every other slot, as before."""
    return k % 2 == 1 if k < 0 else bin(k).count("1") % 2 == 1


def summary(lat: list[float], window: float) -> dict:
    lat = sorted(lat)
    return {"requests": len(lat), "req_per_s": len(lat) / window if window else None, "p50_ms": pct(lat, 0.50),
            "p99_ms": pct(lat, 0.99), "mean_ms": sum(lat) / len(lat) * 1000 if lat else None,
            "lat_ms": [round(x * 1000, 4) for x in lat]}


def run_server(request, think: float, t0: float, window: float, tail: float, slot: float = 0.0,
               guard: float = 0.1) -> dict:
    """Requests with ``think`` seconds between them; latencies of those that start and end in the window (sorted,
    and in time order with each one's start as ``series``). With ``slot``: also each request's slot (the trainer
    on or off: :func:`trainer_on`); a request that
    starts in a slot's first ``guard`` s or ends in the next slot is in neither list (the neighbour's switch)."""
    end, stop = t0 + window, t0 + window + tail
    lat: list[float] = []
    series: list[list[float]] = []  # [start s into the window, ms] in time order: a drift within the window shows
    by = {0: [], 1: []}
    left_out = {0: 0, 1: 0}  # requests of each side's slots in neither list (a slot's guard, or into the next slot)
    while time.time() < t0:
        time.sleep(min(0.001, max(0.0, t0 - time.time())))
    while True:
        a = time.perf_counter()
        wall_a = time.time()
        request()
        b = time.perf_counter()
        if wall_a + (b - a) > end:
            break
        lat.append(b - a)
        series.append([round(wall_a - t0, 4), round((b - a) * 1000, 4)])
        if slot:
            k, into = slot_of(wall_a, t0, slot)
            if into >= guard and slot_of(wall_a + (b - a), t0, slot)[0] == k:
                by[int(trainer_on(k))].append(b - a)
            else:  # a trainer that stalls the server past its slot shows here, not in the "on" latencies
                left_out[int(trainer_on(k))] += 1
        time.sleep(think)
    while time.time() < stop:
        request()
        time.sleep(think)
    out = summary(lat, window)
    out["series"] = series
    if slot:
        out["slot_s"], out["guard_s"], out["slot_order"] = slot, guard, SLOT_ORDER
        out["off"], out["on"] = summary(by[0], 0), summary(by[1], 0)
        out["off"]["left_out"], out["on"]["left_out"] = left_out[0], left_out[1]
    return out


def run_trainer(step, t0: float, window: float, tail: float, slot: float = 0.0) -> dict:
    """Steps back to back from before the window until its end + tail. With ``slot``: steps only in the on-slots
    (:func:`trainer_on`), each started only when the mean step so far ends inside the slot (the trainer's GPU work
    stays in its slots); it/s counts the steps of on-slots against the on-slots' time in the window."""
    if slot:
        return run_trainer_slotted(step, t0, window, tail, slot)
    end, stop = t0 + window, t0 + window + tail
    while time.time() < t0:
        step()  # busy before the window opens: the server meets a loaded device from its first request
    done, before = 0, pacer_counters()
    while True:
        step()
        if time.time() > end:
            break
        done += 1
    held = yield_split(before, pacer_counters())
    while time.time() < stop:
        step()
    return {"iters": done, "it_per_s": done / window, "yield": held}


def run_trainer_slotted(step, t0: float, window: float, tail: float, slot: float) -> dict:
    end, stop = t0 + window, t0 + window + tail
    mean, n, done = 0.0, 0, 0
    before = after = None
    while (now := time.time()) < stop:
        if before is None and now >= t0:
            before = pacer_counters() or {}
        if after is None and now > end:
            after = pacer_counters() or {}
        k, into = slot_of(now, t0, slot)
        if not trainer_on(k) or into + mean > slot:
            time.sleep(min(0.002, max(0.0, slot - into)))
            continue
        a = time.perf_counter()
        step()
        took = time.perf_counter() - a
        n += 1
        mean += (took - mean) / n
        done += t0 <= now and time.time() <= end
    if after is None:  # a step that ran past the tail: read the counters now (a little past the window)
        after = pacer_counters() or {}
    on_time = sum(min(end, t0 + (k + 1) * slot) - (t0 + k * slot) for k in range(int(window // slot) + 1)
                  if trainer_on(k) and t0 + k * slot < end)
    return {"iters": done, "it_per_s": done / on_time if on_time else None, "slot_s": slot, "slot_order": SLOT_ORDER,
            "on_s": on_time, "mean_step_ms": mean * 1000, "yield": yield_split(before, after)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("launch", "gpu", "decode", "train"), required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--go", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--tail", type=float, default=0.4)
    ap.add_argument("--slot", type=float, default=0.0,
                    help="paired protocol: the trainer on in the Thue-Morse slots of this many s (trainer_on)")
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args()
    result: dict = {"pid": os.getpid(), "kind": args.kind}
    try:
        if args.kind == "train":
            result["trainer"] = trainer_name()
            step = build_dry("train")[0] if args.dry else build_trainer()
            for _ in range(8):
                step()
        else:
            if args.dry:
                request, forward, hint = build_dry(args.kind)
                result["gpu_ms_per_request"] = hint * 1000
                result["calibration"] = "dry run"
            else:
                from packing_worker import calibrate

                request, forward, per = build_server(args.kind)
                for _ in range(20):
                    request()
                cal = calibrate(forward, 50)
                result["gpu_ms_per_request"] = cal["gpu_s_per_iter"] * per * 1000
                result["calibration"] = cal["how"]
            result["think_ms"] = THINK[args.kind] * 1000
        Path(args.ready).write_text(json.dumps(result))
        t0 = wait_go(Path(args.go))
        if args.kind == "train":
            result.update(run_trainer(step, t0, args.window, args.tail, args.slot))
        else:
            result.update(run_server(request, THINK[args.kind], t0, args.window, args.tail, args.slot))
            busy = result["req_per_s"] * result["gpu_ms_per_request"] / 1000
            result["busy_fraction"] = min(1.0, busy)  # of the device's time, by the calibration ruler
        code = 0
    except Exception as exc:  # a CUDA error, a missing file: named in the JSON for the report
        result["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        code = 3
    Path(args.out).write_text(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
