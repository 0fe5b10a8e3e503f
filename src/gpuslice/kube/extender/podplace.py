"""One pod on one node: which devices each of its GPU containers gets, with HAMi's per-pod rules.

Pure functions over placement's plain data (a :class:`NodeState`, a :class:`PodRequest`, a policy); the
extender calls :func:`place_pod` from filter (does it fit?), prioritize (how well?) and bind (the grant).

* App containers and sidecars (init containers with ``restartPolicy: Always``) run together: each is
  placed after the ones before it. An init container runs alone before the app containers, beside the
  sidecars: each is placed on the node as it is with the sidecars' slices only, and its slices are
  counted as HAMi counts them (per device the larger of the app containers' sum and the init container,
  :meth:`gpuslice.kube.formats.PodGrant.charges`).
* ``nvidia.com/numa-bind: "true"``: a container's devices all on one NUMA node — each NUMA node is tried
  and the best placement kept (devices whose NUMA node is unknown count as one node). HAMi's ``numa``
  policy (``binpack,numa``) prefers the same, and takes devices across NUMA nodes when no one has room.
* Whole MIG instances (:class:`~gpuslice.kube.podrequest.MigAsk`): ``count`` existing instances of the
  asked profile, or the smallest that hold the asked memory (HAMi takes the first MIG template that fits,
  smallest first), several of one card allowed; each held whole.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from gpuslice.kube.podrequest import ContainerRequest, PodRequest
from gpuslice.placement import NodeState, NoFit, Placement, PlacementPolicy, Workload, apply, place
from gpuslice.spec import Request, human_bytes


def restrict(state: NodeState, allowed: set[str]) -> NodeState:
    """``state`` where only the devices ``allowed`` take anything new (the others' grants still count)."""
    return replace(state, devices=tuple(d if d.uuid in allowed else replace(d, exclusive_taken=True)
                                        for d in state.devices))


def in_use(state: NodeState) -> set[str]:
    """Devices something is granted on (HAMi's ``used > 0``: what ``mutex`` keeps a pod away from)."""
    return {d.uuid for d in state.devices if d.slice_count or d.exclusive_taken}


def _numa_groups(state: NodeState) -> dict[int | None, set[str]]:
    groups: dict[int | None, set[str]] = {}
    for d in state.devices:
        groups.setdefault(d.numa_node, set()).add(d.uuid)
    return groups


def _mig_instances(state: NodeState, c: ContainerRequest) -> list[str]:
    """Profiles of this node's idle MIG instances that can serve ``c`` (smallest first)."""
    assert c.mig is not None
    need = c.mig.memory.bytes if c.mig.memory is not None and c.mig.memory.bytes is not None else 0
    ok = [d for d in state.devices if d.profile and (not c.mig.profile or d.profile == c.mig.profile)
          and d.memory_total >= need]
    return sorted({d.profile for d in ok}, key=lambda p: min(d.memory_total for d in ok if d.profile == p))


def _mig_reason(state: NodeState, c: ContainerRequest) -> str:
    assert c.mig is not None
    want = f"profile {c.mig.profile}" if c.mig.profile else "any profile"
    if c.mig.memory is not None and c.mig.memory.bytes is not None:
        want += f" with at least {human_bytes(c.mig.memory.bytes)}"
    free: dict[str, int] = {}
    for d in state.devices:
        if d.profile and d.is_idle:
            free[d.profile] = free.get(d.profile, 0) + 1
    shown = ", ".join(f"{n} × {p}" for p, n in sorted(free.items())) or "none"
    return f"needs {c.mig.count} idle MIG instance(s) of {want}; idle instances here: {shown}"


def _place_mig(c: ContainerRequest, state: NodeState, policy: PlacementPolicy) -> Placement:
    """``c.mig.count`` whole instances, the smallest that fit first (several of one card may serve)."""
    assert c.mig is not None
    profiles = _mig_instances(state, c)
    if not profiles:
        raise NoFit(_mig_reason(state, c))
    one = replace(c.request, count=1, models=tuple(profiles))
    smallest = replace(policy, gpu="bestfit")  # bestfit takes the idle device of least memory first
    slices, score = [], 0.0
    for k in range(c.mig.count):
        try:
            p = place(one, [state], smallest)
        except NoFit:
            raise NoFit(_mig_reason(state, c)) from None
        state = apply(state, p.slices, exclusive=True)
        slices.extend(p.slices)
        score = p.score if k == 0 else score
    return Placement(state.name, tuple(slices), score, exclusive=True)


def _choices(state: NodeState, request: Request, numa: bool) -> Iterator[tuple[str, NodeState]]:
    """The node states a container may be placed on: the node, or with numa each NUMA node alone."""
    if not numa or request.count == 1:
        yield "", state
        return
    for numa_node, uuids in sorted(_numa_groups(state).items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        yield f"NUMA node {'unknown' if numa_node is None else numa_node}", restrict(state, uuids)


def place_container(c: ContainerRequest, state: NodeState, policy: PlacementPolicy,
                    numa_bind: bool = False, numa_prefer: bool = False, *, workload: Workload | None = None,
                    demand: tuple[int, int] = (0, 0)) -> Placement:
    """The best placement of one container on ``state`` (raises :class:`NoFit` with the reason). With
    ``numa_prefer`` (HAMi's ``numa`` policy) a multi-device container goes to one NUMA node when one has
    room, else anywhere; ``numa_bind`` makes that a rule. ``workload`` is FGD's target workload, ``demand``
    the CPU (milli) and host memory that go with this container (the pod's, with its first one)."""
    if numa_prefer and not numa_bind and c.request.count > 1:
        try:
            return place_container(c, state, policy, numa_bind=True, workload=workload, demand=demand)
        except NoFit:
            pass
    best: Placement | None = None
    reasons = []
    for label, st in _choices(state, c.request, numa_bind):
        try:
            p = _place_mig(c, st, policy) if c.mig is not None else place(
                c.request, [st], policy, workload=workload, cpu_milli=demand[0], host_memory=demand[1])
        except NoFit as exc:
            reasons.append(f"{label}: {exc.reason}" if label else exc.reason)
            continue
        if best is None or p.score > best.score:
            best = p
    if best is None:
        if numa_bind and c.request.count > 1:
            raise NoFit(f"nvidia.com/numa-bind: no NUMA node has {c.request.count} devices that fit ("
                        + "; ".join(reasons) + ")")
        raise NoFit(reasons[0] if reasons else "no devices")
    return best


def place_pod(req: PodRequest, state: NodeState, policy: PlacementPolicy, *, workload: Workload | None = None,
              demand: tuple[int, int] = (0, 0)) -> list[tuple[ContainerRequest, Placement]]:
    """Every GPU container of the pod on ``state``, in the pod's order (raises :class:`NoFit` naming the
    container that does not fit). See the module docstring for init containers and sidecars. The pod's CPU
    and host memory (``demand``) go with its first app container or sidecar, as the simulator places a task."""
    placed: dict[str, Placement] = {}
    running, beside_inits = state, state
    for c in req.containers:
        if c.kind == "init":
            continue
        cpu, mem = demand if not placed else (0, 0)
        p = _named(c, running, policy, req, workload, (cpu, mem))
        running = apply(running, p.slices, exclusive=p.exclusive, cpu_milli=cpu, host_memory=mem)
        if c.kind == "sidecar":
            beside_inits = apply(beside_inits, p.slices, exclusive=p.exclusive)
        placed[c.name] = p
    for c in req.containers:
        if c.kind == "init":
            placed[c.name] = _named(c, beside_inits, policy, req, workload, (0, 0))
    return [(c, placed[c.name]) for c in req.containers]


def _named(c: ContainerRequest, state: NodeState, policy: PlacementPolicy, req: PodRequest,
           workload: Workload | None, demand: tuple[int, int]) -> Placement:
    try:
        return place_container(c, state, policy, req.numa_bind, req.numa_prefer, workload=workload, demand=demand)
    except NoFit as exc:
        what = "init container" if c.kind == "init" else "sidecar" if c.kind == "sidecar" else "container"
        raise NoFit(f"{what} {c.name}: {exc.reason}", exc.per_node) from None


def pod_score(placed: list[tuple[ContainerRequest, Placement]]) -> float:
    """The node's score for the pod: its first app container's (the one the shared fleet would score)."""
    for c, p in placed:
        if c.kind == "app":
            return p.score
    return placed[0][1].score if placed else 0.0


__all__ = ["in_use", "place_container", "place_pod", "pod_score", "restrict"]
