"""``topology-aware``: HAMi's policy of that name — keep well-connected GPUs together for the requests
that need several. One device goes to the least connected GPU (fewest NVLink peers, then fewest GPUs on
its NUMA node), so NVLinked groups stay whole; several devices get the best-connected set (the
topology pick of :mod:`.choose`); among nodes, the one with the fewest GPUs that still fits wins, so
large nodes stay free for large requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.fit import static_array
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.scorers.base import Scorer, index_order
from gpuslice.placement.scorers.binpack import Binpack, used_after

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


def connectivity(fleet: Fleet) -> np.ndarray:
    """[N, G] how connected each device is on its node: its NVLink peers there, plus half a point per
    other device on its NUMA node (a MIG instance counts its card's links: none are described for it)."""
    def make() -> np.ndarray:
        out = np.zeros(fleet.valid.shape)
        for i, devs in enumerate(fleet.static):
            present = {d.uuid for d in devs}
            for j, d in enumerate(devs):
                links = sum(1 for p in d.nvlink_peers if p in present)
                near = sum(1 for e in devs if e is not d and d.numa_node is not None and e.numa_node == d.numa_node)
                out[i, j] = links + 0.5 * near
        return out
    return static_array(fleet, ("connectivity",), make)


class TopologyAware(Scorer):
    """GPU level: the least connected device (then binpack's preference); idle devices least connected
    first. Node level: the fewest devices, then the fullest. CPU-only task: as binpack."""

    name = "topology-aware"

    def device_preference(self, ctx: Context) -> np.ndarray:
        # Connectivity moves in steps of 0.5; binpack's use (at most a few units) only breaks ties.
        return -ctx.take(connectivity(ctx.fleet)) + 1e-3 * used_after(ctx)

    def idle_order(self, ctx: Context) -> np.ndarray:
        return ctx.take(connectivity(ctx.fleet)) + 1e-6 * index_order(ctx)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        devices, after = ctx.load_after(choice.added)
        width = max(1, ctx.fleet.width)
        return 90.0 * (1.0 - (devices - 1) / width) + 10.0 * after / np.maximum(devices, 1)

    def host_score(self, host: HostContext) -> np.ndarray:
        return Binpack().host_score(host)


__all__ = ["TopologyAware", "connectivity"]
