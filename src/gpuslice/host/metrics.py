"""Prometheus metrics of the node view (prometheus-client custom collector).

Slice series carry ``node, grant, device, device_index, owner, namespace, pod, container``; in local
mode ``namespace``/``pod``/``container`` are empty so Kubernetes can fill them later without renaming.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuslice.host.monitor import DeviceView, NodeView, SliceView

SLICE_LABELS = ["node", "grant", "device", "device_index", "owner", "namespace", "pod", "container"]
DEVICE_LABELS = ["node", "device", "device_index", "name"]


# (metric name, help, kind, value of the view row; None = no sample this time)
SLICE_METRICS: tuple[tuple[str, str, str, Callable[[SliceView], float | None]], ...] = (
    ("gpuslice_slice_memory_used_bytes", "Device memory used by the slice's processes.", "gauge",
     lambda s: s.memory_used),
    ("gpuslice_slice_memory_limit_bytes", "Device memory limit of the slice.", "gauge", lambda s: s.memory_limit),
    ("gpuslice_slice_memory_peak_bytes", "Highest device memory use of the slice.", "gauge", lambda s: s.memory_peak),
    ("gpuslice_slice_compute_share_percent", "Compute share granted (percent of the device).", "gauge",
     lambda s: s.compute_set),
    ("gpuslice_slice_compute_achieved_percent", "Compute the slice used over about the last 2 s (the pacer's last "
     "1-s window when paced; percent of the device).", "gauge", lambda s: s.compute_achieved),
    ("gpuslice_slice_processes", "Live processes of the slice (its region and its launched process group).", "gauge",
     lambda s: len(s.pids)),
    ("gpuslice_slice_throttled_seconds", "Time the pacer held kernel launches back.", "counter",
     lambda s: s.throttled_seconds),
    ("gpuslice_slice_oom_refusals", "Allocations refused at the memory limit.", "counter", lambda s: s.oom_refusals),
    ("gpuslice_slice_oom_waiting", "Allocations waiting now for the device to have room (oom_policy=wait).", "gauge",
     lambda s: s.oom_waiting),
    ("gpuslice_slice_oom_waits", "Allocations that waited for the device to have room (oom_policy=wait).", "counter",
     lambda s: s.oom_waits),
    ("gpuslice_slice_oom_wait_timeouts", "Waits for device memory that timed out (oom_policy=wait).", "counter",
     lambda s: s.oom_wait_timeouts),
    ("gpuslice_slice_memory_seen_bytes", "Device memory of the slice's processes as NVML counts it (the backstop; "
     "absent when it is off).", "gauge", lambda s: s.memory_seen),
)
DEVICE_METRICS: tuple[tuple[str, str, str, Callable[[DeviceView], float | None]], ...] = (
    ("gpuslice_device_memory_total_bytes", "Physical device memory.", "gauge", lambda d: d.memory_total),
    ("gpuslice_device_memory_granted_bytes", "Sum of the memory limits of the device's slices.", "gauge",
     lambda d: d.memory_granted),
    ("gpuslice_device_memory_used_bytes", "Device memory used by all slices.", "gauge", lambda d: d.memory_used),
    ("gpuslice_device_compute_granted_percent", "Sum of the compute shares of the device's slices.", "gauge",
     lambda d: d.compute_granted),
    ("gpuslice_device_compute_achieved_percent", "Compute used by all slices (percent).", "gauge",
     lambda d: d.compute_achieved),
    ("gpuslice_device_slices", "Slices on the device.", "gauge", lambda d: d.slices),
)


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _families(table, labels: list[str], rows: Iterable[tuple[list[str], Any]]) -> Iterator:
    """One family per row of ``table``, with a sample per (label values, view row) that has a value."""
    fams = [(GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=labels)
            for name, doc, kind, _ in table]
    for values, row in rows:
        for fam, (_, _, _, value) in zip(fams, table):
            v = value(row)
            if v is not None:
                fam.add_metric(values, v)
    yield from fams


class ViewCollector(Collector):
    """Collects from whatever ``latest()`` returns (the agent's last sample); nothing before one exists."""

    def __init__(self, latest: Callable[[], NodeView | None]):
        self.latest = latest

    def collect(self) -> Iterator:
        view = self.latest()
        if view is None:
            return
        yield from _families(SLICE_METRICS, SLICE_LABELS, (
            ([view.node, s.grant_id, s.device_uuid, str(s.device_index), s.owner, "", "", ""], s) for s in view.slices))
        yield from _families(DEVICE_METRICS, DEVICE_LABELS, (
            ([view.node, d.uuid, str(d.index), d.name], d) for d in view.devices))
        yield from _backstop_families(view)
        yield from _engine_families(view)
        grants = _g("gpuslice_grants", "Grants held on this node.", ["node"])
        grants.add_metric([view.node], len({s.grant_id for s in view.slices}))
        queue = _g("gpuslice_queue_length", "Requests waiting for a grant.", ["node"])
        queue.add_metric([view.node], len(view.waiters))
        yield grants
        yield queue


def _backstop_families(view: NodeView) -> Iterator:
    """The backstop's findings: slices over their limit in NVML's count, GPU processes of no slice, kills."""
    report = view.backstop or {}
    over = _g("gpuslice_backstop_over_limit_bytes", "Device memory a slice holds above its limit in NVML's count "
              "(present only while it is over).", ["node", "grant", "device"])
    for o in report.get("overruns", ()):
        over.add_metric([view.node, o["grant_id"], o["device_uuid"]], o["used"] - o["limit"])
    strangers = _g("gpuslice_unattributed_memory_bytes", "Device memory of a GPU process that belongs to no slice.",
                   ["node", "device", "pid"])
    for p in report.get("unattributed", ()):
        strangers.add_metric([view.node, p["device_uuid"], str(p["pid"])], p["used"] or 0)
    kills = CounterMetricFamily("gpuslice_backstop_kills", "Processes the backstop killed for holding their slice "
                                "above its limit.", labels=["node", "grant", "device"])
    for k in report.get("kills_total", ()):
        kills.add_metric([view.node, k["grant"], k["device"]], k["kills"])
    yield from (over, strangers, kills)


def _engine_families(view: NodeView) -> Iterator:
    """The engine of each slice, and the node's MPS daemons (1 in the series of their current state)."""
    info = _g("gpuslice_slice_info", "1 per slice; its engine (timeslice | spatial), mode, priority and "
              "co-location (preemptive | shared | tidal).", [*SLICE_LABELS, "engine", "mode", "priority", "colocation"])
    for s in view.slices:
        info.add_metric([view.node, s.grant_id, s.device_uuid, str(s.device_index), s.owner, "", "", "", s.engine,
                         s.mode, s.priority, s.colocation], 1)
    yield info
    daemons = _g("gpuslice_mps_daemon", "1 per MPS control daemon of spatial slices, labelled with its state "
                 "(running, fault: its logs report a fatal client error, down: its process is gone).",
                 ["node", "device", "uid", "state"])
    faults = _g("gpuslice_mps_daemon_faults", "Fatal-error lines in the daemon's logs since it started.",
                ["node", "device", "uid"])
    restarts = _g("gpuslice_mps_daemon_restarts", "How often the daemon of this device and user was started again "
                  "(after a fault or after it died) since its first start.", ["node", "device", "uid"])
    for d in view.mps:
        daemons.add_metric([view.node, d["device"], str(d["uid"]), d["state"]], 1)
        faults.add_metric([view.node, d["device"], str(d["uid"])], len(d.get("faults") or ()))
        restarts.add_metric([view.node, d["device"], str(d["uid"])], d.get("restarts") or 0)
    yield daemons
    yield faults
    yield restarts
    acted = CounterMetricFamily("gpuslice_mps_faults", "MPS daemon faults the node side acted on (restarted the "
                                "daemon, or stopped it with its slices) since its state dir was made.",
                                labels=["node"])
    acted.add_metric([view.node], view.mps_faults)
    yield acted


def exposition(latest: Callable[[], NodeView | None]) -> bytes:
    """The text exposition of one view (a fresh registry: only our series)."""
    registry = CollectorRegistry()
    registry.register(ViewCollector(latest))
    return generate_latest(registry)
