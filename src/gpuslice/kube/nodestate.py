"""A node as placement sees it, from what the agent published (``gpuslice.io/devices``) and what the
extender granted there (``gpuslice.io/ledger``): devices, granted slices, devices that take nothing new."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from gpuslice.kube.formats import HEALTHY, Ledger, NodeDevices, PodGrant
from gpuslice.placement import NodeState, apply
from gpuslice.spec import Device


PHANTOM = "(not published)"  # the name of a device a grant holds but the node no longer publishes


def phantom_devices(devices: NodeDevices, ledger: Ledger) -> tuple[Device, ...]:
    """Devices the ledger grants on that the node no longer publishes (a GPU lost with pods still running
    on it, an agent restarted without it, a changed MIG layout). They stand in the placement view as
    devices that take nothing new while their grants keep counting, so the node's other devices stay
    schedulable and nothing is freed before garbage collection takes the grants back."""
    known = {d.uuid for d in devices.devices} | {m.uuid for d in devices.devices for m in d.mig_instances}
    held: dict[str, int] = {}
    for g in ledger.entries.values():
        for c in g.containers:
            for sl in c.slices:
                if sl.device_uuid not in known:
                    held[sl.device_uuid] = held.get(sl.device_uuid, 0) + sl.memory_limit
    # Big enough for what is granted on it whatever the node's memory scaling (a reserve below 1 would
    # otherwise make the grants look like an over-commit).
    scale = min(1.0, devices.memory_scaling)
    first = len(devices.devices)
    return tuple(Device(uuid=u, index=first + k, name=PHANTOM, memory_total=int(mem / scale) + 1, sm_count=0,
                        model=PHANTOM)
                 for k, (u, mem) in enumerate(sorted(held.items())))


def node_state(name: str, devices: NodeDevices, ledger: Ledger, *,
               blocked: Iterable[str] = ()) -> NodeState:
    """The placement view of a node: its devices, what the ledger already grants, and devices that may
    not take new slices (unhealthy ones, devices the ledger names but the node no longer publishes — see
    :func:`phantom_devices` —, plus ``blocked``, e.g. a pod's ``nouse-gpuuuid``).

    A ledger that over-commits a device (it cannot, unless edited by hand) raises :class:`SpecError`.
    """
    shared, exclusive = ledger.slices()
    phantoms = phantom_devices(devices, ledger)
    state = NodeState.from_devices(name, (*devices.devices, *phantoms), shared, exclusive=exclusive,
                                   split_count=devices.split_count, memory_scaling=devices.memory_scaling)
    stop = set(blocked) | {u for u, h in devices.health.items() if h != HEALTHY} | {d.uuid for d in phantoms}
    if stop:
        parents = {d.uuid for d in devices.devices}
        changed = []
        for d in state.devices:
            if d.uuid in stop or (d.parent_uuid in stop and d.parent_uuid in parents):
                d = replace(d, exclusive_taken=True)  # nothing new lands here; its grants stay counted
            changed.append(d)
        state = replace(state, devices=tuple(changed))
    return state


def apply_grant(state: NodeState, grant: PodGrant) -> NodeState:
    for slices, whole in grant.charges():
        state = apply(state, slices, exclusive=whole)
    return state
