"""Scheduler-extender latency: filter + prioritize for one pod over 1,000 and 5,000 nodes (p50 / p99).

Each node is an 8 × H100 80GB node (the bundled NVML snapshot, UUIDs made unique per node) with a
realistic ledger: a random 0-60 % of its devices' memory already granted in slices. Two ways the
kube-scheduler can call us are timed, both over real HTTP (httpx -> uvicorn on loopback):

* ``names``: ``nodeCacheCapable: true`` — ExtenderArgs carry node names; the extender reads its watched
  node cache (parsed views are reused while a node's resourceVersion is unchanged);
* ``nodes``: ``nodeCacheCapable: false`` — ExtenderArgs carry every full Node object (~6 KB each): the
  time includes the scheduler-side JSON the extender must parse.

Between requests one node's ledger changes (a bind elsewhere), so caches see realistic churn.

    python bench/extender_latency.py [--nodes 1000 5000] [--requests 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import httpx

from gpuslice.kube import formats
from gpuslice.kube.agent import unique_devices
from gpuslice.kube.extender import Extender, ViewCache
from gpuslice.kube.server import make_app, start_in_thread
from gpuslice.host.devices import load_snapshot
from gpuslice.spec import Grant, MiB, Slice


class StaticCache:
    """The node cache as the scheduler's watch would fill it (no API server in a benchmark)."""

    def __init__(self, nodes):
        self.views = ViewCache()
        for n in nodes:
            self.views.view(n)


def make_node(name: str, rv: int, rng: random.Random, base) -> dict:
    devs = unique_devices(base, name)
    ledger = formats.Ledger({})
    for k, d in enumerate(devs):
        share = rng.choice([0, 0, 0.1, 0.25, 0.4, 0.6])
        if share:
            mem = int(d.memory_total * share) // MiB * MiB
            uid = f"{name}-{k}"
            ledger = ledger.with_entry(formats.PodGrant(name, uid, "bench", f"p-{uid}", (formats.ContainerGrant(
                "main", Grant(formats.grant_id_for(uid, "main"), (Slice(d.uuid, mem, 20),))),), 1.0))
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": str(rv), "uid": f"uid-{name}",
                         "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "H100"},
                         "annotations": {formats.NODE_DEVICES: formats.encode_node_devices(devs),
                                         formats.NODE_LEDGER: formats.encode_ledger(ledger)}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"capacity": {"cpu": "128", "memory": "2Ti", "nvidia.com/gpu": "80", "pods": "110"},
                       "allocatable": {"cpu": "126", "memory": "2000Gi", "nvidia.com/gpu": "80", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "nodeInfo": {"kubeletVersion": "v1.34.0", "containerRuntimeVersion": "containerd://2.1"}}}


POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "bench", "namespace": "default", "uid": "uid-bench",
                    "annotations": {}},
       "spec": {"schedulerName": "gpuslice-scheduler",
                "containers": [{"name": "main", "image": "pytorch",
                                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000",
                                                         "nvidia.com/gpucores": "30"}}}]}}


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def run(n_nodes: int, requests: int, mode: str, seed: int = 7) -> dict:
    rng = random.Random(seed)
    base = load_snapshot("h100-80gb")
    nodes = [make_node(f"node-{i:05d}", 1, rng, base) for i in range(n_nodes)]
    cache = StaticCache(nodes)
    ext = Extender(None, cache=cache)  # type: ignore[arg-type]
    running = start_in_thread(make_app(ext, webhook_enabled=False))
    # Go's net/http (the kube-scheduler) sets TCP_NODELAY on every connection; so does this client, else
    # Nagle + delayed ACK add ~40 ms per request that the real caller never sees.
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    client = httpx.Client(base_url=running.url, timeout=120, transport=transport)
    names = [n["metadata"]["name"] for n in nodes]
    times, fit = [], 0
    try:
        for r in range(requests + 5):
            # churn: one node's ledger changes between requests (a bind elsewhere)
            k = rng.randrange(n_nodes)
            nodes[k] = make_node(names[k], r + 2, rng, base)
            cache.views.view(nodes[k])
            args = {"Pod": POD, "NodeNames": names} if mode == "names" else \
                {"Pod": POD, "Nodes": {"items": nodes}}
            body = json.dumps(args).encode()
            t0 = time.perf_counter()
            f = client.post("/filter", content=body, headers={"Content-Type": "application/json"})
            fr = f.json()
            t_filter = time.perf_counter() - t0
            kept = fr["NodeNames"] if mode == "names" else [n["metadata"]["name"] for n in fr["Nodes"]["items"]]
            keep = set(kept)
            pargs = {"Pod": POD, "NodeNames": kept} if mode == "names" else \
                {"Pod": POD, "Nodes": {"items": [n for n in nodes if n["metadata"]["name"] in keep]}}
            pbody = json.dumps(pargs).encode()  # the caller's serialisation is not ours: not timed
            t1 = time.perf_counter()
            p = client.post("/prioritize", content=pbody, headers={"Content-Type": "application/json"})
            scores = p.json()
            dt = t_filter + (time.perf_counter() - t1)
            assert f.status_code == 200 and p.status_code == 200 and len(scores) == len(kept)
            if r >= 5:  # warm-up excluded
                times.append(dt)
                fit += len(kept)
    finally:
        client.close()
        running.stop()
    return {"nodes": n_nodes, "mode": mode, "requests": len(times), "p50_ms": pct(times, 50) * 1e3,
            "p99_ms": pct(times, 99) * 1e3, "mean_ms": statistics.fmean(times) * 1e3,
            "fitting_nodes_mean": fit / len(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--requests-nodes", type=int, default=50, help="cap on requests in the nodes mode")
    ap.add_argument("--modes", nargs="+", default=["names", "nodes"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    lines = [f"# gpuslice scheduler extender: filter + prioritize latency ({date.today().isoformat()})",
             f"# machine: {platform.node()} {platform.processor() or platform.machine()}, CPU only, "
             f"Python {platform.python_version()}, {os.cpu_count()} CPUs; {a.requests} requests per row after 5 "
             f"warm-up ({min(a.requests, a.requests_nodes)} in the nodes mode); load average at start "
             f"{os.getloadavg()[0]:.1f}",
             "# time = filter + prioritize round trips over HTTP (client-side JSON encoding excluded)",
             "# nodes: 8 x H100 80GB each (bundled NVML snapshot), random 0-60% of memory granted; pod asks "
             "1 GPU, 20000 MiB, 30% cores",
             "# names = nodeCacheCapable true (names in, cached parsed views); nodes = full Node objects in each request",
             f"{'nodes':>6} {'mode':>6} {'p50_ms':>9} {'p99_ms':>9} {'mean_ms':>9} {'fitting':>8}"]
    for n in a.nodes:
        for mode in a.modes:
            # full Node objects are ~6 KB each: 5,000 of them are 30 MB per call, so fewer calls there
            r = run(n, a.requests if mode == "names" else min(a.requests, a.requests_nodes), mode)
            lines.append(f"{r['nodes']:>6} {r['mode']:>6} {r['p50_ms']:>9.1f} {r['p99_ms']:>9.1f} "
                         f"{r['mean_ms']:>9.1f} {r['fitting_nodes_mean']:>8.0f}")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
