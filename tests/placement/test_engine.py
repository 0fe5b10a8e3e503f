"""Placement knows each device's engine: a device runs time-sliced or spatial slices, never both at once."""

from __future__ import annotations

import pytest

from gpuslice.placement import DeviceState, Fleet, NodeState, NoFit, apply, filter_nodes, place, release
from gpuslice.spec import Engine, GiB, MemoryAmount, Request, Slice, SpecError

SPATIAL, TIMESLICE = Engine.SPATIAL, Engine.TIMESLICE


def _node(name: str = "a", n: int = 2) -> NodeState:
    return NodeState(name, tuple(DeviceState(f"GPU-{name}-{j}", 80 * GiB, model="H100") for j in range(n)))


def _req(engine: Engine, gib: int = 4, compute: int = 25) -> Request:
    return Request(memory=MemoryAmount(bytes=gib * GiB), compute=compute, engine=engine)


def test_a_spatial_request_gets_a_spatial_slice() -> None:
    p = place(_req(SPATIAL), [_node()])
    assert p.slices[0].engine is SPATIAL
    node = apply(_node(), p.slices)
    assert node.device(p.slices[0].device_uuid).engine is SPATIAL


def test_binpack_does_not_pack_a_spatial_slice_onto_a_time_sliced_device() -> None:
    """binpack would choose the used device; its engine keeps the spatial slice off it."""
    node = apply(_node(), [Slice("GPU-a-0", 8 * GiB, compute=30)])
    assert node.device("GPU-a-0").engine is TIMESLICE
    p = place(_req(SPATIAL), [node])
    assert p.slices[0].device_uuid == "GPU-a-1"
    node = apply(node, p.slices)
    # ... and the next time-sliced slice joins the time-sliced device, a spatial one the spatial device
    assert place(_req(TIMESLICE), [node]).slices[0].device_uuid == "GPU-a-0"
    assert place(_req(SPATIAL), [node]).slices[0].device_uuid == "GPU-a-1"


def test_no_device_of_the_engine_with_room_is_refused_saying_why() -> None:
    node = apply(_node(n=1), [Slice("GPU-a-0", 8 * GiB, compute=30, engine=SPATIAL)])
    with pytest.raises(NoFit) as info:
        place(_req(TIMESLICE), [node])
    assert "devices with room run spatial slices" in info.value.reason
    fitting, reasons = filter_nodes(_req(TIMESLICE), [node])
    assert fitting == [] and "run spatial slices (a device runs one engine at a time)" in reasons["a"]
    assert "spatial engine" in filter_nodes(_req(SPATIAL, gib=100), [node])[1]["a"]


def test_the_engine_is_freed_with_the_last_slice() -> None:
    one, two = Slice("GPU-a-0", GiB, engine=SPATIAL), Slice("GPU-a-0", 2 * GiB, engine=SPATIAL)
    node = apply(_node(n=1), [one, two])
    node = release(node, [one])
    assert node.device("GPU-a-0").engine is SPATIAL
    node = release(node, [two])
    assert node.device("GPU-a-0").engine is None
    assert place(_req(TIMESLICE), [node]).slices[0].engine is TIMESLICE


@pytest.mark.parametrize("kept", [False, True])
def test_mixing_engines_on_a_device_is_refused_and_nothing_half_applied(kept: bool) -> None:
    node = apply(_node(), [Slice("GPU-a-0", GiB)])
    bad = [Slice("GPU-a-1", GiB, engine=SPATIAL), Slice("GPU-a-0", GiB, engine=SPATIAL)]
    if kept:
        fleet = Fleet([node])
        with pytest.raises(SpecError) as info:
            fleet.apply("a", bad)
        assert fleet.node_state("a") == node  # the first slice was not applied either
    else:
        with pytest.raises(SpecError) as info:
            apply(node, bad)
    assert info.value.field == "engine" and "timeslice, the engine of the 1 slice(s) on GPU-a-0" in info.value.allowed


def test_a_kept_fleet_and_plain_states_agree_on_engines() -> None:
    fleet = Fleet([_node()])
    plain = _node()
    for engine in (SPATIAL, TIMESLICE, SPATIAL, TIMESLICE):
        p = place(_req(engine), fleet)
        fleet.apply_placement(p)
        plain = apply(plain, p.slices)
        assert fleet.node_state("a") == plain
    assert [d.engine for d in plain.devices] == [SPATIAL, TIMESLICE]
    assert Fleet([plain]).node_state("a") == plain


def test_hand_made_states_with_slices_and_no_engine_are_time_sliced() -> None:
    """States built before engines existed (tests, callers) keep their meaning."""
    d = DeviceState("GPU-0", 16 * GiB, used_memory=GiB, slice_count=1)
    assert d.engine is TIMESLICE
    with pytest.raises(SpecError, match="engine"):
        DeviceState("GPU-0", 16 * GiB, engine=SPATIAL)  # an engine without slices
