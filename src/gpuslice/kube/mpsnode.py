"""The node agent's MPS daemons in Kubernetes: stopped once no spatial container on the node needs them.

Allocate starts a spatial container's daemon (first use, :class:`gpuslice.kube.allocator.Allocator`). This
loop, every ``interval`` seconds and once at the agent's start, reads the node's ledger (the extender's
``gpuslice.io/ledger``: the grants of the pods bound here, dropped when a pod ends) and the pods bound here
(for each container's ``runAsUser``), and makes the running daemons exactly those the spatial containers
need — plus the ones Allocate started within ``grace`` seconds, which a ledger read a moment old may not
show yet. So a daemon whose last pod ended is stopped, one left by an agent that was killed (its container
restarted: the daemons died with it, their stale pipes remain) is cleared or started again for the pods that
still hold grants.

A daemon in fault (its logs report a fatal client error) is restarted only once no spatial grant on its
device is held: from the node agent the containers' processes cannot be told apart (they live in the pods'
pid namespaces), so every held grant counts as a client. MPS itself takes new clients again once all the
faulted ones have exited.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterator, Mapping

from gpuslice.enforcer.policy import RosterChanges
from gpuslice.host.mpsfleet import DaemonKey, Reconciled
from gpuslice.kube import formats
from gpuslice.kube.allocator import Allocator
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.mps")


def _spatial_clients(ledger: formats.Ledger, pods: list[Mapping[str, Any]]) -> Iterator[tuple[str, DaemonKey, bool]]:
    """Each spatial container of ``ledger``: its grant id, the MPS daemon it is a client of (its device, its user
    from its pod's spec, its tenant from its namespace: :meth:`Allocator.daemon_key`), and whether its pod is in
    ``pods`` (without it the user is a guess: the default of an empty spec)."""
    by_uid = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    for entry in ledger.entries.values():
        pod = by_uid.get(entry.pod_uid)
        for c in entry.containers:
            key = Allocator.daemon_key(c, pod or {}, entry.namespace)
            if key is not None:
                yield c.grant_id, key, pod is not None


def wanted_daemons(ledger: formats.Ledger, pods: list[Mapping[str, Any]]) -> set[DaemonKey]:
    """The daemons the spatial containers of ``ledger`` are clients of; one whose pod is not in ``pods`` still
    wants one (its user guessed): a daemon is never stopped because a pod list missed its pod."""
    return {key for _, key, _ in _spatial_clients(ledger, pods)}


def _grants(ledger: formats.Ledger) -> dict[str, tuple]:
    """The device plugin's grants on the node: grant id -> its slices."""
    return {c.grant_id: c.grant.slices for entry in ledger.entries.values() for c in entry.containers}


def _daemons(ledger: formats.Ledger, pods: list[Mapping[str, Any]], allocator: Allocator) -> dict[str, str]:
    """The spatial grants of ``ledger`` whose pod is in ``pods``: grant id -> the roster's name for its MPS daemon
    (its host pipe folder, :meth:`Allocator.roster_daemon`, as Allocate wrote it). A grant whose pod is not known
    is left out: its daemon would be a guess, and a roster entry is never rewritten with one."""
    return {gid: allocator.daemon_folder(key) for gid, key, known in _spatial_clients(ledger, pods) if known}


class MpsNode:
    def __init__(self, api: KubeAPI, node: str, allocator: Allocator, interval: float = 10.0, grace: float = 120.0):
        self.api = api
        self.node = node
        self.allocator = allocator
        self.interval = interval
        self.grace = grace
        self._stop = threading.Event()

    def reconcile_once(self) -> Reconciled | None:
        """One pass; None when the node's state cannot be read (nothing is stopped on a failed read)."""
        try:
            anns = (self.api.get_node(self.node).get("metadata") or {}).get("annotations") or {}
            ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), self.node)
            pods = self.api.list_pods(field_selector=f"spec.nodeName={self.node}")
        except (KubeError, SpecError) as exc:
            log.warning("MPS daemons: cannot read node %s: %s; left as they are", self.node, exc)
            return None
        self.reconcile_rosters(ledger, pods)
        self.prune_grant_folders(ledger, pods)
        now = time.monotonic()
        recent = {k for k, t in self.allocator.mps_started.items() if now - t < self.grace}
        wanted = wanted_daemons(ledger, pods) | recent
        if not wanted and not self.allocator.mps.known():
            return Reconciled()
        done = self.allocator.mps.reconcile(wanted, busy=lambda key: True)
        for key in done.started:
            log.info("MPS daemon of %s (uid %s) started", key.device, key.uid)
        for key in done.stopped:
            log.info("MPS daemon of %s (uid %s) stopped: no spatial container needs it", key.device, key.uid)
        for key, why in done.problems.items():
            log.warning("MPS daemon of %s (uid %s): %s", key.device, key.uid, why)
        return done

    def reconcile_rosters(self, ledger: formats.Ledger, pods: list[Mapping[str, Any]]) -> RosterChanges:
        """The devices' policy rosters brought in line with the node's ledger: a grant of the device plugin's
        that is missing from them (written before the roster existed, removed by hand) is written again, and
        the grants of pods that ended are taken off (the pacers' lists are bounded: ``GS_POL_MAX``); a file
        written within ``grace`` stays as it is (a ledger read a moment old may not hold it yet). The DRA
        driver's grants are its own (written at prepare, removed at unprepare). ``pods``: the node's pods, whose specs
        name each spatial container's daemon (required: without them a spatial entry would be rewritten naming
        none)."""
        done = self.allocator.reconcile_policies(_grants(ledger), self.grace, _daemons(ledger, pods, self.allocator))
        done.log(log)
        return done

    def prune_grant_folders(self, ledger: formats.Ledger, pods: list[Mapping[str, Any]]) -> tuple[str, ...]:
        """Remove the host files (slice file, region, device-state folder, slice record files) of the device plugin's
        grants whose pod is gone: in neither the node's ledger nor its pod list, and older than ``grace``."""
        keep = set(_grants(ledger))
        keep |= {formats.grant_id_for(uid, "") for uid in
                 ((p.get("metadata") or {}).get("uid") for p in pods) if uid}
        gone = self.allocator.prune_grant_folders(keep, self.grace)
        if gone:
            log.info("grant folders of %d ended container(s) removed", len(gone))
        return gone

    def run(self) -> None:
        while True:
            try:
                self.reconcile_once()
            except Exception as exc:  # the loop must outlive a bad pass
                log.warning("MPS daemons: %s", exc)
            if self._stop.wait(self.interval):
                return

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="gpuslice-mps", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
