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

from gpuslice.host.backstop import Backstop, BackstopReport, Policy, Tracked
from gpuslice.kube import formats
from gpuslice.spec import Device

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


def container_of(cgroup: str) -> str | None:
    """The container ID a ``/proc/<pid>/cgroup`` text places its process in, or ``None``.

    On each line it is the *first* ID along the path: the runtime's scope of the container. Anything below it is
    the container's own (with cgroup delegation a tenant can make ``…/cri-containerd-<own>.scope/<victim's ID>``,
    and reading any ID on the path attributed its processes to the victim, whose processes the backstop would
    then kill). Lines that place the process in different containers prove nothing: ``None``."""
    found = {m.group(0) for line in cgroup.splitlines() if (m := _ID.search(line.partition(":")[2].partition(":")[2]))}
    return found.pop() if len(found) == 1 else None


def attribute_by_cgroup(by_container: dict[str, str], pids: Sequence[int],
                        proc_root: Path = Path("/proc")) -> dict[int, str]:
    """``{pid: grant id}`` for the ``pids`` whose cgroup places them in a container of ``by_container``
    (:func:`container_of`)."""
    out = {}
    for pid in pids:
        try:
            # bytes, not text: a container may name its own cgroups (delegation) with any bytes, and one that is
            # not UTF-8 must not stop the backstop for every pod (procs.read_text says the same of names)
            text = (proc_root / str(pid) / "cgroup").read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            continue
        cid = container_of(text)
        if cid in by_container:
            out[pid] = by_container[cid]
    return out


def tracked(ledger: formats.Ledger) -> list[Tracked]:
    return [Tracked(c.grant_id, s.device_uuid, s.memory_limit, f"{g.namespace}/{g.pod}/{c.container}")
            for g in ledger.entries.values() for c in g.containers for s in c.slices]


class KubeBackstop:
    """Runs :meth:`check_once` every ``interval`` seconds in a thread; :attr:`latest` is the last report.

    ``ledger()`` gives the node's grants, ``tracked_of(grants)`` their slices and ``containers_of(grants, pods)``
    ``{container ID: grant id}``: by default the device plugin's node ledger (:func:`tracked`,
    :func:`container_grants`); the DRA driver passes its prepared claims (``gpuslice.kube.dra.backstop``)."""

    def __init__(self, backstop: Backstop, ledger: Callable[[], Any],
                 pods: Callable[[], Sequence[dict[str, Any]]], interval: float = 2.0, pods_ttl: float = 10.0,
                 proc_root: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic,
                 tracked_of: Callable[[Any], list[Tracked]] | None = None,
                 containers_of: Callable[[Any, Sequence[dict[str, Any]]], dict[str, str]] | None = None):
        self.backstop = backstop
        self.ledger = ledger
        self.tracked_of = tracked_of or tracked
        self.containers_of = containers_of or container_grants
        self.pods = pods
        self.interval = interval
        self.pods_ttl = pods_ttl
        self.proc_root = proc_root
        self.clock = clock
        self.latest: BackstopReport | None = None
        self._pods: Sequence[dict[str, Any]] = ()
        self._pods_at = float("-inf")
        self._stop = threading.Event()

    def _containers(self, ledger: Any, fresh: bool) -> dict[str, str]:
        if fresh or self.clock() - self._pods_at >= self.pods_ttl:
            try:
                self._pods = list(self.pods())
                self._pods_at = self.clock()
            except Exception as exc:  # keep the last list; the next round asks again
                log.warning("backstop: listing the node's pods failed: %s", exc)
        return self.containers_of(ledger, self._pods)

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

        self.latest = self.backstop.check(self.tracked_of(ledger), attribute)
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


def start_backstop(policy: Policy, interval: float, devices: Sequence[Device], grants: Callable[[], Any],
                   pods: Callable[[], Sequence[dict[str, Any]]], say: Callable[[str], None],
                   **hooks: Any) -> KubeBackstop | None:
    """The backstop thread of a node agent, or None when the policy is off or NVML cannot count processes
    (a device snapshot, or a driver without per-process counts): said on ``say`` either way."""
    from gpuslice.host.backstop import default_source

    if policy.action == "off":
        return None
    uuids = [u for d in devices for u in ((m.uuid for m in d.mig_instances) if d.mig_instances else (d.uuid,))]
    source = default_source(uuids)
    if source is None:
        say("backstop off: no per-process device memory (a device snapshot, or NVML without process counts)")
        return None
    guard = KubeBackstop(Backstop(source, policy), grants, pods, interval=interval, **hooks)
    guard.start()
    say(f"backstop: {policy.action}, grace {policy.grace:g} s, every {interval:g} s")
    return guard
