"""CPU and host memory the pods bound to each node request: the part of a node FGD weighs besides its GPUs.

kube-scheduler filters CPU and memory itself, so the extender never needed them to be correct; but FGD's
fragmentation counts a node's free GPUs as lost to a task shape when the node lacks the CPU for it (the FGD
paper, and gpuslice's simulator), and best-fit weighs free CPU. Without this view the extender's FGD packed GPU
pods onto nodes whose CPU then ran out: on openb slices with the trace's real CPU it allocated 0.9–1.2 points
less than the simulator (bench/kube_placement_replay.py).

:class:`PodUsage` keeps ``{node: (cpu milli, memory bytes)}`` from a list + watch of all pods, counting the bound
ones that are not finished, with kube-scheduler's formula per pod
(:func:`pod_requests`: containers summed, at least the largest init container, plus the pod overhead). A pod the
extender binds is counted at once (:meth:`PodUsage.assume`), before its watch event arrives. It lags the API
server by the watch's delay; it only steers scoring — a node kube-scheduler finds without room never gets the pod.

Every pod the watch shows being created is also handed to ``on_pod``: the extender learns FGD's workload from the
pods as they arrive, including the ones kube-scheduler's own filters turn away before it ever calls the extender
(a pod needing more CPU than any node has left): the simulator's workload counts every arrival. The pods a list
shows (at start, after a watch broke) are not arrivals: a restarted extender learns from the pods that come.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

from gpuslice.kube.api import KubeAPI
from gpuslice.kube.extender.follow import follow
from gpuslice.kube.resources import parse_quantity
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.extender")
FINISHED = ("Succeeded", "Failed")


def _requests(container: Mapping[str, Any]) -> tuple[int, int]:
    res = (container.get("resources") or {})
    req = dict(res.get("limits") or {})  # a limit without a request defaults the request (cpu, memory)
    req.update(res.get("requests") or {})
    cpu = mem = 0
    try:
        if "cpu" in req:
            cpu = int(parse_quantity("cpu", req["cpu"]) * 1000)
        if "memory" in req:
            mem = int(parse_quantity("memory", req["memory"]))
    except SpecError:
        return 0, 0  # the API server validated it; an unreadable one counts as nothing rather than failing
    return max(cpu, 0), max(mem, 0)


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory bytes) a pod requests, as kube-scheduler counts them."""
    spec = pod.get("spec") or {}
    cpu = mem = 0
    for c in spec.get("containers") or []:
        c_cpu, c_mem = _requests(c)
        cpu, mem = cpu + c_cpu, mem + c_mem
    for c in spec.get("initContainers") or []:
        i_cpu, i_mem = _requests(c)
        cpu, mem = max(cpu, i_cpu), max(mem, i_mem)
    overhead = {"resources": {"requests": spec.get("overhead") or {}}}
    o_cpu, o_mem = _requests(overhead)
    return cpu + o_cpu, mem + o_mem


class PodUsage:
    """Per node, what the pods bound there request; ``version`` / :meth:`changes_since` let the fleet index
    follow. ``api`` needs ``list_pods_at`` (and ``watch_pods``; without it the list is polled)."""

    def __init__(self, api: KubeAPI | None = None, poll_interval: float = 2.0,
                 on_pod: Callable[[Mapping[str, Any]], None] | None = None):
        self.api = api
        self.poll_interval = poll_interval
        self.on_pod = on_pod
        self._pods: dict[str, tuple[str, int, int]] = {}
        self._nodes: dict[str, list[int]] = {}
        self._changed: dict[str, int] = {}
        self.version = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    # ------------------------------------------------------------------------------------ state
    def _set(self, uid: str, entry: tuple[str, int, int] | None) -> None:
        """Replace pod ``uid``'s contribution (lock held)."""
        old = self._pods.pop(uid, None)
        if old == entry:
            if entry is not None:
                self._pods[uid] = entry
            return
        for e, sign in ((old, -1), (entry, 1)):
            if e is None:
                continue
            node, cpu, mem = e
            sums = self._nodes.setdefault(node, [0, 0])
            sums[0] += sign * cpu
            sums[1] += sign * mem
            self.version += 1
            self._changed[node] = self.version
        if entry is not None:
            self._pods[uid] = entry

    def put(self, pod: Mapping[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = str(meta.get("uid") or ""), str(spec.get("nodeName") or "")
        if not uid:
            return
        done = (pod.get("status") or {}).get("phase") in FINISHED
        with self._lock:
            self._set(uid, None if done or not node else (node, *pod_requests(pod)))

    def remove(self, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        with self._lock:
            self._set(uid, None)

    def assume(self, pod: Mapping[str, Any], node: str) -> None:
        """A pod the extender just bound to ``node``: counted now (the watch confirms it later)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid:
            with self._lock:
                self._set(uid, (node, *pod_requests(pod)))

    def usage(self, node: str) -> tuple[int, int]:
        with self._lock:
            cpu, mem = self._nodes.get(node, (0, 0))
            return cpu, mem

    def changes_since(self, version: int) -> tuple[int, dict[str, tuple[int, int]]]:
        with self._lock:
            return self.version, {n: (self._nodes[n][0], self._nodes[n][1])
                                  for n, v in self._changed.items() if v > version}

    # ------------------------------------------------------------------------------------ list + watch
    def refresh(self) -> str:
        assert self.api is not None
        items, rv = self.api.list_pods_at()  # type: ignore[attr-defined]
        with self._lock:
            seen = set()
            for pod in items:
                meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
                uid = str(meta.get("uid") or "")
                seen.add(uid)
                node = str(spec.get("nodeName") or "")
                done = (pod.get("status") or {}).get("phase") in FINISHED
                self._set(uid, None if done or not node else (node, *pod_requests(pod)))
            for uid in [u for u in self._pods if u not in seen]:
                self._set(uid, None)
        self.synced.set()
        return rv

    def _tell(self, pod: Mapping[str, Any]) -> None:
        if self.on_pod is not None:
            try:
                self.on_pod(pod)
            except Exception as exc:  # a listener's bug must not stop the usage view
                log.warning("pod usage listener: %s", exc)

    def start(self) -> None:
        if self._thread is None and self.api is not None:
            self._thread = threading.Thread(target=self._run, name="gpuslice-pod-usage", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        follow("pod usage", self.refresh, getattr(self.api, "watch_pods", None), self._event, self._stop,
               self.poll_interval)

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self.put(pod)
            if kind == "ADDED":
                self._tell(pod)
        elif kind == "DELETED":
            self.remove(pod)
