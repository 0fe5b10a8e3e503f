"""Scorers: one module per placement policy, as kube scheduler-plugins keeps one plugin per score.

``SCORERS`` maps each name of :data:`~gpuslice.placement.POLICIES` to its scorer; :func:`scorer` looks one
up. A policy is one scorer at both levels (``PlacementPolicy(node=..., gpu=...)`` may pick two).
"""

from __future__ import annotations

from typing import Mapping

from gpuslice.placement.scorers.base import Scorer
from gpuslice.placement.scorers.bestfit import BestFit
from gpuslice.placement.scorers.binpack import Binpack
from gpuslice.placement.scorers.fgd import Fgd
from gpuslice.placement.scorers.random import Random
from gpuslice.placement.scorers.spread import Spread
from gpuslice.placement.scorers.topology_aware import TopologyAware
from gpuslice.spec import SpecError

SCORERS: Mapping[str, Scorer] = {s.name: s for s in (Binpack(), Spread(), BestFit(), Fgd(), Random(), TopologyAware())}


def scorer(name: str) -> Scorer:
    """The scorer of policy ``name``."""
    found = SCORERS.get(name)
    if found is None:
        raise SpecError("policy", name, "one of " + ", ".join(SCORERS))
    return found


__all__ = ["SCORERS", "Scorer", "scorer"]
