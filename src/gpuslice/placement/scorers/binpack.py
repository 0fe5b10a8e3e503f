"""``binpack``: fill what is already used, so whole devices and nodes stay free for large requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.scorers.base import Scorer

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


def used_after(ctx: Context) -> np.ndarray:
    """[C, G] each device's use after the slice lands there: memory share + compute share, or with the
    policy's ``weights`` (HAMi's device scoring weights) slot·slots share + core·compute share +
    memory·memory share."""
    shape = ctx.shape
    memory = (ctx.mem_used + ctx.need) / ctx.cap
    compute = (ctx.take(ctx.fleet.comp_used) + shape.compute) / 100.0
    weights = ctx.policy.weights
    if weights is None:
        return memory + compute
    slot_w, core_w, mem_w = weights
    slots = (ctx.take(ctx.fleet.slots_used) + 1) / np.maximum(ctx.take(ctx.fleet.split), 1)
    return slot_w * slots + core_w * compute + mem_w * memory


class Binpack(Scorer):
    """GPU level: the device most used after placing. Node level: 100 × the node's GPU allocation
    after placing. CPU-only task: the node whose GPUs are fullest (a CPU task there strands none), then
    the least CPU left."""

    name = "binpack"

    def device_preference(self, ctx: Context) -> np.ndarray:
        return used_after(ctx)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        devices, after = ctx.load_after(choice.added)
        return 100.0 * after / devices

    def host_score(self, host: HostContext) -> np.ndarray:
        return host.gpu_util - 1e-3 * host.cpu_left


__all__ = ["Binpack", "used_after"]
