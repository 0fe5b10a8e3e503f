"""The extender's part of live resize (step 2 of :mod:`gpuslice.kube.resize`): a request the node agent
checked against the container's usage is decided against the node's ledger, which only this side writes.

The decision is the bind's: read the Node, build the placement view from ``gpuslice.io/devices`` and
``gpuslice.io/ledger``, let :func:`gpuslice.placement.resize` say whether the container's new sizes fit
beside the node's other slices, and write the ledger under the Node's resourceVersion (a conflict re-reads
and decides again). A bind or another resize racing it therefore never over-commits a device. Then the
pod's ``gpuslice.io/grant`` and the answer (``granted``, or ``refused`` naming the device and what is free).
A change to high priority in a namespace the cluster's policy leaves out is refused as a pod asking for it
is (:class:`gpuslice.kube.resources.HighPriorityNamespaces`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from gpuslice.kube import formats
from gpuslice.kube.api import KubeAPI, update_node_annotations
from gpuslice.kube.nodestate import node_state
from gpuslice.kube.resources import HighPriorityNamespaces
from gpuslice.kube.resize import (
    CHECKED, GRANTED, REFUSED, PodFollower, answer, container_of, decode_resize, pending,
)
from gpuslice.placement import NoFit, resize, resized_slices
from gpuslice.spec import GpusliceError, Priority, SpecError


class LedgerResizer(PodFollower):
    """Decides the checked resizes of every pod bound to a node."""

    selector = "spec.nodeName!="

    def __init__(self, api: KubeAPI, poll_interval: float = 5.0, attempts: int = 8,
                 high_priority: HighPriorityNamespaces = HighPriorityNamespaces()):
        super().__init__(api, poll_interval)
        self.attempts = attempts
        self.high_priority = high_priority  # a resize to high priority is held to the cluster's policy, as a pod

    def handle(self, pod: Mapping[str, Any]) -> str | None:
        """Decide the pod's resize if the node agent has checked it; the state written, else None."""
        found = pending(pod)
        if found is None or found[1] != CHECKED:
            return None
        text = found[0]
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        try:
            name, change = decode_resize(text)
            if change.priority is Priority.HIGH:
                namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
                self.high_priority.check(namespace, f"{formats.POD_RESIZE}.priority", "high")
            entry = self._commit(node, uid, name, change)
        except (SpecError, NoFit, GpusliceError) as exc:
            return answer(self.api, pod, text, REFUSED, str(exc))
        return answer(self.api, pod, text, GRANTED, "the node's ledger holds the new sizes",
                      extra={formats.POD_GRANT: formats.encode_pod_grant(entry)})

    def _commit(self, node: str, uid: str, name: str, change) -> formats.PodGrant:
        done: dict[str, formats.PodGrant] = {}

        def decide(anns: Mapping[str, str]) -> dict[str, str | None]:
            ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), node)
            entry = ledger.entries.get(uid)
            if entry is None:
                raise SpecError(formats.POD_RESIZE, uid, f"a pod holding a grant on node {node or '(none)'}")
            old = container_of(entry, name)
            state = node_state(node, formats.decode_node_devices(anns.get(formats.NODE_DEVICES)), ledger)
            new = resized_slices(old.grant, change, {d.uuid: d.memory_total for d in state.devices})
            resize(state, old.slices, new, exclusive=old.grant.exclusive)
            updated = replace(old, grant=replace(old.grant, slices=new))
            done["entry"] = replace(entry, containers=tuple(updated if c is old else c for c in entry.containers))
            return {formats.NODE_LEDGER: formats.encode_ledger(ledger.with_entry(done["entry"]))}

        if not node:
            raise SpecError(formats.POD_RESIZE, uid, "a pod bound to a node")
        update_node_annotations(self.api, node, decide, self.attempts)
        return done["entry"]
