"""Replaying a slice of the openb trace through a real kube-scheduler, and through the simulator on the same pods.

Used by tests/e2e/test_kube_placement_authority.py (device-plugin mode, asserting the cluster allocates what the
simulator allocates) and bench/kube_placement_replay.py (both modes and several scheduler profiles, reported).

* nodes: ``count`` GPU nodes of openb's node list, sampled with ``seed``; GPU count and model as in the trace,
  CPU and host memory × ``cpu_scale`` (100: they never bind, so the comparison isolates GPU placement — the
  extender does not see CPU, kube-scheduler filters it; that gap is measured on its own in the bench);
* pods: the simulator's inflation sequence (``gpuslice.sim.engine.draw_inflation``, GPU tasks only) for those
  nodes — uniform draws with replacement until GPU demand reaches 1.3 × capacity — each as the HAMi pod a user
  would write for it: ``nvidia.com/gpu: 1`` + ``gpumem-percentage`` + ``gpucores`` (= gpu_milli / 10) for a
  share, ``nvidia.com/gpu: n`` + ``gpucores: 100`` (whole devices) otherwise, with the task's CPU and memory;
* submitted one at a time, as the simulator places them: the next pod is created when the previous one is
  bound or marked unschedulable;
* allocation ratio = GPU demand of the bound pods / GPU capacity, in % (the simulator's ``final_alloc``).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
GiB = 1024**3


def replay_nodes(seed: int, count: int, cpu_scale: int = 100) -> list[Any]:
    from gpuslice.sim.trace import load_nodes

    pool = [n for n in load_nodes(DATA / "openb_node_list_gpu_node.csv") if n.gpus]
    picked = random.Random(seed).sample(pool, count)
    return [replace(n, name=f"openb-{i:02d}", cpu_milli=n.cpu_milli * cpu_scale, memory_mib=n.memory_mib * cpu_scale)
            for i, n in enumerate(picked)]


def replay_tasks(seed: int, specs: Sequence[Any], trace: str = "openb_pod_list_default.csv") -> tuple[list[Any], float]:
    """(the arrival sequence, GPU capacity) — exactly what the simulator replays for ``seed``."""
    from gpuslice.sim.engine import SimConfig, draw_inflation
    from gpuslice.sim.trace import load_tasks

    capacity = float(sum(n.gpus for n in specs))
    return draw_inflation(load_tasks(DATA / trace), capacity, SimConfig(seed=seed, cpu_tasks="skip")), capacity


def simulated(seed: int, specs: Sequence[Any], policy: str, trace: str = "openb_pod_list_default.csv") -> Any:
    """The simulator's :class:`~gpuslice.sim.engine.InflationResult` (``alloc_curve``, ``final_alloc``)."""
    from gpuslice.placement import PlacementPolicy
    from gpuslice.sim.engine import SimConfig, run_inflation
    from gpuslice.sim.trace import load_tasks

    return run_inflation(load_tasks(DATA / trace), list(specs), PlacementPolicy.parse(policy),
                         SimConfig(seed=seed, cpu_tasks="skip"))


def simulated_ratio(seed: int, specs: Sequence[Any], policy: str, trace: str = "openb_pod_list_default.csv") -> float:
    return simulated(seed, specs, policy, trace).final_alloc


def node_devices(spec: Any) -> list[Any]:
    from gpuslice.sim.trace import GPU_MEMORY_GIB
    from gpuslice.spec import Device

    return [Device(uuid=f"GPU-{spec.name}-{j}", index=j, name=f"NVIDIA {spec.model}", model=spec.model,
                   memory_total=GPU_MEMORY_GIB.get(spec.model, 16) * GiB, sm_count=80) for j in range(spec.gpus)]


def node_object(spec: Any, label: dict[str, str], taint: dict[str, str], split: int = 10) -> dict[str, Any]:
    from gpuslice.kube import formats

    anns = {formats.NODE_DEVICES: formats.encode_node_devices(node_devices(spec), split_count=split)}
    return {"metadata": {"name": spec.name, "labels": {"kubernetes.io/hostname": spec.name, **label},
                         "annotations": anns}, "spec": {"taints": [taint]}}


def node_status(spec: Any, split: int = 10) -> dict[str, Any]:
    capacity = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": "1000",
                "nvidia.com/gpu": str(spec.gpus * split)}
    return {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node"}]}}


def create_nodes(core: Any, specs: Sequence[Any], label: dict[str, str], taint: dict[str, str]) -> None:
    for spec in specs:
        core.create_node(node_object(spec, label, taint))
        core.patch_node_status(spec.name, node_status(spec))
        # The API server's TaintNodesByCondition adds not-ready; keep only our own taint.
        core.patch_node(spec.name, {"spec": {"taints": [taint]}})


def hami_pod(task: Any, name: str, *, scheduler: str, policy: str, label: dict[str, str],
             toleration: dict[str, str]) -> dict[str, Any]:
    if task.num_gpu == 1 and task.gpu_milli < 1000:
        share = str(task.gpu_milli // 10)
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": share, "nvidia.com/gpucores": share}
    else:
        limits = {"nvidia.com/gpu": str(task.num_gpu), "nvidia.com/gpucores": "100"}
    requests = {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpuslice.io/policy": policy}},
            "spec": {"schedulerName": scheduler, "nodeSelector": dict(label), "tolerations": [toleration],
                     "containers": [{"name": "main", "image": "x", "resources": {
                         "limits": {**limits, **requests}, "requests": {**limits, **requests}}}]}}


def unschedulable(pod: Any) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in (pod.status.conditions or []))


def submit_in_order(core: Any, namespace: str, pods: Sequence[dict[str, Any]], timeout: float = 60.0,
                    on_each: Callable[[str, str | None], None] | None = None) -> dict[str, str | None]:
    """Create each pod once the previous one is bound (its node) or unschedulable (None). An unschedulable pod
    is deleted at once: the simulator never retries a task that did not fit, and kube-scheduler would retry it
    whenever a Node changes (every bind writes the node's ledger)."""
    placed: dict[str, str | None] = {}
    for body in pods:
        name = body["metadata"]["name"]
        core.create_namespaced_pod(namespace, body)
        deadline = time.monotonic() + timeout
        while True:
            pod = core.read_namespaced_pod(name, namespace)
            if pod.spec.node_name or unschedulable(pod):
                placed[name] = pod.spec.node_name or None
                if not pod.spec.node_name:
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {name} neither bound nor unschedulable after {timeout}s: "
                                     f"{pod.status.conditions}")
            time.sleep(0.02)
        if on_each:
            on_each(name, placed[name])
    return placed


def cluster_ratio(tasks: Sequence[Any], names: Sequence[str], placed: dict[str, str | None], capacity: float) -> float:
    return sum(t.gpu_demand for t, n in zip(tasks, names) if placed.get(n)) / capacity * 100


def cluster_curve(tasks: Sequence[Any], names: Sequence[str], placed: dict[str, str | None], capacity: float,
                  points: int = 131) -> list[float]:
    """Allocation % when the arrived load first reaches 0, 1, …, 130 % of capacity — the simulator's
    ``alloc_curve``, for the cluster's outcomes."""
    curve = [float("nan")] * points
    arrived = allocated = 0.0
    k = 0
    for t, n in zip(tasks, names):
        arrived += t.gpu_demand
        if placed.get(n):
            allocated += t.gpu_demand
        while k < points and arrived / capacity * 100 >= k:
            curve[k] = allocated / capacity * 100
            k += 1
    return curve


LOADS = (60, 70, 80, 90, 100, 110, 120, 130)  # arrived load (% of capacity) the comparisons read the curves at
