"""Which question to the driver, asked inside a CUDA graph capture, breaks it: PyTorch
(``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``) captures a 1-GiB allocation in ``torch.cuda.graph``'s default
(global) mode, with one question asked right before the allocation; one JSON line per question, each in a process
of its own, run bare (no enforcer). Every run also reads the pool's reserved and used bytes outside the capture,
before it and after a replay; ``pool_growth`` reads them inside it too, around the allocation (relaxed).

Why: under the enforcer such a capture failed on an H100 (2026-12-06). A pool attribute read in global mode failed
(900) and invalidated the capture (bench/results/2026-12-06-h100-capture-probe.txt); with the enforcer's reads made in
relaxed mode, next to a look-up of the stream's device and the current pool, the capture still failed
(2026-12-06-h100-gpu-tests-capture-after-fix.txt), while code that asked nothing but the capture status passed on the
H200 (7b50452, 2026-11-30). The enforcer now asks nothing inside a capture (native/src/hooks/cuda_pool.c
captured_alloc); this probe says which of those questions the driver minds, and whether the pool grows across a
captured allocation. On the H100 (bench/results/2026-12-06-h100-capture-probe-s38.txt) cuStreamGetDevice and the
pool's size read in global mode broke the capture (900); every other process aborted once its graph was torn down,
before it printed, so each process now prints its line while the graph lives.

    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 bench/gpu/capture_pool_probe.py          # every question
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 bench/gpu/capture_pool_probe.py stream_device
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

RESERVED, USED = 5, 7  # CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT
RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
QUESTION_TIMEOUT_S = 25

# name -> (the driver calls asked, the mode they are asked in); "none" asks nothing (the baseline)
QUESTIONS = {
    "none": "nothing",
    "ctx_device": "cuCtxGetDevice (global mode)",
    "stream_device": "cuStreamGetDevice on the capturing stream (global mode)",
    "current_pool": "cuDeviceGetMemPool (global mode)",
    "current_pool_relaxed": "cuDeviceGetMemPool (relaxed mode)",
    "pool_size_relaxed": "cuMemPoolGetAttribute(RESERVED_MEM_CURRENT) (relaxed mode)",
    "pool_size_global": "cuMemPoolGetAttribute(RESERVED_MEM_CURRENT) (global mode)",
    "mode_exchange": "cuThreadExchangeStreamCaptureMode to relaxed and back",
    "pool_growth": "the pool's reserved and used bytes (relaxed) before and after the allocation, as the enforcer "
                   "read them until 2026-12-06",
}


def _ask(cu: ctypes.CDLL, question: str, stream: int, pool: ctypes.c_void_p) -> dict:
    """Ask ``question`` now (``pool``: the default pool, looked up before the capture); the driver's answers
    (0 = success)."""
    out: dict = {}
    mode = ctypes.c_int(RELAXED)
    relaxed = question.endswith("_relaxed") or question == "mode_exchange"
    if relaxed:
        out["exchange"] = cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    try:
        d, h, v = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        if question == "ctx_device":
            out["answer"] = cu.cuCtxGetDevice(ctypes.byref(d))
        elif question == "stream_device":
            out["answer"] = cu.cuStreamGetDevice(ctypes.c_void_p(stream), ctypes.byref(d))
        elif question.startswith("current_pool"):
            out["answer"] = cu.cuDeviceGetMemPool(ctypes.byref(h), 0)
        elif question.startswith("pool_size"):
            out["answer"] = cu.cuMemPoolGetAttribute(pool, RESERVED, ctypes.byref(v))
    finally:
        if relaxed:
            out["restore"] = cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    return out


def _pool(cu: ctypes.CDLL) -> dict:
    """The default pool's reserved and used bytes, read in relaxed mode (inside a capture only for ``pool_growth``:
    whether that is safe is what the ``pool_size_relaxed`` row says)."""
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


def probe(question: str) -> dict:
    import torch

    cu = ctypes.CDLL("libcuda.so.1")
    log: dict = {"question": question, "asks": QUESTIONS[question], "device": torch.cuda.get_device_name(0)}
    held = torch.empty(int(0.75 * 2**30), dtype=torch.uint8, device="cuda")
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    pool = ctypes.c_void_p()
    if cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0) != 0 or not pool.value:
        log["error"] = "cuDeviceGetDefaultMemPool failed: the pool_size questions cannot be asked"
        return log
    log["pool_before"] = _pool(cu)

    def step(v):
        log["asked"] = _ask(cu, question, torch.cuda.current_stream().cuda_stream, pool)
        if question == "pool_growth":
            log["pool_before_alloc"] = _pool(cu)
        big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        if question == "pool_growth":
            log["pool_after_alloc"] = _pool(cu)
        big.fill_(1)
        return v @ v + big[:1].float()

    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            step(x)
        g.replay()
        torch.cuda.synchronize()
        log["pool_after_replay"] = _pool(cu)
        log["captured"] = True
    except Exception as exc:  # noqa: BLE001 - a broken capture is the finding
        log["captured"] = False
        log["error"] = repr(exc)[:300]
    # Said while the graph still lives: on the H100 (2026-12-06) every process whose capture succeeded aborted when
    # the graph was torn down at the function's end, so a line printed after the return was never seen.
    print(json.dumps(log), flush=True)
    del held
    return log


def _answer(question: str, r: subprocess.CompletedProcess) -> dict:
    """One question's line: the child's own, or its exit alone; a child that died (after its line or before it)
    adds its exit status and the start and end of its stderr (the reason comes first, the stack last)."""
    lines = r.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"question": question}
    if r.returncode:
        out["exit"] = r.returncode
        out["exit_after_line"] = bool(lines)
        err = r.stderr.strip()
        out["stderr"] = err if len(err) <= 1200 else err[:900] + " [...] " + err[-300:]
    return out


def main(argv: list[str]) -> int:
    if argv:
        unknown = [q for q in argv if q not in QUESTIONS]
        if unknown:
            print(f"unknown question(s) {unknown}: allowed {', '.join(QUESTIONS)}", file=sys.stderr)
            return 2
        for q in argv:
            probe(q)  # prints its own line
        return 0
    for q in QUESTIONS:  # each in a process of its own: a broken capture leaves the context's state behind
        try:  # ~10 s each on an H100; gpu_all.sh gives the whole step 240 s
            r = subprocess.run([sys.executable, __file__, q], capture_output=True, text=True, env=dict(os.environ),
                               timeout=QUESTION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(json.dumps({"question": q, "error": f"no answer in {QUESTION_TIMEOUT_S} s"}), flush=True)
            continue
        print(json.dumps(_answer(q, r)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
