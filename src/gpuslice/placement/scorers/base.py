"""The shape of a scorer: one placement policy at both levels, as one plugin.

A scorer answers four questions, each over plain numpy arrays of a :class:`Context` (or
:class:`HostContext`) and never with a side effect on the fleet's state:

* ``device_preference``: for a shared request, how much the policy likes each device ([C, G], higher is
  better; masked to fitting devices by the caller, ties go to the lowest index);
* ``idle_order``: for whole devices, the order to take idle devices in ([C, G], lowest first);
* ``node_score``: the node's score 0..100 with the devices chosen there ([C]; the topology blend and
  the clip to 0..100 are the caller's);
* ``host_score``: for a task that needs no device, how much the policy likes each node with room
  ([R], the highest wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpuslice.placement.choose import Choice
    from gpuslice.placement.context import Context, HostContext


def index_order(ctx: Context) -> np.ndarray:
    """[C, G] the devices' index: where idle devices are alike, take them in index order (stable,
    predictable)."""
    return np.broadcast_to(np.arange(ctx.fleet.width, dtype=float), ctx.dev_ok.shape)


class Scorer:
    """A placement policy. Subclasses set ``name`` (one of ``POLICIES``) and answer the questions of
    the module docstring; ``idle_order`` defaults to index order."""

    name = ""

    def device_preference(self, ctx: Context) -> np.ndarray:
        raise NotImplementedError

    def idle_order(self, ctx: Context) -> np.ndarray:
        return index_order(ctx)

    def node_score(self, ctx: Context, choice: Choice) -> np.ndarray:
        raise NotImplementedError

    def host_score(self, host: HostContext) -> np.ndarray:
        raise NotImplementedError


__all__ = ["Scorer", "index_order"]
