"""What the device's default memory pool does when PyTorch (``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``)
allocates inside a CUDA graph capture: the pool's reserved and used bytes before the capture, inside it around a
1-GiB allocation, and after a replay; one JSON line.

Why: on an H100 the enforcer refused such an allocation near a 2-GiB slice's limit
(tests/enforcer/test_gpu_enforcer.py ``test_a_graph_capturing_stream_ordered_allocations_near_the_limit``,
bench/results/2026-12-06-h100-gpu-tests-yieldcounters.txt). The enforcer reads the pool's size before and after a
captured allocation (native/src/hooks/cuda_pool.c graph_alloc_locked): run bare, this says whether the driver grows
the pool there; under the enforcer with ``GPUSLICE_LOG_LEVEL=debug`` its log says which path counted it. Its first
run (2026-12-06, bench/results/2026-12-06-h100-capture-probe.txt) found the cause instead: a pool attribute read
inside the global-mode capture fails (900) and invalidates it, the probe's own read and the enforcer's alike (the
H200 had passed the test with code that made no such read). The question of growth is still open.

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 bench/gpu/capture_pool_probe.py
"""

from __future__ import annotations

import ctypes
import json

RESERVED, USED = 5, 7  # CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT
RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED


def main() -> None:
    import torch

    cu = ctypes.CDLL("libcuda.so.1")

    def pool() -> dict:
        # asked in relaxed capture mode: in torch.cuda.graph's global mode a pool's attribute is a prohibited call
        # that fails (900) and invalidates the capture (this probe's first H100 run, 2026-12-06)
        h, v, out, mode = ctypes.c_void_p(), ctypes.c_uint64(), {}, ctypes.c_int(RELAXED)
        cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        try:
            if cu.cuDeviceGetMemPool(ctypes.byref(h), 0) != 0:
                return {"error": "cuDeviceGetMemPool"}
            for name, attr in (("reserved", RESERVED), ("used", USED)):
                r = cu.cuMemPoolGetAttribute(h, attr, ctypes.byref(v))
                out[name] = v.value if r == 0 else f"error {r}"
            return out
        finally:
            cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))

    log: dict = {"device": torch.cuda.get_device_name(0)}
    held = torch.empty(int(0.75 * 2**30), dtype=torch.uint8, device="cuda")
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    log["before"] = pool()

    def step(v):
        log["capture_before_alloc"] = pool()
        big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        log["capture_after_alloc"] = pool()
        big.fill_(1)
        return v @ v + big[:1].float()

    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            step(x)
        g.replay()
        torch.cuda.synchronize()
        log["after_replay"] = pool()
        log["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a refusal inside the capture is the finding
        log["error"] = repr(exc)[:300]
    del held
    print(json.dumps(log), flush=True)


if __name__ == "__main__":
    main()
