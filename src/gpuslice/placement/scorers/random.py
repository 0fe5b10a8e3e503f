"""``random``: any fitting device and node, uniformly — the baseline every other policy must beat."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuslice.placement.context import seeded_rng
from gpuslice.placement.scorers.base import Scorer

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


class Random(Scorer):
    """Uniform draws from the request's one stream (``Context.generator``): the GPU level draws first,
    then the node level, so a seeded run repeats."""

    name = "random"

    def device_preference(self, ctx: Context) -> np.ndarray:
        assert ctx.generator is not None, "the context has a generator whenever a level is random"
        return ctx.generator.random(ctx.dev_ok.shape)

    def idle_order(self, ctx: Context) -> np.ndarray:
        return self.device_preference(ctx)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        assert ctx.generator is not None, "the context has a generator whenever a level is random"
        # Draw for the fitting nodes only (as many numbers as before the rows scored were widened), and
        # give the scored-but-dropped rows a placeholder.
        score = np.zeros(ctx.rows.size)
        score[ctx.keep] = 100.0 * ctx.generator.random(ctx.fitting.size)
        return score

    def host_score(self, host: HostContext) -> np.ndarray:
        return seeded_rng(host.policy, host.fleet, host.rng).random(host.rows.size)


__all__ = ["Random"]
