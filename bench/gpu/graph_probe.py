"""CUDA graph memory inside a slice, for the memory acceptance run (bench/gpu/mem_acceptance.py, ``graph``).

Run by the acceptance harness with the enforcer preloaded. Through ctypes (dlsym on libcuda, as CuPy and
JAX find the driver) it builds GRAPHS graphs of one memory-allocation node of PIECE_MIB each
(cuGraphAddMemAllocNode), instantiates, uploads and launches them, then writes ``<report>.1`` and waits for
``<report>.next``: the harness reads the region and NVML's per-process memory (the graphs' memory is backed
by now). Then it frees the allocations (cuMemFreeAsync), destroys the executable graphs, trims the device's
graph pool (cuDeviceGraphMemTrim), writes ``<report>.2`` and waits for ``<report>.hold``: the harness reads
again (the memory must have left the books and the card). Layouts are the CUDA 12/13 driver ABI.

    python graph_probe.py REPORT [--graphs 4] [--piece-mib 256]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path

from driver_probe import Driver, _PoolProps

MiB = 1 << 20


class _AllocNodeParams(ctypes.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS
    _fields_ = [("poolProps", _PoolProps), ("accessDescs", c_void_p), ("accessDescCount", c_size_t),
                ("bytesize", c_size_t), ("dptr", c_uint64)]


def wait_for(path: Path, seconds: float = 300) -> None:
    end = time.time() + seconds
    while not path.exists() and time.time() < end:
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--graphs", type=int, default=4)
    ap.add_argument("--piece-mib", type=int, default=256)
    a = ap.parse_args()
    rep = Path(a.report)
    drv = Driver()
    cu = drv.cu
    execs, ptrs = [], []
    for _ in range(a.graphs):
        graph, node, exe = c_void_p(), c_void_p(), c_void_p()
        drv.check("cuGraphCreate", cu.cuGraphCreate(byref(graph), 0))
        p = _AllocNodeParams()
        p.poolProps.allocType = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        p.poolProps.location.type, p.poolProps.location.id = 1, drv.dev  # CU_MEM_LOCATION_TYPE_DEVICE
        p.bytesize = a.piece_mib * MiB
        drv.check("cuGraphAddMemAllocNode", cu.cuGraphAddMemAllocNode(byref(node), graph, None, c_size_t(0), byref(p)))
        drv.check("cuGraphInstantiateWithFlags", cu.cuGraphInstantiateWithFlags(byref(exe), graph, ctypes.c_ulonglong(0)))
        drv.check("cuGraphUpload", cu.cuGraphUpload(exe, None))
        drv.check("cuGraphLaunch", cu.cuGraphLaunch(exe, None))
        drv.check("cuStreamSynchronize", cu.cuStreamSynchronize(None))
        execs.append(exe)
        ptrs.append(p.dptr)
    info1 = drv.mem_info()
    Path(str(rep) + ".1").write_text(json.dumps({"pid": os.getpid(), "graph_bytes": a.graphs * a.piece_mib * MiB,
                                                 "query": info1}))
    wait_for(Path(str(rep) + ".next"))
    for d in ptrs:
        drv.check("cuMemFreeAsync", cu.cuMemFreeAsync(c_uint64(d), None))
    drv.check("cuStreamSynchronize", cu.cuStreamSynchronize(None))
    for exe in execs:
        drv.check("cuGraphExecDestroy", cu.cuGraphExecDestroy(exe))
    drv.check("cuDeviceGraphMemTrim", cu.cuDeviceGraphMemTrim(c_int(drv.dev)))
    Path(str(rep) + ".2").write_text(json.dumps({"pid": os.getpid(), "query": drv.mem_info()}))
    wait_for(Path(str(rep) + ".hold"))


if __name__ == "__main__":
    main()
