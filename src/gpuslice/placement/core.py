"""The public calls of placement: fit, score, place — the one place that decides which devices serve a
request.

Each call fits the request (:mod:`.fit`), lets the GPU policy's scorer choose devices on every fitting
node (:mod:`.choose`, :mod:`.scorers`), lets the node policy's scorer rank the nodes, blends in the
topology score (:mod:`.topology`) and, when nothing fits, says why (:mod:`.whynot`). See the package
docstring (``gpuslice.placement``) for the rules and the fragmentation formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gpuslice.placement.choose import Choice, choose_devices
from gpuslice.placement.context import Context, host_context, request_context
from gpuslice.placement.fit import Fit, fit_shape
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.fragmentation import FGD_MAX_SHAPES, kept_terms, weigh, workload_vectors
from gpuslice.placement.model import NoFit, NodeState, Placement, PlacementPolicy, TaskShape, Workload
from gpuslice.placement.scorers import scorer
from gpuslice.placement.whynot import why_not, why_not_node
from gpuslice.spec import Request, Slice, SpecError

Nodes = Sequence[NodeState] | Fleet


def _as_fleet(nodes: Nodes) -> Fleet:
    if isinstance(nodes, Fleet):
        return nodes
    if isinstance(nodes, NodeState):
        raise SpecError("nodes", nodes.name, "a sequence of NodeState (wrap one node in a list)")
    return Fleet(nodes)


def _check_request(request: Request) -> None:
    if not isinstance(request, Request):
        raise SpecError("request", request, "a gpuslice.spec.Request")


# ------------------------------------------------------------------------------------------ scoring
@dataclass
class _Scored:
    rows: np.ndarray  # [C] node rows that fit
    chosen: np.ndarray  # [C, G] bool, the devices chosen on each node
    score: np.ndarray  # [C] 0..100


def _report(ctx: Context, choice: Choice, score: np.ndarray) -> _Scored:
    """The fitting rows only, with the topology score blended in and the score clipped to 0..100."""
    chosen, topo = choice.chosen, choice.topo
    if ctx.everything:
        chosen, score = chosen[ctx.keep], score[ctx.keep]
        topo = None if topo is None else topo[ctx.keep]
    if topo is not None:
        w = ctx.policy.topology_weight
        score = (1 - w) * score + w * topo
    return _Scored(ctx.fitting, chosen, np.clip(score, 0.0, 100.0))


def _score(request: Request, fleet: Fleet, policy: PlacementPolicy, workload: Workload | None,
           cpu_milli: int, host_memory: int, rng: np.random.Generator | None) -> tuple[Fit, _Scored]:
    """Fit ``request``, choose devices on every fitting node (GPU level), score those nodes (node level)."""
    _check_request(request)
    if not isinstance(policy, PlacementPolicy):
        raise SpecError("policy", policy, "a PlacementPolicy")
    fit = fit_shape(fleet, TaskShape.of(request, cpu_milli, host_memory))
    if not fit.node_ok.any():
        return fit, _Scored(np.flatnonzero(fit.node_ok), np.zeros((0, fleet.width), bool), np.zeros(0))
    ctx = request_context(fleet, fit, policy, workload, rng)
    choice = choose_devices(ctx, scorer(policy.gpu))
    return fit, _report(ctx, choice, scorer(policy.node).node_score(ctx, choice))


# ------------------------------------------------------------------------------------------ public
def place(request: Request, nodes: Nodes, policy: PlacementPolicy | None = None, *,
          workload: Workload | None = None, cpu_milli: int = 0, host_memory: int = 0,
          rng: np.random.Generator | None = None) -> Placement:
    """Choose the node and devices for ``request``; raise :class:`NoFit` with a reason if none fits.

    ``nodes`` is a list of :class:`NodeState` or a :class:`Fleet`. ``workload`` is the shape mix seen
    so far (used by ``fgd``). ``cpu_milli`` / ``host_memory`` are the task's node-level needs (checked
    only on nodes that track them). ``rng`` overrides the policy's seed for ``random`` (simulators pass
    one stream for a whole run).
    """
    fleet = _as_fleet(nodes)
    policy = policy or PlacementPolicy()
    fit, scored = _score(request, fleet, policy, workload, cpu_milli, host_memory, rng)
    if scored.rows.size == 0:
        raise NoFit(why_not(fleet, fit))
    best = int(np.argmax(scored.score))  # ties: the first node in the caller's order
    i = int(scored.rows[best])
    slices = []
    for j in np.flatnonzero(scored.chosen[best]):
        device = fleet.static[i][int(j)]
        slices.append(Slice(device_uuid=device.uuid, memory_limit=int(fit.need[i, j]), compute=request.compute,
                            priority=request.priority, mode=request.mode, weight=request.weight,
                            engine=request.engine, colocation=request.colocation,
                            tidal_schedule=request.tidal_schedule))
    return Placement(node=fleet.names[i], slices=tuple(slices), score=float(scored.score[best]),
                     exclusive=fit.shape.whole)


def score_nodes(request: Request, nodes: Nodes, policy: PlacementPolicy | None = None, *,
                workload: Workload | None = None, cpu_milli: int = 0, host_memory: int = 0,
                rng: np.random.Generator | None = None) -> dict[str, float]:
    """Score 0..100 (higher is better) of every node that fits; nodes that do not fit are absent."""
    fleet = _as_fleet(nodes)
    _, scored = _score(request, fleet, policy or PlacementPolicy(), workload, cpu_milli, host_memory, rng)
    every = scored.rows.size == len(fleet)  # rows are in order: the names as they are, no fancy-index copy
    return dict(zip(fleet.names if every else fleet.name_array[scored.rows].tolist(), scored.score.tolist()))


def filter_nodes(request: Request, nodes: Nodes, *, cpu_milli: int = 0,
                 host_memory: int = 0) -> tuple[list[str], dict[str, str]]:
    """Split nodes into those that fit and a reason for each one that does not (the extender's filter)."""
    _check_request(request)
    fleet = _as_fleet(nodes)
    fit = fit_shape(fleet, TaskShape.of(request, cpu_milli, host_memory))
    fitting = [fleet.names[int(i)] for i in np.flatnonzero(fit.node_ok)]
    reasons = {fleet.names[int(i)]: why_not_node(fleet, fit, int(i)) for i in np.flatnonzero(~fit.node_ok)}
    return fitting, reasons


def place_host(nodes: Nodes, policy: PlacementPolicy | None = None, *, cpu_milli: int, host_memory: int = 0,
               workload: Workload | None = None, rng: np.random.Generator | None = None) -> str:
    """The node for a task that needs no device, only CPU and host memory (the simulator's CPU-only
    tasks; in Kubernetes the scheduler places those itself). Raises :class:`NoFit`.

    ``fgd``: the CPU a task takes can leave a node's GPUs unusable (no CPU left for GPU tasks), so the
    node whose expected fragmentation rises least wins; ``binpack`` prefers the node whose GPUs are
    fullest (then least CPU left), ``spread`` the emptiest, ``bestfit`` the least remaining GPU + CPU
    (the same weighted sum as for GPU tasks); ``random`` is uniform. The ``gpu`` level does not apply.
    """
    fleet = _as_fleet(nodes)
    policy = policy or PlacementPolicy()
    if cpu_milli < 0 or host_memory < 0:
        raise SpecError("cpu_milli", cpu_milli, "a CPU and host memory need of at least 0")
    host = host_context(fleet, policy, cpu_milli, host_memory, workload, rng)
    score = scorer(policy.node).host_score(host)
    return fleet.names[int(host.rows[int(np.argmax(score))])]


def node_fragmentation(nodes: Nodes, workload: Workload) -> np.ndarray:
    """Expected fragmentation ``F_n`` of every node under ``workload`` (in devices' worth of free share,
    the package docstring's formula), in the nodes' order. Zero for an empty workload."""
    fleet = _as_fleet(nodes)
    if not workload.counts or len(fleet) == 0:
        return np.zeros(len(fleet))
    shapes, p = workload_vectors(workload, TaskShape())
    return weigh(kept_terms(fleet, shapes, np.arange(len(fleet))).frag, p)


def fits(request: Request, node: NodeState, *, cpu_milli: int = 0, host_memory: int = 0) -> bool:
    """Whether ``request`` fits on ``node`` (a one-node filter)."""
    return not filter_nodes(request, [node], cpu_milli=cpu_milli, host_memory=host_memory)[1]


# FGD_MAX_SHAPES is re-exported: the simulator imports it from here.
__all__ = [
    "place", "place_host", "node_fragmentation", "score_nodes", "filter_nodes", "fits", "Nodes", "FGD_MAX_SHAPES",
]
