"""Garbage collection of the node ledgers: entries whose pod is gone, finished, bound elsewhere or left
unbound after its bind, and allocation-lock holders that no longer hold the lock. A mixin of
:class:`~gpuslice.kube.extender.core.Extender` (it writes through the bind transaction's
``_update_ledger``)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from gpuslice.kube import alloclock, formats
from gpuslice.spec import SpecError

log = logging.getLogger("gpuslice.extender")


class GarbageCollection:
    """``collect_garbage`` and its two rules (mixed into the Extender)."""

    def collect_garbage(self) -> int:
        """Take back ledger entries whose pod is gone, finished, bound to another node, or unbound for
        longer than ``gc_grace`` after its bind; drop allocation-lock holders that no longer hold it.
        Returns how many ledger entries were removed."""
        api = self.api
        assert api is not None
        started = self.clock()
        # From the API server's watch cache: an entry is only taken back when its pod has been gone
        # for 30 s or unbound for gc_grace, far longer than the cache can lag.
        pods = {(p.get("metadata") or {}).get("uid"): p for p in api.list_pods(resource_version="0")}
        nodes, _ = api.list_nodes()
        removed = 0
        for node in nodes:
            name = (node.get("metadata") or {}).get("name", "")
            anns = (node.get("metadata") or {}).get("annotations") or {}
            try:
                ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), name)
                allocating = formats.decode_allocating(anns.get(formats.NODE_ALLOCATING))
            except SpecError as exc:
                log.error("node %s: %s", name, exc)
                continue
            stale = {uid for uid, g in ledger.entries.items() if self._stale(uid, g, name, pods, started)}
            kept = ledger.without(stale)
            loose = {uid for uid in allocating if self._loose(uid, kept, pods, started)}
            if stale or loose:
                def drop(led: formats.Ledger, alloc: frozenset[str], stale: set[str] = stale, loose: set[str] = loose,
                         name: str = name) -> tuple[formats.Ledger, frozenset[str]]:
                    # re-check against the fresh node: only what is still stale / loose there (a bind may
                    # have committed since the list)
                    led = led.without(u for u in stale if u in led.entries
                                      and self._stale(u, led.entries[u], name, pods, started))
                    return led, frozenset(u for u in alloc if not (u in loose and self._loose(u, led, pods, started)))
                with self._lock(name):
                    if self._update_ledger(name, drop):
                        removed += len(stale)
        return removed

    def _loose(self, uid: str, ledger: formats.Ledger, pods: Mapping[str, Any], started: float) -> bool:
        """Whether an allocation-lock holder no longer holds the lock: no ledger entry, timed out (or the
        lock is off), or its pod (from the list) released it — a pod missing from the list only after
        the same 30 s as its ledger entry (the list comes from the watch cache)."""
        entry = ledger.entries.get(uid)
        if entry is None or not self.allocation_timeout or entry.bound_at < started - self.allocation_timeout:
            return True
        pod = pods.get(uid)
        if pod is None:
            return entry.bound_at < started - min(self.gc_grace, 30.0)
        return bool(alloclock.released(pod, entry))

    def _stale(self, uid: str, grant: formats.PodGrant, node: str, pods: Mapping[str, Any], started: float) -> bool:
        old = grant.bound_at < started - self.gc_grace
        pod = pods.get(uid)
        if pod is None:
            return grant.bound_at < started - min(self.gc_grace, 30.0)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return True
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and bound != node:
            return True
        return not bound and old
