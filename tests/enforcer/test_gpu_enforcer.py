"""On a real GPU (skipped elsewhere): one PyTorch process in a 2 GiB slice, enforcer preloaded,
allocates until OOM; the enforcer's books never pass the limit and torch sees the slice.
The full matrix (expandable segments, cudaMallocAsync, JAX, CuPy, 2/4 processes, SIGKILL) is
bench/gpu_acceptance.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.enforcer.region import read_region
from gpuslice.enforcer.slicefile import write_slice_file

from .conftest import ROOT

pytestmark = pytest.mark.gpu
GiB = 1 << 30


def _uuid() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.split()[0]


def test_torch_fills_exactly_to_the_slice(tmp_path: Path, native_build: Path) -> None:
    pytest.importorskip("torch")
    uuid = _uuid()
    region = tmp_path / "slice.region"
    write_slice_file(tmp_path / "slice.conf", devices=(uuid,), memory_limit=2 * GiB, region=str(region))
    env = dict(os.environ, LD_PRELOAD=str(native_build / "libgpuslice.so"), GPUSLICE_SLICE=str(tmp_path / "slice.conf"))
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "mem_probe.py"), "torch", str(report)],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["oom"], rep
    assert rep["query_before"]["total"] == 2 * GiB
    assert rep["smi_inside"].get("total_mib") == 2048
    snap = read_region(region)
    dev = snap.device(uuid)
    assert dev.peak <= 2 * GiB and dev.oom_refusals >= 1
    assert dev.used == 0 and snap.processes == ()  # the probe exited normally: its record is gone


# PyTorch on cudaMallocAsync in a 3 GiB slice (its context counts ~0.5-0.7 GiB of it): as much held eagerly as leaves
# 1.5 GiB, then a CUDA graph whose capture allocates 1 GiB on the capture stream: graph-owned memory, backed from the
# driver's graph pool when the graph is uploaded or first run and counted then (native/src/hooks/cuda_graph.c).
# What the test catches today is a capture the enforcer breaks: a question of its own that invalidates the capture
# (the H100's failure of 2026-12-06: a pool attribute read in global capture mode; after that read was made in
# relaxed mode the capture still failed there: bench/results/2026-12-06-h100-gpu-tests-capture-after-fix.txt; since
# then the enforcer asks nothing inside a capture but the allocation and the stream's capture status), or a refusal inside it. A failure also runs the program without the
# enforcer (the same 1.5 GiB left) and says how that went: a capture that fails bare is not the enforcer's. (Counted
# as the pool's, the allocation would now reserve 1 GiB, which fits, and be given back once the pool is seen not to
# have grown: the double count of 2026-11-30 is pinned by native/tests/test_enforcer_pool.c.) Until 2026-12-06 this test held 0.75 GiB in a 2 GiB slice,
# which left less than 1 GiB beside an H100's context. The graph is replayed and its result checked against one
# computed before the capture.
CAPTURE_ASYNC = r"""
import json, os, torch
x = torch.randn(1024, 1024, device="cuda")
ref = (x @ x + 1).cpu()
torch.cuda.synchronize()
free = min(torch.cuda.mem_get_info()[0], int(os.environ.get("GS_TEST_FREE_CAP", 1 << 62)))  # the slice's, as the enforcer answers it
held = torch.empty(free - (3 << 29), dtype=torch.uint8, device="cuda")
def step(v):
    big = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    big.fill_(1)
    return v @ v + big[:1].float()
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = step(x)
g.replay()
torch.cuda.synchronize()
assert torch.allclose(y.cpu(), ref, rtol=1e-4, atol=1e-3), "the replay differs"
print(json.dumps({"captured": True, "held_gib": round(held.numel() / 2**30, 3)}))
"""


def _capture_env(tmp_path: Path, native_build: Path, limit: int) -> tuple[dict, Path, str]:
    uuid = _uuid()
    region = tmp_path / "slice.region"
    write_slice_file(tmp_path / "slice.conf", devices=(uuid,), memory_limit=limit, region=str(region))
    # debug: a refusal says why a capture's allocation was counted as the pool's (native/src/hooks/cuda_pool.c)
    env = dict(os.environ, LD_PRELOAD=str(native_build / "libgpuslice.so"), GPUSLICE_SLICE=str(tmp_path / "slice.conf"),
               PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync", GPUSLICE_LOG_LEVEL="debug")
    return env, region, uuid


def test_a_graph_capturing_stream_ordered_allocations_near_the_limit(tmp_path: Path, native_build: Path) -> None:
    """A stream-ordered allocation made while a graph is captured is the graph's, not its pool's: with room for it
    once, not twice, the capture is neither refused nor invalidated by the enforcer's pool books, the graph runs,
    and the slice never held more than its limit."""
    pytest.importorskip("torch")
    env, region, uuid = _capture_env(tmp_path, native_build, 3 * GiB)
    r = subprocess.run([sys.executable, "-c", CAPTURE_ASYNC], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:] + _bare_capture(env)
    assert json.loads(r.stdout.strip().splitlines()[-1])["captured"] is True
    assert read_region(region).device(uuid).peak <= 3 * GiB


def _bare_capture(env: dict) -> str:
    """How the capture program does without the enforcer, holding as much as leaves the same 1.5 GiB of a 2.4 GiB
    budget (what a 3 GiB slice leaves beside an H100's PyTorch context): the failure's message says it."""
    bare = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "GPUSLICE_SLICE")}
    bare["GS_TEST_FREE_CAP"] = str(int(2.4 * GiB))
    r = subprocess.run([sys.executable, "-c", CAPTURE_ASYNC], env=bare, capture_output=True, text=True, timeout=180)
    return f"\n--- the same program without the enforcer: exit {r.returncode}\n" + (r.stdout + r.stderr)[-1500:]
