"""One process of a memory-acceptance scenario, run *inside* a slice (LD_PRELOAD + GPUSLICE_SLICE).

    python3 mem_probe.py FRAMEWORK REPORT.json [--chunk-mib 64] [--go FILE] [--hold FILE] [--alloc-mib N]

Allocates chunk after chunk with FRAMEWORK (torch | jax | cupy | driver:PATH, the last a driver-API
allocation path called through ctypes, see driver_probe.py) until the framework reports out of
memory (or, with --alloc-mib, just that much), then writes REPORT.json: bytes granted, whether an OOM
was seen and its message, what the framework's memory query says (torch.cuda.mem_get_info, CuPy
memGetInfo, JAX memory_stats) and what nvidia-smi says when run from inside the slice. With --hold it
then keeps the memory until FILE exists, so the orchestrator can look at the card from outside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import driver_probe

MiB = 1 << 20


def smi_inside() -> dict:
    """nvidia-smi as a process of the slice sees it (it inherits LD_PRELOAD and GPUSLICE_SLICE)."""
    out: dict = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        total, used, free = (int(x) for x in q.stdout.strip().splitlines()[0].split(","))
        out.update(total_mib=total, used_mib=used, free_mib=free)
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        out["apps"] = [[int(x) for x in line.split(",")] for line in p.stdout.strip().splitlines() if line.strip()]
    except Exception as e:  # reported, not fatal: the orchestrator judges
        out["error"] = repr(e)
    return out


def ready(report: str) -> None:
    """Tell the orchestrator this process is initialised and waiting for --go."""
    with open(report + ".ready", "w") as f:
        f.write(str(os.getpid()))


def wait_for(path: str | None, timeout: float = 120) -> None:
    if not path:
        return
    end = time.time() + timeout
    while not os.path.exists(path) and time.time() < end:
        time.sleep(0.01)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=["torch", "jax", "cupy"] + [f"driver:{p}" for p in driver_probe.PATHS])
    ap.add_argument("report")
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--go")
    ap.add_argument("--hold")
    ap.add_argument("--alloc-mib", type=int, default=0)
    a = ap.parse_args()
    chunk = a.chunk_mib * MiB
    rep: dict = {"framework": a.framework, "pid": os.getpid(), "chunk": chunk, "granted": 0, "oom": False}
    keep = []
    t0 = time.time()
    try:
        __import__({"torch": "torch", "cupy": "cupy", "jax": "jax"}.get(a.framework, "ctypes"))
    except ImportError as e:  # this machine lacks the framework: say so instead of failing the run
        rep["skipped"] = f"{a.framework} is not installed here: {e}"
        with open(a.report, "w") as f:
            json.dump(rep, f)
        ready(a.report)
        return 0
    if a.framework.startswith("driver:"):
        drv = driver_probe.Driver()
        rep["query_before"] = drv.mem_info()
        ready(a.report)
        wait_for(a.go)
        driver_probe.fill(drv, a.framework.split(":", 1)[1], rep, a.alloc_mib)
        rep["query_after"] = drv.mem_info()
    elif a.framework == "torch":
        import torch

        torch.zeros(1, device="cuda")
        rep["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        free, total = torch.cuda.mem_get_info()
        rep["query_before"] = {"free": free, "total": total}
        ready(a.report)
        wait_for(a.go)
        try:
            while not a.alloc_mib or rep["granted"] < a.alloc_mib * MiB:
                keep.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                rep["granted"] += chunk
        except torch.cuda.OutOfMemoryError as e:
            rep["oom"], rep["oom_message"] = True, str(e).splitlines()[0][:300]
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        rep["query_after"] = {"free": free, "total": total, "reserved": torch.cuda.memory_reserved()}
    elif a.framework == "cupy":
        import cupy

        cupy.zeros(1)
        free, total = cupy.cuda.runtime.memGetInfo()
        rep["query_before"] = {"free": free, "total": total}
        ready(a.report)
        wait_for(a.go)
        try:
            while not a.alloc_mib or rep["granted"] < a.alloc_mib * MiB:
                keep.append(cupy.empty(chunk, dtype=cupy.uint8))
                rep["granted"] += chunk
        except cupy.cuda.memory.OutOfMemoryError as e:
            rep["oom"], rep["oom_message"] = True, str(e)[:300]
        free, total = cupy.cuda.runtime.memGetInfo()
        rep["query_after"] = {"free": free, "total": total}
    else:
        import jax
        import jax.numpy as jnp

        d = jax.devices()[0]
        jnp.zeros(1).block_until_ready()
        rep["query_before"] = {k: v for k, v in (d.memory_stats() or {}).items() if k in ("bytes_limit", "bytes_in_use")}
        ready(a.report)
        wait_for(a.go)
        try:
            while not a.alloc_mib or rep["granted"] < a.alloc_mib * MiB:
                x = jnp.zeros((chunk // 4,), dtype=jnp.float32)
                x.block_until_ready()
                keep.append(x)
                rep["granted"] += chunk
        except Exception as e:  # XlaRuntimeError: RESOURCE_EXHAUSTED
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
            rep["oom"], rep["oom_message"] = True, str(e).splitlines()[0][:300]
        rep["query_after"] = {k: v for k, v in (d.memory_stats() or {}).items() if k in ("bytes_limit", "bytes_in_use")}
    rep["fill_seconds"] = round(time.time() - t0, 2)
    rep["smi_inside"] = smi_inside()
    tmp = a.report + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rep, f)
    os.replace(tmp, a.report)
    wait_for(a.hold, timeout=180)
    return 0


if __name__ == "__main__":
    sys.exit(main())
