"""``bestfit``: leave the least behind — the device with the least memory left, the node with the
least remaining resources (the FGD paper's Best-fit baseline)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.fleet import UNTRACKED
from gpuslice.placement.scorers.base import Scorer

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


def host_remaining(host: HostContext) -> np.ndarray:
    """[R] minus the remaining resources of each node after a CPU-only task: the same weighted sum as
    for GPU tasks (free devices' share and free CPU, averaged)."""
    return -(host.gpu_left + host.cpu_left) / 2


class BestFit(Scorer):
    """GPU level: least absolute memory left, then least compute left; for whole devices the smallest
    device that holds the request. Node level: 100 × (1 − remaining)."""

    name = "bestfit"

    def device_preference(self, ctx: Context) -> np.ndarray:
        left_compute = 100 - ctx.take(ctx.fleet.comp_used) - ctx.shape.compute
        return -((ctx.cap - ctx.mem_used - ctx.need) + left_compute * 1e-3)

    def idle_order(self, ctx: Context) -> np.ndarray:
        return ctx.cap.astype(float)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        # Least remaining resources, a weighted sum over dimensions (as the FGD paper's Best-fit):
        # free devices' share normalised by the widest node, plus free CPU normalised by the largest.
        fleet = ctx.fleet
        devices, after = ctx.load_after(choice.added)
        remaining = (devices - after) / max(1, fleet.width)
        cpu_total = ctx.take(fleet.cpu_total)
        tracked = cpu_total != UNTRACKED
        if tracked.any():
            biggest = max(1, int(fleet.cpu_total[fleet.cpu_total != UNTRACKED].max()))
            cpu_left = np.where(tracked, (cpu_total - ctx.take(fleet.cpu_used) - ctx.shape.cpu_milli) / biggest, 0.0)
            remaining = (remaining + cpu_left) / 2
        return 100.0 * (1.0 - remaining)

    def host_score(self, host: HostContext) -> np.ndarray:
        return host_remaining(host)


__all__ = ["BestFit", "host_remaining"]
