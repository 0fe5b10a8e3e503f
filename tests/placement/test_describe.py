"""Refusal wording helpers: devices named as the caller calls them, neighbours with the same room told once."""

from __future__ import annotations

from gpuslice.placement import NodeState
from gpuslice.placement.model import DeviceState, describe_free
from gpuslice.placement.whynot import name_devices
from gpuslice.spec import GiB


def _node(used: list[int]) -> NodeState:
    return NodeState("n", tuple(DeviceState(f"GPU-{k}", 80 * GiB, used_memory=u * GiB, slice_count=1 if u else 0)
                                for k, u in enumerate(used)))


def test_describe_free_groups_neighbours_with_the_same_room_and_uses_given_names():
    node = _node([70, 0, 0, 0, 70])
    names = {f"GPU-{k}": f"GPU {k}" for k in range(5)}
    assert describe_free(node, names) == ("GPU 0: 10.0 GiB, 100% compute, 9 slots free; "
                                          "GPU 1–3: 80.0 GiB, 100% compute, 10 slots free each; "
                                          "GPU 4: 10.0 GiB, 100% compute, 9 slots free")


def test_describe_free_without_names_keeps_uuids():
    text = describe_free(_node([0, 0]))
    assert text == "GPU-0–1: 80.0 GiB, 100% compute, 10 slots free each"


def test_name_devices_replaces_longer_uuids_first():
    names = {"GPU-a": "GPU 0", "GPU-a-mig1": "GPU 0 MIG 1"}
    assert name_devices("free on GPU-a-mig1 and GPU-a", names) == "free on GPU 0 MIG 1 and GPU 0"
