"""A node as placement sees it from its annotations: ledger usage, unhealthy devices, lost GPUs."""

from __future__ import annotations

import pytest
from kubefixtures import devices

from gpuslice.kube import formats, nodestate, resources
from gpuslice.spec import Device, GiB

from .test_formats import _grant

CFG = resources.KubeConfig()


def test_node_state_counts_ledger_and_blocks_unhealthy_devices():
    devs = devices("n1", 2)
    nd = formats.decode_node_devices(formats.encode_node_devices(devs, health={devs[1].uuid: formats.UNHEALTHY}))
    led = formats.Ledger({}).with_entry(_grant(uuid=devs[0].uuid, memory=10 * GiB, compute=40))
    st = nodestate.node_state("n1", nd, led)
    assert st.devices[0].used_memory == 10 * GiB and st.devices[0].used_compute == 40
    assert st.devices[1].free_memory == 0  # unhealthy: nothing new lands there


@pytest.mark.parametrize("scaling", [1.0, 0.9, 2.0])
def test_a_lost_gpu_with_live_grants_is_a_phantom_not_a_broken_node(scaling):
    """The ledger names a GPU the node no longer publishes (lost, or an agent restarted without it): the
    node keeps taking slices on its other devices; the lost one takes nothing and its grants still count."""
    devs = devices("n1", 2)
    nd = formats.decode_node_devices(formats.encode_node_devices(devs, memory_scaling=scaling))
    led = (formats.Ledger({}).with_entry(_grant("u1", uuid="GPU-gone", memory=60 * GiB, compute=60))
           .with_entry(_grant("u2", uuid="GPU-gone", memory=5 * GiB, compute=10))
           .with_entry(_grant("u3", uuid=devs[0].uuid, memory=GiB)))
    st = nodestate.node_state("n1", nd, led)
    by = {d.uuid: d for d in st.devices}
    assert set(by) == {devs[0].uuid, devs[1].uuid, "GPU-gone"}
    ghost = by["GPU-gone"]
    assert (ghost.used_memory, ghost.used_compute, ghost.slice_count) == (65 * GiB, 70, 2)  # held
    assert ghost.exclusive_taken and ghost.free_memory == 0 and ghost.model == nodestate.PHANTOM
    assert by[devs[0].uuid].used_memory == GiB and not by[devs[1].uuid].exclusive_taken
    from gpuslice.placement import place
    from gpuslice.spec import MemoryAmount as M, Request

    p = place(Request(count=2, memory=M(bytes=GiB)), [st])  # the two real GPUs, never the phantom
    assert {s.device_uuid for s in p.slices} == {devs[0].uuid, devs[1].uuid}
    # the GPU comes back: the same grants count on it again, nothing phantom remains
    back = formats.decode_node_devices(formats.encode_node_devices(
        [*devs, Device(uuid="GPU-gone", index=2, name="NVIDIA H100 80GB HBM3", memory_total=devs[0].memory_total,
                       sm_count=132, model=devs[0].model)], memory_scaling=scaling))
    st = nodestate.node_state("n1", back, led)
    assert {d.uuid: d.used_memory for d in st.devices}["GPU-gone"] == 65 * GiB
    assert not any(d.model == nodestate.PHANTOM for d in st.devices)
