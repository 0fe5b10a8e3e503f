"""Prometheus metrics of the node view (prometheus-client custom collector).

Slice series carry ``node, grant, device, device_index, owner, namespace, pod, container``; in local
mode ``namespace``/``pod``/``container`` are empty so Kubernetes can fill them later without renaming.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuslice.node.monitor import NodeView

SLICE_LABELS = ["node", "grant", "device", "device_index", "owner", "namespace", "pod", "container"]
DEVICE_LABELS = ["node", "device", "device_index", "name"]


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class ViewCollector(Collector):
    """Collects from whatever ``latest()`` returns (the agent's last sample); nothing before one exists."""

    def __init__(self, latest: Callable[[], NodeView | None]):
        self.latest = latest

    def collect(self) -> Iterator:
        view = self.latest()
        if view is None:
            return
        yield from self._slices(view)
        yield from self._devices(view)
        grants = _g("gpuslice_grants", "Grants held on this node.", ["node"])
        grants.add_metric([view.node], len({s.grant_id for s in view.slices}))
        queue = _g("gpuslice_queue_length", "Requests waiting for a grant.", ["node"])
        queue.add_metric([view.node], len(view.waiters))
        yield grants
        yield queue

    def _slices(self, view: NodeView) -> Iterator:
        fams = {
            "used": _g("gpuslice_slice_memory_used_bytes", "Device memory used by the slice's processes.", SLICE_LABELS),
            "limit": _g("gpuslice_slice_memory_limit_bytes", "Device memory limit of the slice.", SLICE_LABELS),
            "peak": _g("gpuslice_slice_memory_peak_bytes", "Highest device memory use of the slice.", SLICE_LABELS),
            "cset": _g("gpuslice_slice_compute_share_percent", "Compute share granted (percent of the device).",
                       SLICE_LABELS),
            "cach": _g("gpuslice_slice_compute_achieved_percent",
                       "Compute the slice used over about the last 2 s (the pacer's last 1-s window when paced; percent of the device).", SLICE_LABELS),
            "procs": _g("gpuslice_slice_processes", "Live processes of the slice (its region and its launched process group).", SLICE_LABELS),
            "thr": CounterMetricFamily("gpuslice_slice_throttled_seconds", "Time the pacer held kernel launches back.",
                                       labels=SLICE_LABELS),
            "oom": CounterMetricFamily("gpuslice_slice_oom_refusals", "Allocations refused at the memory limit.",
                                       labels=SLICE_LABELS),
        }
        for s in view.slices:
            labels = [view.node, s.grant_id, s.device_uuid, str(s.device_index), s.owner, "", "", ""]
            fams["used"].add_metric(labels, s.memory_used)
            fams["limit"].add_metric(labels, s.memory_limit)
            fams["peak"].add_metric(labels, s.memory_peak)
            fams["cset"].add_metric(labels, s.compute_set)
            if s.compute_achieved is not None:
                fams["cach"].add_metric(labels, s.compute_achieved)
            fams["procs"].add_metric(labels, len(s.pids))
            fams["thr"].add_metric(labels, s.throttled_seconds)
            fams["oom"].add_metric(labels, s.oom_refusals)
        yield from fams.values()

    def _devices(self, view: NodeView) -> Iterator:
        fams = {
            "total": _g("gpuslice_device_memory_total_bytes", "Physical device memory.", DEVICE_LABELS),
            "granted": _g("gpuslice_device_memory_granted_bytes", "Sum of the memory limits of the device's slices.",
                          DEVICE_LABELS),
            "used": _g("gpuslice_device_memory_used_bytes", "Device memory used by all slices.", DEVICE_LABELS),
            "cgr": _g("gpuslice_device_compute_granted_percent", "Sum of the compute shares of the device's slices.",
                      DEVICE_LABELS),
            "cach": _g("gpuslice_device_compute_achieved_percent", "Compute used by all slices (percent).",
                       DEVICE_LABELS),
            "slices": _g("gpuslice_device_slices", "Slices on the device.", DEVICE_LABELS),
        }
        for d in view.devices:
            labels = [view.node, d.uuid, str(d.index), d.name]
            fams["total"].add_metric(labels, d.memory_total)
            fams["granted"].add_metric(labels, d.memory_granted)
            fams["used"].add_metric(labels, d.memory_used)
            fams["cgr"].add_metric(labels, d.compute_granted)
            if d.compute_achieved is not None:
                fams["cach"].add_metric(labels, d.compute_achieved)
            fams["slices"].add_metric(labels, d.slices)
        yield from fams.values()


def exposition(latest: Callable[[], NodeView | None]) -> bytes:
    """The text exposition of one view (a fresh registry: only our series)."""
    registry = CollectorRegistry()
    registry.register(ViewCollector(latest))
    return generate_latest(registry)
