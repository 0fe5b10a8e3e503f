"""The workload FGD protects, learnt from the tasks as they arrive (pure: the caller says what arrived).

FGD scores a placement by how it changes the expected fragmentation under the *target workload* — the shapes
of tasks to come and how often each comes. A scheduler does not know the future; it learns the mix from what
arrived so far. :class:`WorkloadMix` counts every arriving shape (each task once, ``TaskShape.demand_weight``)
and keeps the *typical* set — the most frequent shapes covering 95 % of arrivals, at most ``FGD_MAX_SHAPES`` (the
paper's popularity threshold) — re-chosen at 1, 2, 4, … arrivals and then every ``refresh`` (1,024) arrivals;
the weights of the typical shapes are current at every arrival.

The simulator (``gpuslice.sim.engine``) and the Kubernetes extender use this one class, so the cluster's FGD
sees the same workload as the simulator's on the same arrivals. Without it (``workload=None``) FGD weighs only
the request being placed: on 50 openb nodes that cost 2–6 points of allocation against the learnt mix.
"""

from __future__ import annotations

from gpuslice.placement.fragmentation import FGD_MAX_SHAPES
from gpuslice.placement.model import TaskShape, Workload


class WorkloadMix:
    """Counts of shapes seen; the typical set is re-chosen every ``refresh`` observations."""

    def __init__(self, refresh: int = 1024):
        if refresh < 1:
            raise ValueError("refresh must be at least 1")
        self.counts: dict[TaskShape, float] = {}
        self.refresh = refresh
        self.seen = 0
        self.typical: tuple[TaskShape, ...] = ()

    def observe(self, shape: TaskShape) -> None:
        self.counts[shape] = self.counts.get(shape, 0.0) + shape.demand_weight
        self.seen += 1
        # Re-chosen at 1, 2, 4, … arrivals and then every `refresh`: often while the mix is still being
        # learnt, rarely once it is known (each change of the set re-derives FGD's cached terms).
        seen = self.seen
        if (seen & (seen - 1)) == 0 and seen < self.refresh or seen % self.refresh == 0:
            chosen = Workload(tuple(self.counts.items())).typical(0.95, FGD_MAX_SHAPES)
            typical = tuple(s for s, _ in chosen.counts)
            # The shapes tuple keys placement's fragmentation caches: keep the same tuple (same order)
            # while the membership is unchanged, so only a real change of the mix costs a recompute.
            if set(typical) != set(self.typical):
                self.typical = typical

    def workload(self) -> Workload:
        return Workload(tuple((s, self.counts[s]) for s in self.typical))


__all__ = ["WorkloadMix"]
