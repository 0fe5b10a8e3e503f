"""Keeps the node's ResourceSlice (:mod:`gpuslice.kube.dra.resourceslice`) as the devices and their health are.

It runs the same loop as the device plugin's node registration (:class:`gpuslice.kube.agent.NodePublisher`):
publish at start, at every health or device-list change, and every ``interval`` seconds. Publishing reads the
slice and writes only when its devices differ (a PUT conditioned on the slice's resourceVersion, with the pool
generation one higher, so the scheduler never mixes an old and a new view), creates it when it is missing
(owned by the Node: it goes when the Node goes), and, at the first run, deletes any other slice of this driver
on this node (left by an older naming). The agent leaves its slice in place when it stops: claims keep their
devices while the agent restarts.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from gpuslice.kube.agent import NodePublisher
from gpuslice.kube.api import Conflict, NotFound
from gpuslice.kube.dra.api import DraAPI
from gpuslice.kube.dra.resourceslice import DRIVER, Sharing, resource_slice, resource_slice_spec, slice_name
from gpuslice.spec import Device

log = logging.getLogger("gpuslice.dra")


class SlicePublisher(NodePublisher):
    """``publish()`` once, or ``start()`` the loop; ``health_changed`` / ``devices_changed`` wake it."""

    def __init__(self, api: DraAPI, node: str, devices: Sequence[Device], sharing: Sharing, *,
                 interval: float = 30.0):
        super().__init__(api, node, devices, split_count=sharing.split_count, memory_scaling=sharing.memory_scaling,
                         interval=interval)
        self.dra = api
        self.sharing = sharing
        self.writes = 0
        self._swept = False
        self.spec(1)  # a device list the API cannot take (too many devices, clashing names) is refused here

    def spec(self, generation: int) -> dict[str, Any]:
        return resource_slice_spec(self.node, self.devices, self.sharing, generation=generation, health=self._health)

    def publish(self, attempts: int = 5) -> None:
        if not self._swept:
            self._sweep()
        name = slice_name(self.node)
        for _ in range(attempts):
            try:
                current = self.dra.get_resource_slice(name)
            except NotFound:
                node = self.dra.get_node(self.node)
                uid = (node.get("metadata") or {}).get("uid", "")
                body = resource_slice(self.node, self.devices, self.sharing, health=self._health, node_uid=uid)
                try:
                    self.dra.create_resource_slice(body)
                except Conflict:  # created meanwhile (another replica of ourselves): read it again
                    continue
                self._written(body["spec"])
                return
            generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 0)
            want = self.spec(generation)
            if (current.get("spec") or {}) == want:
                self.published += 1
                return
            want = self.spec(generation + 1)
            body = {**current, "spec": want}
            try:
                self.dra.replace_resource_slice(name, body)
            except Conflict:
                continue
            self._written(want)
            return
        raise Conflict(f"ResourceSlice {name}: it kept changing while being published ({attempts} attempts)", 409)

    def _written(self, spec: dict[str, Any]) -> None:
        self.published += 1
        self.writes += 1
        tainted = [d["name"] for d in spec["devices"] if d.get("taints")]
        log.info("published ResourceSlice %s: %d device(s), generation %d%s", slice_name(self.node),
                 len(spec["devices"]), spec["pool"]["generation"], f", unhealthy: {tainted}" if tainted else "")

    def _sweep(self) -> None:
        mine = slice_name(self.node)
        for s in self.dra.list_resource_slices(f"spec.nodeName={self.node},spec.driver={DRIVER}"):
            name = (s.get("metadata") or {}).get("name", "")
            if name and name != mine:
                try:
                    self.dra.delete_resource_slice(name)
                    log.info("deleted ResourceSlice %s (another slice of %s on node %s)", name, DRIVER, self.node)
                except NotFound:
                    pass
        self._swept = True
