"""What a scorer sees: one request's fit over the fleet and the arrays every policy reads, built once.

:func:`request_context` serves ``place`` / ``score_nodes`` (a request for devices); :func:`host_context`
serves ``place_host`` (a task that needs no device). The scorers (:mod:`.scorers`) only read these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuslice.placement.fit import Fit
from gpuslice.placement.fleet import UNTRACKED, Fleet
from gpuslice.placement.fragmentation import Terms, request_terms
from gpuslice.placement.model import NoFit, PlacementPolicy, TaskShape, Workload
from gpuslice.placement.whynot import why_not_host


def seeded_rng(policy: PlacementPolicy, fleet: Fleet, rng: np.random.Generator | None) -> np.random.Generator:
    """The ``random`` policy's stream: the caller's ``rng``, else one seeded by the policy and the fleet."""
    if rng is not None:
        return rng
    # Pure but not frozen: the same seed draws differently as the fleet's state changes.
    digest = [int(fleet.mem_used.sum()) % 2**63, int(fleet.comp_used.sum()), int(fleet.slots_used.sum()),
              int(fleet.cpu_used.sum()) % 2**63, fleet.version]
    return np.random.default_rng([policy.seed, *digest])


@dataclass
class Context:
    """One request over a fleet: the node rows scored and the per-device arrays taken to those rows.

    When most nodes fit, every node is scored on the arrays as they are (no fancy-index copies) and the
    others are dropped at the end (``keep``); when few fit, just those rows are copied out.
    """

    fleet: Fleet
    policy: PlacementPolicy
    fit: Fit
    fitting: np.ndarray  # [F] node rows that fit: the ones reported
    rows: np.ndarray  # [C] node rows scored: every node, or the fitting ones
    everything: bool  # rows is every node
    keep: np.ndarray  # [C] rows to report; the others are scored only because it is cheaper
    generator: np.random.Generator | None  # one stream for both levels when either is ``random``
    terms: Terms | None  # FGD's terms when either level is ``fgd``
    p: np.ndarray | None  # [K] the workload's shape weights, with ``terms``
    counts: np.ndarray | None  # [K] the same before normalising (the kept weighings move with them)
    frag: np.ndarray | None  # [C, G] ΔF of a one-device shared slice on each device, with ``terms``
    dev_ok: np.ndarray  # [C, G]
    need: np.ndarray  # [C, G] bytes
    cap: np.ndarray  # [C, G] memory capacity
    mem_used: np.ndarray  # [C, G]

    @property
    def shape(self) -> TaskShape:
        return self.fit.shape

    def take(self, array: np.ndarray) -> np.ndarray:
        """``array`` ([N, ...]) restricted to the scored rows."""
        return array if self.everything else array[self.rows]

    def load_after(self, added: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """[C] each node's device count, and its devices' worth allocated once ``added`` is granted."""
        return self.take(self.fleet.n_devices), self.take(self.fleet.used_sum()) + added


def request_context(fleet: Fleet, fit: Fit, policy: PlacementPolicy, workload: Workload | None,
                    rng: np.random.Generator | None) -> Context:
    """The context of a request that fits at least one node."""
    fitting = np.flatnonzero(fit.node_ok)
    everything = fitting.size * 2 > len(fleet)
    rows = np.arange(len(fleet)) if everything else fitting
    generator = seeded_rng(policy, fleet, rng) if "random" in (policy.node, policy.gpu) else None
    uses_fgd = "fgd" in (policy.node, policy.gpu)
    terms, p, counts = request_terms(fleet, workload, fit.shape, rows) if uses_fgd else (None, None, None)

    def take(array: np.ndarray) -> np.ndarray:
        return array if everything else array[rows]
    # Either fgd level needs it for a shared slice: the GPU level ranks devices by it, the node level
    # reads the chosen device's entry.
    frag = terms.shared_delta(fleet, fit, rows, counts) if terms is not None and not fit.shape.whole else None
    return Context(fleet, policy, fit, fitting, rows, everything, fit.node_ok[rows], generator, terms, p, counts, frag,
                   take(fit.dev_ok), take(fit.need), take(fleet.mem_cap), take(fleet.mem_used))


@dataclass
class HostContext:
    """A task that needs no device (``place_host``): the nodes with room for its CPU and host memory,
    and how much of their GPUs and CPU is left."""

    fleet: Fleet
    policy: PlacementPolicy
    workload: Workload | None
    rng: np.random.Generator | None  # the caller's, if any (``random``)
    cpu_milli: int
    host_memory: int
    rows: np.ndarray  # [R] node rows with room
    cpu_left: np.ndarray  # [R] free CPU after placing, as a share of the largest node's (1 if untracked)
    gpu_util: np.ndarray  # [R] allocated share of the node's devices (1 with no devices)
    gpu_left: np.ndarray  # [R] free devices' worth, as a share of the widest node


def host_context(fleet: Fleet, policy: PlacementPolicy, cpu_milli: int, host_memory: int,
                 workload: Workload | None, rng: np.random.Generator | None) -> HostContext:
    """The context of a task that needs no device; raises :class:`NoFit` if no node has room."""
    cpu_free = fleet.cpu_total - fleet.cpu_used
    hm_free = fleet.hm_total - fleet.hm_used
    rows = np.flatnonzero((cpu_free >= cpu_milli) & (hm_free >= host_memory))
    if rows.size == 0:
        raise NoFit(why_not_host(fleet, cpu_free, cpu_milli, host_memory))
    tracked = fleet.cpu_total[rows] != UNTRACKED
    biggest = max(1, int(fleet.cpu_total[fleet.cpu_total != UNTRACKED].max())) if tracked.any() else 1
    cpu_left = np.where(tracked, (cpu_free[rows] - cpu_milli) / biggest, 1.0)
    valid = fleet.valid[rows]
    devices = valid.sum(axis=1)
    used = (fleet.used_share()[rows]).sum(axis=1)
    # Nodes without devices count as full: a CPU task strands no GPU there.
    gpu_util = np.where(devices > 0, used / np.maximum(devices, 1), 1.0)
    gpu_left = (devices - used) / max(1, fleet.width)
    return HostContext(fleet, policy, workload, rng, cpu_milli, host_memory, rows, cpu_left, gpu_util, gpu_left)


__all__ = ["Context", "HostContext", "host_context", "request_context", "seeded_rng"]
