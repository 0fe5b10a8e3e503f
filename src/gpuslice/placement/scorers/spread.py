"""``spread``: the least used device and node, so load (and the damage of one failure) is spread out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.scorers.base import Scorer
from gpuslice.placement.scorers.binpack import used_after

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


class Spread(Scorer):
    """Binpack's opposite at every level: the least used device, 100 − the node's allocation after
    placing, the emptiest GPUs (then the most CPU left) for a CPU-only task."""

    name = "spread"

    def device_preference(self, ctx: Context) -> np.ndarray:
        return -used_after(ctx)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        devices, after = ctx.load_after(choice.added)
        return 100.0 * (1.0 - after / devices)

    def host_score(self, host: HostContext) -> np.ndarray:
        return -host.gpu_util + 1e-3 * host.cpu_left


__all__ = ["Spread"]
