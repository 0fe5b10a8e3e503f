"""How much of the placement core's allocation a real cluster keeps: openb slices replayed through a real
kube-scheduler (hack/bin/controlplane, v1.37) against the simulator on the same pods. CPU only, no GPU.

For each seed: 50 of openb's GPU nodes and the simulator's inflation sequence for them (~300-470 GPU pods,
tests/support/openbreplay.py), submitted one pod at a time. Rows:

* ``dp-before``  device-plugin mode, the chart as it was: extender weight 1, kube-scheduler's own score plugins on;
* ``dp-chart``   device-plugin mode, the chart now: placementAuthority (packing score plugins off), weight 100,
                 every node scored;
* ``dra``        DRA mode: claims (a share: ``compute`` = gpu_milli/10 and the minimum memory slice; whole GPUs:
                 ``count`` n with no capacity requests) allocated by kube-scheduler's own DRA allocator, pods on
                 the default profile;
* ``dra-mostalloc`` DRA with NodeResourcesFit scoring MostAllocated (binpack by CPU/memory requests), which is
                 what a cluster operator can set today without gpuslice.

Every row runs twice: with the nodes' CPU and host memory × 100 (they never bind: GPU placement alone) and, as
``<row>-cpu``, with openb's real CPU and memory (kube-scheduler filters CPU, which the extender does not see while
the simulator's FGD weighs it; and kube-scheduler's CPU-based score plugins then differ between nodes).
Each cluster row is compared with the simulator's ``fgd`` on the same sequence (``sim-fgd``); ``sim-bestfit``
and ``sim-spread`` are given for scale. Also ``replica-noworkload``: the placement core as the extender was before
it learnt FGD's workload (``workload=None``), offline.

    python bench/kube_placement_replay.py [--seeds 4 5 6] [--rows dp-before dp-chart ...] [--out FILE]

Bounded: one control plane per row (about 10 s to start), each replay 15-60 s on a loaded 2-CPU VM; the
default (3 seeds × 5 rows) takes about 12 minutes. Writes a table to --out (default
bench/results/<UTC date>-cpu-kube-replay.txt) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
import openbreplay as rp  # noqa: E402

HARNESS = ROOT / "hack" / "bin" / "controlplane"
HELM = ROOT / "hack" / "bin" / "helm"
LABEL = {"gpuslice-bench/replay": "on"}
TAINT = {"key": "gpuslice-bench/replay", "value": "only", "effect": "NoSchedule"}
TOLERATION = {"key": "gpuslice-bench/replay", "operator": "Exists", "effect": "NoSchedule"}
NS = "replay"
PROFILES = ("dp-before", "dp-chart", "dra", "dra-mostalloc")
ROWS = tuple(f"{p}{suffix}" for p in PROFILES for suffix in ("", "-cpu"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def helm_docs(*sets: str) -> list[dict[str, Any]]:
    args = [str(HELM), "template", "gs", str(ROOT / "deploy" / "helm" / "gpuslice"), "--namespace", "gpuslice-system"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def scheduler_config(row: str, port: int) -> tuple[str, list[str]]:
    """(KubeSchedulerConfiguration yaml, the extender's args) for a row."""
    before = row.startswith("dp-before")
    sets = ["scheduler.extender.weight=1", "scheduler.placementAuthority=false"] if before else []
    docs = helm_docs(*sets)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    if before:
        cfg.pop("percentageOfNodesToScore", None)  # the chart before set none (kube-scheduler's adaptive default)
    cfg["leaderElection"] = {"leaderElect": False}
    cfg["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    default: dict[str, Any] = {"schedulerName": "default-scheduler"}
    if row.startswith("dra-mostalloc"):
        default["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {"scoringStrategy": {
            "type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]}}}]
    cfg["profiles"].append(default)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (ext,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    return yaml.safe_dump(cfg), list(ext["args"])


class ControlPlane:
    def __init__(self, row: str, work: Path):
        self.port = free_port()
        text, self.extender_args = scheduler_config(row, self.port)
        (work / "sched.yaml").write_text(text)
        self.proc = subprocess.Popen([str(HARNESS), "--dir", str(work / "state"), "--scheduler-config",
                                      str(work / "sched.yaml"), "--controllers=resourceclaim-controller"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        deadline = time.monotonic() + 180
        while True:
            line = lines.get(timeout=max(1, deadline - time.monotonic()))
            if line.startswith("GPUSLICE_CONTROLPLANE_READY "):
                self.info = json.loads(line.split(" ", 1)[1])
                break
        self.extender: subprocess.Popen[bytes] | None = None

    def api(self) -> Any:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=self.info["kubeconfig"], client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        return client.ApiClient(cfg)

    def start_extender(self, log: Path) -> None:
        import httpx

        exe = Path(sys.executable).parent / "gpuslice"
        with open(log, "w") as out:
            self.extender = subprocess.Popen([str(exe), *self.extender_args, "--allocation-timeout=0", "--kubeconfig",
                                              self.info["kubeconfig"], "--port", str(self.port)], stdout=out,
                                             stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"extender did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        for p in (self.extender, self.proc):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(40)
                except subprocess.TimeoutExpired:
                    p.kill()


def dra_claim(task: Any, name: str) -> dict[str, Any]:
    if task.num_gpu == 1 and task.gpu_milli < 1000:
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "capacity": {"requests": {
            "compute": str(task.gpu_milli // 10), "memory": "1Gi"}}}}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpuslice.io", "count": task.num_gpu}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}}}


def dra_pod(task: Any, name: str) -> dict[str, Any]:
    requests = {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}
    return {"metadata": {"name": name}, "spec": {
        "nodeSelector": dict(LABEL), "tolerations": [TOLERATION],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": requests,
                                                                     "claims": [{"name": "gpu"}]}}]}}


def publish_slices(cp: ControlPlane, specs: list[Any]) -> None:
    from gpuslice.kube.api import connect
    from gpuslice.kube.dra.api import ClientDraAPI
    from gpuslice.kube.dra.publisher import SlicePublisher
    from gpuslice.kube.dra.resourceslice import Sharing

    api = ClientDraAPI(connect(cp.info["kubeconfig"]))
    for spec in specs:
        SlicePublisher(api, spec.name, rp.node_devices(spec), Sharing()).publish()
    from kubernetes import client

    (dc,) = [d for d in helm_docs("mode=dra") if d["kind"] == "DeviceClass"]
    client.CustomObjectsApi(cp.api()).create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", dc)


def replay(row: str, seed: int, work: Path) -> dict[str, Any]:
    from kubernetes import client

    cp = ControlPlane(row, work)
    try:
        core = client.CoreV1Api(cp.api())
        core.create_namespace({"metadata": {"name": NS}})
        specs = rp.replay_nodes(seed, 50, cpu_scale=1 if row.endswith("-cpu") else 100)
        tasks, capacity = rp.replay_tasks(seed, specs)
        rp.create_nodes(core, specs, LABEL, TAINT)
        names = [f"t-{i:04d}" for i in range(len(tasks))]
        if row.startswith("dra"):
            publish_slices(cp, specs)
            custom = client.CustomObjectsApi(cp.api())
            for t, n in zip(tasks, names):
                custom.create_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", dra_claim(t, n))
            pods = [dra_pod(t, n) for t, n in zip(tasks, names)]
        else:
            cp.start_extender(work / "extender.log")
            pods = [rp.hami_pod(t, n, scheduler="gpuslice-scheduler", policy="fgd", label=LABEL, toleration=TOLERATION)
                    for t, n in zip(tasks, names)]
        started = time.monotonic()
        placed = rp.submit_in_order(core, NS, pods, timeout=120)
        seconds = time.monotonic() - started
        return {"row": row, "seed": seed, "pods": len(tasks), "gpus": capacity, "seconds": seconds,
                "curve": rp.cluster_curve(tasks, names, placed, capacity)}
    finally:
        cp.stop()


def offline(seed: int, cpu_scale: int) -> dict[str, float]:
    """The simulator's policies, and the placement core without a learnt workload, on the same sequence."""
    from gpuslice.placement import NoFit, PlacementPolicy, apply, place
    from gpuslice.sim.trace import build_nodes

    specs = rp.replay_nodes(seed, 50, cpu_scale=cpu_scale)
    out: dict[str, Any] = {f"sim-{p}": list(rp.simulated(seed, specs, p).alloc_curve) for p in ("fgd", "bestfit", "spread")}
    tasks, capacity = rp.replay_tasks(seed, specs)
    nodes = {n.name: n for n in build_nodes(specs)}
    placed: dict[str, str | None] = {}
    for k, t in enumerate(tasks):  # the extender before: FGD weighing only the request being placed
        cand = [n for n in nodes.values() if n.cpu_milli - n.cpu_used >= t.cpu_milli]
        try:
            p = place(t.request(), cand, PlacementPolicy.parse("fgd"), cpu_milli=t.cpu_milli, host_memory=t.host_memory)
        except NoFit:
            continue
        nodes[p.node] = apply(nodes[p.node], p.slices, exclusive=p.exclusive, cpu_milli=t.cpu_milli,
                              host_memory=t.host_memory)
        placed[str(k)] = p.node
    out["replica-noworkload"] = rp.cluster_curve(tasks, [str(k) for k in range(len(tasks))], placed, capacity)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[4, 5, 6])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not HARNESS.exists() or not HELM.exists():
        sys.exit("build the control plane and helm first: make -C hack")
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    out = a.out or ROOT / "bench" / "results" / f"{day}-cpu-kube-replay.txt"
    results: list[dict[str, Any]] = []
    lines = [f"# openb replay through kube-scheduler v1.37 vs the simulator, {day}, host {os.uname().nodename}, "
             f"load {os.getloadavg()[0]:.1f}", "# allocation ratio (% of GPU capacity) when the arrived GPU demand first reaches X % of capacity"]
    for seed in a.seeds:
        ref = {100: offline(seed, 100), 1: offline(seed, 1)}
        for row in a.rows:
            with tempfile.TemporaryDirectory(prefix="gpuslice-replay-") as tmp:
                r = replay(row, seed, Path(tmp))
            sims = ref[1 if row.endswith("-cpu") else 100]
            r.update(sims)
            results.append(r)
            at = (90, 100, 110, 130)
            cells = "  ".join(f"{x}%: {r['curve'][x]:6.2f} / {sims['sim-fgd'][x]:6.2f}" for x in at)
            worst = max(r["curve"][x] - sims["sim-fgd"][x] for x in rp.LOADS)
            least = min(r["curve"][x] - sims["sim-fgd"][x] for x in rp.LOADS)
            others = "  ".join(f"{k} {sims[k][100]:.2f}" for k in ("sim-bestfit", "sim-spread", "replica-noworkload"))
            line = (f"seed {seed} {row:18s} pods {r['pods']:4d}  cluster / sim-fgd at arrived {cells}  "
                    f"diff over 60-130 %: {least:+.2f} .. {worst:+.2f}  (at 100 %: {others}; {r['seconds']:.0f} s)")
            print(line, flush=True)
            lines.append(line)
    lines.append("# per row, mean over seeds of the largest |cluster - sim-fgd| over arrived 60..130 %: " + ", ".join(
        f"{row} {sum(max(abs(r['curve'][x] - r['sim-fgd'][x]) for x in rp.LOADS) for r in results if r['row'] == row) / max(1, sum(1 for r in results if r['row'] == row)):.2f}"
        for row in a.rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
