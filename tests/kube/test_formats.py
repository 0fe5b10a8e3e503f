"""The annotation formats: node devices, pod grants, the node ledger, the allocation lock and marks."""

from __future__ import annotations

import json

import pytest
from kubefixtures import H100, devices

from gpuslice.kube import formats, nodestate, resources
from gpuslice.spec import ComputeMode, Device, GiB, Grant, MigInstance, Priority, Slice, SpecError

CFG = resources.KubeConfig()


def test_node_devices_round_trip_keeps_topology_mig_and_health():
    devs = devices("n1", 2)
    mig = Device(uuid="GPU-mig-parent", index=2, name="NVIDIA A100 80GB", memory_total=80 * GiB, sm_count=108,
                 model="A100-80GB", numa_node=1, nvlink_peers=(devs[0].uuid,), mig_enabled=True,
                 mig_instances=(MigInstance("MIG-aaaa", "3g.40gb", 40 * GiB, 42),), extra={"minor": 2})
    text = formats.encode_node_devices([*devs, mig], health={devs[1].uuid: formats.UNHEALTHY}, split_count=4,
                                     memory_scaling=1.5, now=1000.0)
    back = formats.decode_node_devices(text)
    assert [d.uuid for d in back.devices] == [devs[0].uuid, devs[1].uuid, "GPU-mig-parent"]
    assert back.devices[2].mig_instances == mig.mig_instances and back.devices[2].nvlink_peers == (devs[0].uuid,)
    assert back.devices[2].extra["minor"] == 2 and back.devices[0].memory_total == H100
    assert back.split_count == 4 and back.memory_scaling == 1.5 and back.updated == 1000.0
    assert not back.healthy(devs[1].uuid) and back.healthy(devs[0].uuid)
    assert json.loads(text)["version"] == 1


@pytest.mark.parametrize("text, field", [
    ("not json", "gpuslice.io/devices"),
    ('{"version": 2, "devices": []}', "gpuslice.io/devices.version"),
    ('{"version": 1, "devices": [{"uuid": "GPU-1", "memory": -5}]}', "gpuslice.io/devices.devices[0].memory"),
    ('{"version": 1, "devices": [{"uuid": "GPU-1", "memory": 5, "health": "meh"}]}',
     "gpuslice.io/devices.devices[0].health"),
    ('{"version": 1, "devices": [{"memory": 5}]}', "gpuslice.io/devices.devices[0].uuid"),
    ('{"version": 1, "devices": "x"}', "gpuslice.io/devices.devices"),
])
def test_bad_node_devices_name_the_field(text, field):
    with pytest.raises(SpecError) as exc:
        formats.decode_node_devices(text)
    assert exc.value.field == field


def _grant(uid="u1", node="n1", uuid="GPU-1", memory=4 * GiB, compute=30):
    return formats.PodGrant(node=node, pod_uid=uid, namespace="ns", pod="p", bound_at=12.5, containers=(
        formats.ContainerGrant("main", Grant(formats.grant_id_for(uid, "main"),
                                             (Slice(uuid, memory, compute, Priority.HIGH, ComputeMode.SOFT, 3),))),))


def test_pod_grant_and_ledger_round_trip():
    g = _grant()
    assert formats.decode_pod_grant(formats.encode_pod_grant(g)) == g
    led = formats.Ledger({}).with_entry(g).with_entry(_grant("u2", memory=GiB))
    back = formats.decode_ledger(formats.encode_ledger(led), "n1")
    assert back.entries == led.entries
    assert len(back.without(["u1"]).entries) == 1
    slices, exclusive = back.slices()
    assert sum(s.memory_limit for s in slices) == 5 * GiB and exclusive == set()
    assert formats.decode_ledger(None, "n1").entries == {}


def test_bad_grant_names_the_field():
    data = json.loads(formats.encode_pod_grant(_grant()))
    data["containers"][0]["slices"][0]["compute"] = 130
    with pytest.raises(SpecError) as exc:
        formats.decode_pod_grant(json.dumps(data))
    assert exc.value.field == "gpuslice.io/grant.containers[0].slices[0].compute"


def test_allocated_marks():
    assert formats.decode_allocated(formats.encode_allocated(["b", "a", "a"])) == {"a", "b"}
    assert formats.decode_allocated(None) == set()


def test_allocation_lock_annotation_round_trips_and_names_bad_fields():
    assert formats.decode_allocating(formats.encode_allocating(["b", "a", "a"])) == {"a", "b"}
    assert formats.encode_allocating(["b", "a"]) == '{"pods":["a","b"],"version":1}'
    assert formats.encode_allocating([]) is None  # no holder: the key is deleted, not left empty
    assert formats.decode_allocating(None) == frozenset()
    for bad, field in (('{"version": 1, "pods": "u1"}', "gpuslice.io/allocating.pods"),
                       ('{"version": 1, "pods": [""]}', "gpuslice.io/allocating.pods"),
                       ('{"version": 2, "pods": []}', "gpuslice.io/allocating.version"),
                       ("[]", "gpuslice.io/allocating")):
        with pytest.raises(SpecError) as exc:
            formats.decode_allocating(bad)
        assert exc.value.field == field, bad


# ------------------------------------------------------------------ init containers and sidecars
def _pod(*containers):
    return formats.PodGrant(node="n1", pod_uid="u9", namespace="ns", pod="p", containers=tuple(
        formats.ContainerGrant(name, Grant(formats.grant_id_for("u9", name), tuple(
            Slice(u, m * GiB, c) for u, m, c in slices), exclusive), kind)
        for name, kind, exclusive, slices in containers))


def _held(grant):
    """{uuid: (memory GiB, compute, slices)} of what the pod holds, and the UUIDs held whole."""
    out, whole = {}, set()
    for slices, excl in grant.charges():
        for s in slices:
            mem, comp, n = out.get(s.device_uuid, (0, 0, 0))
            out[s.device_uuid] = (mem + s.memory_limit // GiB, comp + s.compute, n + 1)
            if excl:
                whole.add(s.device_uuid)
    return out, whole


def test_an_init_container_counts_only_where_it_is_larger_than_the_app_containers():
    """HAMi's max(sum(app), max(init)) per device, memory and compute each; sidecars add to both sides."""
    g = _pod(("init", "init", False, [("G0", 20, 10), ("G1", 6, 0)]),
             ("side", "sidecar", False, [("G0", 2, 5)]),
             ("a", "app", False, [("G0", 8, 30)]),
             ("b", "app", False, [("G0", 4, 0), ("G2", 3, 0)]))
    held, whole = _held(g)
    # G0: sidecar 2 + max(app 12, init 20) = 22 GiB; compute 5 + max(30, 10) = 35; three slices (no extra slot)
    assert held["G0"] == (22, 35, 3)
    assert held["G1"] == (6, 0, 1)   # only the init container there: its own slice
    assert held["G2"] == (3, 0, 1) and whole == set()
    plain = _pod(("a", "app", False, [("G0", 8, 30)]), ("b", "app", False, [("G0", 4, 0)]))
    assert [len(s) for s, _ in plain.charges()] == [1, 1]  # without init containers: the grants as they are


def test_a_device_any_container_holds_whole_is_held_whole_as_one_slice():
    g = _pod(("init", "init", True, [("G0", 80, 100)]), ("a", "app", False, [("G0", 10, 20), ]),
             ("b", "app", False, [("G1", 5, 0)]))
    held, whole = _held(g)
    assert held["G0"] == (80, 100, 1) and whole == {"G0"} and held["G1"] == (5, 0, 1)
    # the node view applies it without complaint, and a slice elsewhere still fits beside G1
    devs = devices("n1", 2)
    g = _pod(("init", "init", True, [(devs[0].uuid, 70, 100)]), ("a", "app", False, [(devs[0].uuid, 10, 20)]))
    nd = formats.decode_node_devices(formats.encode_node_devices(devs))
    st = nodestate.node_state("n1", nd, formats.Ledger({}).with_entry(g))
    assert st.devices[0].exclusive_taken and st.devices[0].used_memory == 70 * GiB and st.devices[1].is_idle


def test_container_kind_round_trips_and_app_objects_keep_their_old_spelling():
    g = _pod(("init", "init", False, [("G0", 1, 0)]), ("a", "app", False, [("G0", 1, 0)]))
    text = formats.encode_pod_grant(g)
    items = json.loads(text)["containers"]
    assert items[0]["kind"] == "init" and "kind" not in items[1]
    assert formats.decode_pod_grant(text) == g
    items[0]["kind"] = "helper"
    with pytest.raises(SpecError) as exc:
        formats.decode_pod_grant(json.dumps({**json.loads(text), "containers": items}))
    assert exc.value.field == "gpuslice.io/grant.containers[0].kind"


def test_device_cordon_reads_hami_and_gpuslice_names():
    node = {"metadata": {"annotations": {"hami.io/device-cordon": " GPU-a, GPU-b ,", "gpuslice.io/device-cordon": "GPU-c"}}}
    assert formats.cordoned(node) == {"GPU-a", "GPU-b", "GPU-c"}
    assert formats.cordoned({"metadata": {}}) == frozenset()
