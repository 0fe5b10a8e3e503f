"""Kubernetes labels (namespace, pod, container) for the node exporter's slice metrics.

The exporter (``gpuslice.host.metrics``) labels every slice series with ``grant``; in local mode its
``namespace``/``pod``/``container`` labels are empty. In Kubernetes a grant id is
``k-<pod uid>-<container>`` and the node's ledger (``gpuslice.io/ledger``) maps it to the pod:

* :func:`grant_labels` — ``{grant id: KubeLabels}`` from a ledger;
* :class:`LedgerLabels` — a resolver ``grant_id -> KubeLabels | None`` reading the node's ledger through
  the API server at most every ``ttl`` seconds (one GET of the Node, no pod list);
* :func:`watched_grants` — the ledger's container grants as the node monitor's neutral
  :class:`~gpuslice.host.usage.Watched` grants (region files at ``<state>/kube/regions/<id>/region``,
  where the device plugin mounts them), so ``Monitor.sample`` reads Kubernetes slices exactly like local ones;
* :class:`KubeLabelCollector` — wraps any prometheus collector (``ViewCollector``) and fills the empty
  ``namespace``/``pod``/``container`` labels of series that carry a ``grant`` label;
* :func:`serve_metrics` — the node exporter of a kube agent (device plugin: ledger grants; DRA: prepared claims).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from prometheus_client.registry import Collector

from gpuslice.kube import formats
from gpuslice.kube.api import KubeAPI, KubeError
from gpuslice.host.usage import Watched
from gpuslice.spec import SpecError


@dataclass(frozen=True)
class KubeLabels:
    namespace: str
    pod: str
    container: str


def grant_labels(ledger: formats.Ledger) -> dict[str, KubeLabels]:
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
        self._ledger = formats.Ledger({})
        self._at = float("-inf")
        self._lock = threading.Lock()

    def ledger(self) -> formats.Ledger:
        with self._lock:
            if self.clock() - self._at >= self.ttl:
                try:
                    node = self.api.get_node(self.node)
                    anns = (node.get("metadata") or {}).get("annotations") or {}
                    self._ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), self.node)
                    self._table = grant_labels(self._ledger)
                except (KubeError, SpecError):
                    pass  # keep the last good table; the next scrape tries again
                self._at = self.clock()
            return self._ledger

    def __call__(self, grant_id: str) -> KubeLabels | None:
        self.ledger()
        return self._table.get(grant_id)


def watched_grants(ledger: formats.Ledger, state_dir: Path) -> list[Watched]:
    """The ledger's container grants as the node monitor watches them (``Monitor.sample``)."""
    return [Watched(grant=c.grant, owner=f"{g.namespace}/{g.pod}/{c.container}",
                    region_file=str(state_dir / "kube" / "regions" / c.grant_id / "region"), created=g.bound_at,
                    command=f"pod {g.namespace}/{g.pod} container {c.container}")
            for g in ledger.entries.values() for c in g.containers]


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


def serve_metrics(devices: list, node: str, port: int, watched: Callable[[], list[Watched]],
                  resolve: Callable[[str], KubeLabels | None], mps=None, backstop=None) -> None:
    """Serve ``/metrics`` on ``port``: the node monitor's series of the ``watched()`` grants, labelled by
    ``resolve``; ``mps``: the spatial slices' MPS daemons (their state and faults), when the node has any;
    ``backstop()``: the backstop's last report (NVML-counted memory, overruns, GPU processes of no slice)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from gpuslice.host.metrics import ViewCollector
    from gpuslice.host.monitor import Monitor, with_backstop

    monitor = Monitor(devices, node, mps=mps)

    def view():
        sampled = monitor.sample(watched())
        latest = backstop() if backstop is not None else None
        return with_backstop(sampled, latest) if latest is not None else sampled

    registry = CollectorRegistry()
    registry.register(KubeLabelCollector(ViewCollector(view), resolve))
    start_http_server(port, registry=registry)
