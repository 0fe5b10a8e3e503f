"""Kubernetes labels (namespace, pod, container) for the node exporter's slice metrics.

The exporter (``gpuslice.node.metrics``) labels every slice series with ``grant``; in local mode its
``namespace``/``pod``/``container`` labels are empty. In Kubernetes a grant id is
``k-<pod uid>-<container>`` and the node's ledger (``gpuslice.io/ledger``) maps it to the pod:

* :func:`grant_labels` — ``{grant id: KubeLabels}`` from a ledger;
* :class:`LedgerLabels` — a resolver ``grant_id -> KubeLabels | None`` reading the node's ledger through
  the API server at most every ``ttl`` seconds (one GET of the Node, no pod list);
* :func:`grant_records` — the ledger's grants as the node monitor's ``GrantRecord`` s (region files at
  ``<state>/kube/regions/<id>/region``, where the device plugin mounts them), so ``Monitor.sample``
  reads Kubernetes slices exactly like local ones;
* :class:`KubeLabelCollector` — wraps any prometheus collector (``ViewCollector``) and fills the empty
  ``namespace``/``pod``/``container`` labels of series that carry a ``grant`` label.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from prometheus_client.registry import Collector

from gpuslice.kube import codec
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.spec import Request


@dataclass(frozen=True)
class KubeLabels:
    namespace: str
    pod: str
    container: str


def grant_labels(ledger: codec.Ledger) -> dict[str, KubeLabels]:
    return {c.grant_id: KubeLabels(g.namespace, g.pod, c.container)
            for g in ledger.entries.values() for c in g.containers}


class LedgerLabels:
    """``resolver(grant_id)`` -> :class:`KubeLabels` (or ``None``), from the node's ledger annotation."""

    def __init__(self, api: KubeAPI, node: str, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.node = node
        self.ttl = ttl
        self.clock = clock
        self._table: dict[str, KubeLabels] = {}
        self._ledger = codec.Ledger({})
        self._at = float("-inf")
        self._lock = threading.Lock()

    def ledger(self) -> codec.Ledger:
        with self._lock:
            if self.clock() - self._at >= self.ttl:
                try:
                    node = self.api.get_node(self.node)
                    anns = (node.get("metadata") or {}).get("annotations") or {}
                    self._ledger = codec.decode_ledger(anns.get(codec.NODE_LEDGER), self.node)
                    self._table = grant_labels(self._ledger)
                except (KubeError, codec.SpecError):
                    pass  # keep the last good table; the next scrape tries again
                self._at = self.clock()
            return self._ledger

    def __call__(self, grant_id: str) -> KubeLabels | None:
        self.ledger()
        return self._table.get(grant_id)


def grant_records(ledger: codec.Ledger, state_dir: Path) -> list:
    """The ledger's container grants as ``gpuslice.node.records.GrantRecord`` for ``Monitor.sample``."""
    from gpuslice.node.records import GrantRecord

    out = []
    for g in ledger.entries.values():
        for c in g.containers:
            first = c.slices[0]
            request = Request(count=len(c.slices), compute=first.compute, priority=first.priority,
                              mode=first.mode, weight=first.weight, exclusive=c.exclusive)
            out.append(GrantRecord(
                grant_id=c.grant_id, owner=f"{g.namespace}/{g.pod}/{c.container}", slices=c.slices,
                request=request, created=g.bound_at, holder_pid=0, holder_start=0, exclusive=c.exclusive,
                command=f"pod {g.namespace}/{g.pod} container {c.container}",
                slice_file=str(state_dir / "kube" / "grants" / c.grant_id / "slice"),
                region_file=str(state_dir / "kube" / "regions" / c.grant_id / "region")))
    return out


class KubeLabelCollector(Collector):
    """Yields the wrapped collector's families with namespace/pod/container filled from the grant label."""

    FILL = ("namespace", "pod", "container")

    def __init__(self, inner: Collector, resolve: Callable[[str], KubeLabels | None]):
        self.inner = inner
        self.resolve = resolve

    def collect(self) -> Iterator:
        for family in self.inner.collect():
            for sample in family.samples:
                grant = sample.labels.get("grant")
                if not grant or not all(k in sample.labels for k in self.FILL):
                    continue
                found = self.resolve(grant)
                if found is None:
                    continue
                for key in self.FILL:
                    if not sample.labels[key]:
                        sample.labels[key] = getattr(found, key)
            yield family
