"""Placement: the pure decision of which device(s) serve a request.

Plain frozen data in, a decision out; no I/O, no clock, no Kubernetes objects. The local agent, the
Kubernetes scheduler extender and the simulator all call these functions.

API
---
``place(request, nodes, policy=None, *, workload=None, cpu_milli=0, host_memory=0, rng=None) -> Placement``
    The best node and its slices, or raises :class:`NoFit` whose ``reason`` says what is free, e.g.
    ``needs 20.0 GiB on 1 device; largest free is 12.0 GiB on GPU-… (node a)``.
``filter_nodes(request, nodes, *, cpu_milli=0, host_memory=0) -> (fitting names, {name: reason})``
``score_nodes(request, nodes, policy=None, *, workload=None, ...) -> {name: score 0..100}`` (fitting only)
``fits(request, node) -> bool``
``place_host(nodes, policy, *, cpu_milli, host_memory=0, workload=None) -> node name``
    for tasks that need no device (the simulator's CPU-only tasks).
``node_fragmentation(nodes, workload) -> numpy array``: each node's expected fragmentation ``F_n``.
``apply(node, slices, *, exclusive=False, cpu_milli=0, host_memory=0) -> NodeState`` and ``release(...)``
    bookkeeping on plain data (refuse any over-commit with ``SpecError``).
``NodeState.from_devices(name, devices, slices=(), *, exclusive=(), split_count=10, memory_scaling=1.0)``
    builds state from NVML :class:`~gpuslice.spec.Device` s and the ledger's :class:`~gpuslice.spec.Slice` s.
``Fleet(nodes)``: the same state as numpy columns, updated in place by ``apply``/``release``; pass it
    instead of a list when you keep state between calls (simulator, benchmark, agent) — it skips the
    per-call conversion.

The model
---------
* A *device* is a physical GPU or one MIG instance (a MIG-enabled card contributes its instances, never
  itself: with no instance created it contributes nothing, since a MIG-mode GPU runs no CUDA work outside
  an instance).
* A device takes at most ``split_count`` slices (HAMi's ``deviceSplitCount``, default 10); their memory
  limits add up to at most ``memory_total × memory_scaling`` (HAMi's ``deviceMemoryScaling``: > 1
  oversubscribes, < 1 keeps a reserve); their compute shares add up to at most 100 %.
* A request's memory percent resolves per device against its physical memory (``MemoryAmount.resolve``,
  floor); ``memory=None`` means the device's whole physical memory.
* ``exclusive`` requests, and ``count > 1`` requests for the whole memory of each device (``memory=None``),
  get whole *idle* devices (no slice on them), held exclusively. A device held whole may carry its
  physical memory even where ``memory_scaling < 1`` keeps a reserve for packing slices.
* Everything else gets shared slices: one on one device, or — ``count > 1`` with a memory size, HAMi's
  ``nvidia.com/gpu: 2`` + ``gpumem`` — one on each of ``count`` distinct devices of one node, which
  others may still share.
* A device runs one **engine** at a time (``Request.engine`` / ``Slice.engine``: ``timeslice`` or
  ``spatial``, MPS-backed): a slice fits only on a device with no slices or with slices of its engine
  (``DeviceState.engine``, ``Fleet.engine``); the device is free for either engine again once its last
  slice is released. FGD's fragmentation terms do not weigh engines (shapes of the workload are counted
  as if any device could take them).
* A multi-device request takes at most one MIG instance of a card (instances of one card share its
  memory system; to a program asking for two GPUs they are not two).
* ``models`` restricts devices (``V100M16|V100M32``); a name matches a device's model, its MIG profile or
  ``model/profile``. Nodes may also track CPU (milli) and host memory, which the simulator uses.

Policies (``PlacementPolicy(node=..., gpu=..., topology=True, seed=0)``, each level independently)
-----------------------------------------------------------------------------------------------------
GPU level (which device inside a node; for ``count`` shared slices the ``count`` best), for a shared request:
  ``binpack`` most used after placing (memory share + compute share), ``spread`` least used,
  ``bestfit`` least absolute memory left (then compute), ``fgd`` least fragmentation increase (below),
  ``random`` any fitting device, ``topology-aware`` the least connected device (fewest NVLink peers, then
  fewest devices on its NUMA node; HAMi's policy of that name). With ``weights=(slot, core, memory)``
  (HAMi's device scoring weights) binpack / spread weigh slots, compute and memory shares so. For whole
  devices: ``bestfit`` the smallest that holds the request, ``fgd`` the devices whose loss raises
  fragmentation least, ``topology-aware`` the least connected first, others in index order.
Node level (score 0..100, the highest wins; ties go to the earliest node in the caller's order, except
``fgd``, which breaks its own ties):
  ``binpack`` = 100 × node GPU allocation after placing, ``spread`` = 100 − that,
  ``bestfit`` = 100 × (1 − remaining), remaining = mean of free device share (normalised by the widest
  node) and free CPU (normalised by the largest node) — the FGD paper's Best-fit,
  ``fgd`` = ⌊100 · σ(−ΔF)⌋ (the FGD authors' integer score, below) + 0.5 × the node's fixed rank,
  ``random`` uniform, ``topology-aware`` = the fewest devices first (90 × (1 − (devices − 1) / widest)),
  then the fullest (+ 10 × allocation).
Topology (``count > 1``): a topology score — 100 when every pair is NVLink-connected, else
40 × (share of linked pairs) + 60 if all on one NUMA node — blends into the node score as
``(1 − w) · policy + w · topology`` (``w = topology_weight``, 0.3). On a node that describes its
topology the device set is also *chosen* by it — idle devices for whole-device requests, devices with
room for ``count`` shared slices (their processes talk to each other as much) — and among equally
connected sets the GPU policy's preference decides. Nodes without topology data keep the GPU policy's
``count`` best devices.

Fragmentation (FGD, Weng et al., USENIX ATC '23; the authors' pkg/utils/frag.go)
-------------------------------------------------------------------------------
Let a node's device *g* have free share ``f_g`` = unallocated memory / memory capacity (0 if held
whole). A task shape *m* (count, memory, compute, whole or shared, models, CPU) can use device g if g
fits one device's part of m. For one shape the node's fragmentation is the free capacity *m cannot use*::

    F_n(m) = Σ_g f_g · [g cannot take m]     if node n can host m at all (enough usable fitting devices —
                                             one MIG instance per card — and the CPU / host memory)
    F_n(m) = Σ_g f_g                          otherwise (all of its free capacity is lost to m)

A CPU-only shape (``count=0``) can use no device, so its ``F_n(m)`` is all of the node's free share
whatever the node's CPU (frag.go's XL / XR cases): the same for every candidate placement of a GPU task,
it steers nothing and only dilutes the GPU shapes' popularity, as in the paper.

Over the workload — shapes with popularity ``p_m`` (:class:`Workload`; the 32 most frequent) — the
expected fragmentation is ``F_n = Σ_m p_m · F_n(m)``. Popularity counts tasks, each once
(``TaskShape.demand_weight``, as the paper). ``fgd`` places a request where ``ΔF_n = F_n(after) −
F_n(before)`` is smallest: it keeps devices able to take the shapes that will come, instead of leaving
slivers nobody can use. As in the authors' score plugin, ΔF (devices' worth) is scored as the integer
``⌊100 · σ(−ΔF)⌋``, so changes within ≈ 0.04 of a device, and all large increases, tie. The GPU level
takes the device of most points (ties: lowest index); the node level the node of most points, ties going
to the node ranked first in a fixed pseudo-random order (a hash of ``policy.seed`` and the node name):
equal-score tasks pile onto the same nodes and the others stay whole for large tasks. On openb this
comes within 0.3 points of the authors' published FGD gain on every trace (meets it on three); exact
ΔF with a fullest-node tie-break fell 0.3–0.6 points short on five, and random ties lose ~5 points on
the default trace (8-GPU tasks find no whole node).
A CPU-only task (:func:`place_host`) changes ``F_n`` only through the CPU it takes (scored alike). Unlike the paper, which counts GPU
milli only, a device here fits a shape only when memory, compute *and* a split slot are free; ``f_g``
is measured in memory share because memory is the hard limit (compute is time-shared). Where the
workload comes from is the caller's: the simulator learns it from the arrivals, as a scheduler would
(the paper computes it from the whole trace up front; on openb that changes nothing measurable).
"""

from gpuslice.placement.core import filter_nodes, fits, node_fragmentation, place, place_host, score_nodes
from gpuslice.placement.fleet import Fleet
from gpuslice.placement.mix import WorkloadMix
from gpuslice.placement.resize import resize, resized_slices
from gpuslice.placement.model import (
    DEFAULT_SPLIT_COUNT,
    POLICIES,
    DeviceState,
    NodeState,
    NoFit,
    Placement,
    PlacementPolicy,
    TaskShape,
    Workload,
    apply,
    release,
)

__all__ = [
    "resize", "resized_slices",
    "DEFAULT_SPLIT_COUNT", "POLICIES", "DeviceState", "NodeState", "NoFit", "Placement", "PlacementPolicy",
    "TaskShape", "Workload", "WorkloadMix", "Fleet", "apply", "release", "place", "place_host", "score_nodes", "filter_nodes",
    "fits", "node_fragmentation",
]
