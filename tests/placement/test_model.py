"""The plain-data model: validation at the edge, apply/release bookkeeping, building from NVML devices."""

from __future__ import annotations

import pytest

from gpuslice.placement import DeviceState, NodeState, PlacementPolicy, apply, release
from gpuslice.spec import Device, GiB, MigInstance, Slice, SpecError


def _dev(uuid="GPU-0", mem=16 * GiB, **kw):
    return DeviceState(uuid=uuid, memory_total=mem, **kw)


def test_memory_scaling_sets_capacity_and_refuses_overcommitted_state():
    """Capacity is total × scaling; a state already above it is refused with the field named."""
    assert _dev(memory_scaling=1.5).memory_capacity == 24 * GiB
    with pytest.raises(SpecError, match="used_memory"):
        _dev(used_memory=17 * GiB)
    with pytest.raises(SpecError, match="slice_count"):
        _dev(split_count=2, slice_count=3)
    with pytest.raises(SpecError, match="used_compute"):
        _dev(used_compute=101)


def test_apply_then_release_is_identity_and_overcommit_is_refused():
    """apply adds a slice's memory/compute/slot; release undoes it; exceeding capacity raises."""
    node = NodeState("n", (_dev(split_count=2),), cpu_milli=4000)
    s = Slice("GPU-0", 10 * GiB, compute=60)
    after = apply(node, [s], cpu_milli=1000)
    d = after.devices[0]
    assert (d.used_memory, d.used_compute, d.slice_count, after.cpu_used) == (10 * GiB, 60, 1, 1000)
    assert release(after, [s], cpu_milli=1000) == node
    with pytest.raises(SpecError):
        apply(after, [Slice("GPU-0", 7 * GiB)])  # 17 GiB > 16 GiB
    with pytest.raises(SpecError):
        apply(after, [Slice("GPU-0", 1 * GiB, compute=50)])  # 110 %
    with pytest.raises(SpecError, match="cpu"):
        apply(after, [Slice("GPU-0", 1 * GiB)], cpu_milli=3500)


def test_exclusive_device_takes_nothing_more_and_release_frees_it():
    node = NodeState("n", (_dev(),))
    held = apply(node, [Slice("GPU-0", 4 * GiB)], exclusive=True)
    assert held.devices[0].exclusive_taken and held.devices[0].free_memory == 0
    with pytest.raises(SpecError, match="held whole"):
        apply(held, [Slice("GPU-0", 1 * GiB)])
    assert release(held, [Slice("GPU-0", 4 * GiB)], exclusive=True) == node


def test_from_devices_expands_mig_instances_and_applies_ledger_slices():
    """A MIG card contributes its instances (model kept, profile recorded); ledger slices are applied."""
    mig = Device(uuid="GPU-m", index=0, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108,
                 model="A100-80GB", numa_node=0, mig_enabled=True,
                 mig_instances=(MigInstance("MIG-a", "3g.40gb", 40 * GiB, 42), MigInstance("MIG-b", "1g.10gb", 10 * GiB, 14)))
    plain = Device(uuid="GPU-p", index=1, name="NVIDIA T4", memory_total=16 * GiB, sm_count=40)
    node = NodeState.from_devices("n", [mig, plain], [Slice("MIG-b", 5 * GiB, compute=20), Slice("GPU-p", 2 * GiB)],
                                  exclusive=["GPU-p"], split_count=4)
    uuids = [d.uuid for d in node.devices]
    assert uuids == ["MIG-a", "MIG-b", "GPU-p"]
    mig_b = node.device("MIG-b")
    assert (mig_b.profile, mig_b.parent_uuid, mig_b.model, mig_b.used_memory, mig_b.split_count) == \
        ("1g.10gb", "GPU-m", "A100-80GB", 5 * GiB, 4)
    assert mig_b.matches(("1g.10gb",)) and mig_b.matches(("A100-80GB/1g.10gb",)) and not mig_b.matches(("T4",))
    assert node.device("GPU-p").model == "NVIDIA T4" and node.device("GPU-p").exclusive_taken
    with pytest.raises(SpecError, match="device_uuid"):
        NodeState.from_devices("n", [plain], [Slice("GPU-x", GiB)])


def test_policy_parse_and_refusal_names_allowed_values():
    assert PlacementPolicy.parse("fgd") == PlacementPolicy(node="fgd", gpu="fgd")
    assert PlacementPolicy.parse("node=spread,gpu=binpack") == PlacementPolicy(node="spread", gpu="binpack")
    with pytest.raises(SpecError, match="binpack, spread, bestfit, fgd, random"):
        PlacementPolicy.parse("tetris")
    with pytest.raises(SpecError, match="policy"):
        PlacementPolicy.parse("rack=binpack")


def test_mig_enabled_card_without_instances_contributes_no_device():
    """A MIG-mode GPU runs CUDA work only inside an instance: with none created it must not be placed
    as a whole GPU (it would be granted, and the program would find no usable device)."""
    from gpuslice.placement import NoFit, place
    from gpuslice.spec import Request, parse_memory

    bare = Device(uuid="GPU-m", index=0, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB, sm_count=108,
                  model="A100-80GB", mig_enabled=True, mig_instances=())
    plain = Device(uuid="GPU-p", index=1, name="NVIDIA T4", memory_total=16 * GiB, sm_count=40)
    assert NodeState.from_devices("n", [bare]).devices == ()
    node = NodeState.from_devices("n", [bare, plain])
    assert [d.uuid for d in node.devices] == ["GPU-p"]
    with pytest.raises(NoFit):  # 40 GiB fit only on the (unusable) 80 GiB card
        place(Request(memory=parse_memory("40GiB")), [node])
    with pytest.raises(SpecError, match="device_uuid"):  # a ledger slice on it names a device that is not there
        NodeState.from_devices("n", [bare], [Slice("GPU-m", GiB)])
