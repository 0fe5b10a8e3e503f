"""The backstop on a Kubernetes node (``gpuslice kube-agent``): which container a GPU process belongs to, from
its cgroup, and the loop that holds every container's slice to its limit in NVML's count.

A process cannot leave the cgroup of its container (only the node's root can move it), so the cgroup proves
membership where a region or an environment variable could be forged: the container runtime names each
container's cgroup after its container ID (``…/cri-containerd-<id>.scope``, ``…/pod<uid>/<id>``,
``crio-<id>.scope``, ``docker-<id>.scope``), and the pod's ``status.containerStatuses[].containerID`` maps the
ID to the container, whose grant the node's ledger names. The agent must see the node's processes: the chart
runs it with ``hostPID: true``. The rules themselves (tolerance, grace, report then kill, processes of no slice
reported) are :mod:`gpuslice.host.backstop`'s, the same as in local mode.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from gpuslice.host.backstop import Backstop, BackstopReport, Tracked
from gpuslice.kube import formats

log = logging.getLogger("gpuslice.kube-backstop")
_ID = re.compile(r"[0-9a-f]{64}")


def container_grants(ledger: formats.Ledger, pods: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``{container ID: grant id}`` of the ledger's containers whose pods report a container ID."""
    by_uid = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    out = {}
    for entry in ledger.entries.values():
        pod = by_uid.get(entry.pod_uid)
        if pod is None:
            continue
        ids = {s.get("name"): str(s.get("containerID") or "").split("://", 1)[-1]
               for s in (pod.get("status") or {}).get("containerStatuses") or [] if isinstance(s, dict)}
        for c in entry.containers:
            cid = ids.get(c.container, "")
            if _ID.fullmatch(cid):
                out[cid] = c.grant_id
    return out


def attribute_by_cgroup(by_container: dict[str, str], pids: Sequence[int],
                        proc_root: Path = Path("/proc")) -> dict[int, str]:
    """``{pid: grant id}`` for the ``pids`` whose cgroup names a container of ``by_container``."""
    out = {}
    for pid in pids:
        try:
            text = (proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            continue
        for cid in _ID.findall(text):
            if cid in by_container:
                out[pid] = by_container[cid]
                break
    return out


def tracked(ledger: formats.Ledger) -> list[Tracked]:
    return [Tracked(c.grant_id, s.device_uuid, s.memory_limit, f"{g.namespace}/{g.pod}/{c.container}")
            for g in ledger.entries.values() for c in g.containers for s in c.slices]


class KubeBackstop:
    """Runs :meth:`check_once` every ``interval`` seconds in a thread; :attr:`latest` is the last report."""

    def __init__(self, backstop: Backstop, ledger: Callable[[], formats.Ledger],
                 pods: Callable[[], Sequence[dict[str, Any]]], interval: float = 2.0, pods_ttl: float = 10.0,
                 proc_root: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic):
        self.backstop = backstop
        self.ledger = ledger
        self.pods = pods
        self.interval = interval
        self.pods_ttl = pods_ttl
        self.proc_root = proc_root
        self.clock = clock
        self.latest: BackstopReport | None = None
        self._pods: Sequence[dict[str, Any]] = ()
        self._pods_at = float("-inf")
        self._stop = threading.Event()

    def _containers(self, ledger: formats.Ledger, fresh: bool) -> dict[str, str]:
        if fresh or self.clock() - self._pods_at >= self.pods_ttl:
            try:
                self._pods = list(self.pods())
                self._pods_at = self.clock()
            except Exception as exc:  # keep the last list; the next round asks again
                log.warning("backstop: listing the node's pods failed: %s", exc)
        return container_grants(ledger, self._pods)

    def check_once(self) -> BackstopReport:
        ledger = self.ledger()
        by_container = self._containers(ledger, fresh=False)

        def attribute(pids: Sequence[int]) -> dict[int, str]:
            nonlocal by_container
            found = attribute_by_cgroup(by_container, pids, self.proc_root)
            if len(found) < len(pids) and self.clock() - self._pods_at >= 1.0:  # a container started since
                by_container = self._containers(ledger, fresh=True)
                found = attribute_by_cgroup(by_container, pids, self.proc_root)
            return found

        self.latest = self.backstop.check(tracked(ledger), attribute)
        return self.latest

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:  # never let the loop die: log and try again next round
                log.exception("backstop check failed")

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="gpuslice-backstop", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
