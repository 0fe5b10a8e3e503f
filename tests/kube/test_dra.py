"""The DRA driver's parts on plain data: the ResourceSlice it publishes, how an allocated claim becomes a grant,
the checkpoint, prepare/unprepare (files, CDI spec, idempotence, a restart in between) and the publisher's writes.
The real API server (slice validation, the scheduler's allocator) and the gRPC wire are in tests/e2e/test_kube_dra.py
and test_dra_plugin.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from deeptree import make_deep_tree, remove_any_depth
from fakedra import FakeDraAPI, allocated_claim
from gpuslice.enforcer.policy import read_policies
from gpuslice.enforcer.slicefile import read_slice_file
from gpuslice.host.devices import load_snapshot
from gpuslice.kube.allocator import PluginConfig
from gpuslice.kube.dra import cdi
from gpuslice.kube.dra.checkpoint import Checkpoint
from gpuslice.kube.dra.claims import claim_grant, read_allocation
from gpuslice.kube.dra.driver import ClaimRef, DraConfig, DraDriver
from gpuslice.kube.dra.publisher import SlicePublisher
from gpuslice.kube.dra.resourceslice import (
    MiB, Sharing, device_name, nvlink_islands, resource_slice_spec, slice_devices, slice_name,
)
from gpuslice.spec import ComputeMode, Priority, SpecError

GiB = 1024 * MiB
H100 = load_snapshot("h100-80gb")
H100_MEMORY = H100[0].memory_total
NODE = "n1"


def by_name(devices=H100) -> dict:
    return {d.name: d for d in slice_devices(devices)}


def name_of(i: int, devices=H100) -> str:
    return device_name(devices[i].uuid)


# ------------------------------------------------------------------------------------------ the slice
def test_slice_offers_every_gpu_with_consumable_memory_compute_and_split_count() -> None:
    spec = resource_slice_spec(NODE, H100, Sharing(split_count=7, memory_scaling=1.0, min_memory=2 * GiB))
    assert spec["driver"] == "gpuslice.io" and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [d.uuid.lower() for d in H100]
    dev = spec["devices"][0]
    assert dev["allowMultipleAllocations"] is True
    memory = H100_MEMORY // MiB * MiB
    assert dev["capacity"]["memory"] == {"value": str(memory), "requestPolicy": {
        "default": str(memory), "validRange": {"min": str(2 * GiB), "step": str(MiB)}}}
    assert dev["capacity"]["compute"]["value"] == "100"
    assert dev["capacity"]["compute"]["requestPolicy"] == {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}
    assert dev["capacity"]["slices"] == {"value": "7", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}}}
    attrs = dev["attributes"]
    assert attrs["uuid"] == {"string": H100[0].uuid} and attrs["model"] == {"string": "H100-80GB-HBM3"}
    assert attrs["computeCapability"] == {"version": "9.0.0"} and attrs["numaNode"] == {"int": 0}
    assert attrs["nvlinkPeers"] == {"int": 7} and attrs["mig"] == {"bool": False} and attrs["sms"] == {"int": 132}
    # All 8 NVSwitch-connected GPUs form one island, named by the smallest UUID.
    islands = {d["attributes"]["nvlinkIsland"]["string"] for d in spec["devices"]}
    assert islands == {min(d.uuid for d in H100).lower()}
    assert all(len(a["string"]) <= 64 for d in spec["devices"] for a in d["attributes"].values() if "string" in a)
    assert all(len(d["attributes"]) + len(d["capacity"]) <= 32 for d in spec["devices"])
    assert "taints" not in dev


def test_memory_scaling_and_minimum_slice_shape_the_memory_capacity() -> None:
    spec = resource_slice_spec(NODE, H100[:1], Sharing(memory_scaling=0.5, min_memory=1024 * GiB))
    memory = spec["devices"][0]["capacity"]["memory"]
    half = int(H100_MEMORY * 0.5) // MiB * MiB
    assert memory["value"] == memory["requestPolicy"]["default"] == str(half)
    assert memory["requestPolicy"]["validRange"]["min"] == str(half)  # never above the capacity (API rule)
    with pytest.raises(SpecError) as err:
        Sharing(min_memory=GiB + 1)
    assert err.value.field == "min_memory"


def test_islands_follow_nvlink_groups_and_lone_gpus_are_their_own() -> None:
    a, b, c = (replace(H100[i], nvlink_peers=()) for i in range(3))
    a, b = replace(a, nvlink_peers=(b.uuid,)), replace(b, nvlink_peers=(a.uuid,))
    islands = nvlink_islands([a, b, c])
    assert islands[a.uuid] == islands[b.uuid] == min(a.uuid, b.uuid).lower()
    assert islands[c.uuid] == c.uuid.lower()


def test_mig_cards_offer_their_instances_not_themselves() -> None:
    mig = load_snapshot("a100-80gb-mig")
    devices = resource_slice_spec(NODE, mig, Sharing())["devices"]
    instances = [m for card in mig for m in card.mig_instances]
    assert [d["name"] for d in devices] == [device_name(m.uuid) for m in instances]
    first = devices[0]["attributes"]
    assert first["mig"] == {"bool": True} and first["migProfile"] == {"string": "3g.40gb"}
    assert first["parentUUID"] == {"string": mig[0].uuid}
    assert devices[0]["capacity"]["memory"]["value"] == str(instances[0].memory_total // MiB * MiB)


def test_unhealthy_devices_are_tainted_not_dropped() -> None:
    spec = resource_slice_spec(NODE, H100, Sharing(), health={H100[3].uuid: "Unhealthy"})
    tainted = [d["name"] for d in spec["devices"] if d.get("taints")]
    assert tainted == [name_of(3)]
    assert spec["devices"][3]["taints"] == [{"key": "gpuslice.io/unhealthy", "effect": "NoSchedule"}]


def test_device_names_are_dns_labels_even_for_odd_uuids() -> None:
    assert device_name("GPU-e30e7c75-7e6c-5d0a-8e55-323a19a9b398") == "gpu-e30e7c75-7e6c-5d0a-8e55-323a19a9b398"
    odd = device_name("MIG-GPU-e30e7c75-7e6c-5d0a-8e55-323a19a9b398/1/0")
    assert odd.startswith("dev-") and len(odd) <= 63 and odd == odd.lower()
    assert odd != device_name("MIG-GPU-e30e7c75-7e6c-5d0a-8e55-323a19a9b398/2/0")


# ------------------------------------------------------------------------------------------ claims
def test_a_shared_claim_becomes_a_slice_of_what_it_consumed() -> None:
    claim = allocated_claim("u1", "small", NODE, [{"device": name_of(2), "memory": 4 * GiB, "compute": 30}])
    alloc = read_allocation(claim, NODE)
    assert alloc.uid == "u1" and alloc.pods == ("p0",) and alloc.devices[0].share_id == "share-0"
    grant = claim_grant(alloc, by_name(), Sharing())
    assert grant.grant_id == "dra-u1" and not grant.exclusive
    (s,) = grant.slices
    assert (s.device_uuid, s.memory_limit, s.compute, s.priority, s.mode) == \
        (H100[2].uuid, 4 * GiB, 30, Priority.LOW, ComputeMode.HARD)


def test_a_claim_that_took_the_whole_memory_holds_the_device_whole() -> None:
    memory = H100_MEMORY // MiB * MiB
    claim = allocated_claim("u2", "two", NODE, [{"device": name_of(0), "memory": memory, "compute": 0},
                                                {"device": name_of(1), "memory": memory, "compute": 0}])
    grant = claim_grant(read_allocation(claim, NODE), by_name(), Sharing(memory_scaling=0.9))
    assert grant.exclusive and grant.uuids == (H100[0].uuid, H100[1].uuid)
    # a reserve (scaling < 1) is for packing slices; a device held whole carries its physical memory
    claim = allocated_claim("u3", "w", NODE, [{"device": name_of(0), "memory": int(H100_MEMORY * 0.9) // MiB * MiB}])
    grant = claim_grant(read_allocation(claim, NODE), by_name(), Sharing(memory_scaling=0.9))
    assert grant.exclusive and grant.slices[0].memory_limit == H100_MEMORY


def test_a_device_allocated_twice_to_one_claim_is_one_slice_of_the_sum() -> None:
    claim = allocated_claim("u4", "dup", NODE, [{"device": name_of(0), "memory": 4 * GiB, "compute": 20},
                                                {"device": name_of(0), "memory": 2 * GiB, "compute": 10}])
    (s,) = claim_grant(read_allocation(claim, NODE), by_name(), Sharing()).slices
    assert (s.memory_limit, s.compute) == (6 * GiB, 30)


def test_different_compute_shares_in_one_claim_are_refused() -> None:
    claim = allocated_claim("u5", "mixed", NODE, [{"device": name_of(0), "memory": 4 * GiB, "compute": 20},
                                                  {"device": name_of(1), "memory": 4 * GiB, "compute": 50}])
    with pytest.raises(SpecError) as err:
        claim_grant(read_allocation(claim, NODE), by_name(), Sharing())
    assert "compute" in err.value.field and "one compute share" in err.value.allowed


def test_opaque_parameters_set_priority_mode_and_weight_claim_over_class() -> None:
    config = [
        {"source": "FromClass", "opaque": {"driver": "gpuslice.io", "parameters": {"priority": "low", "mode": "off"}}},
        {"source": "FromClaim", "opaque": {"driver": "other.io", "parameters": {"anything": 1}}},
        {"source": "FromClaim", "requests": ["gpu"],
         "opaque": {"driver": "gpuslice.io", "parameters": {"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters",
                                                            "priority": "high", "mode": "soft", "weight": 3}}},
    ]
    claim = allocated_claim("u6", "p", NODE, [{"device": name_of(0), "memory": 4 * GiB, "compute": 40}], config=config)
    (s,) = claim_grant(read_allocation(claim, NODE), by_name(), Sharing()).slices
    assert (s.priority, s.mode, s.weight) == (Priority.HIGH, ComputeMode.SOFT, 3)
    bad = allocated_claim("u7", "p", NODE, [{"device": name_of(0)}],
                          config=[{"opaque": {"driver": "gpuslice.io", "parameters": {"priorty": "high"}}}])
    with pytest.raises(SpecError) as err:
        read_allocation(bad, NODE)
    assert err.value.field.endswith("parameters.priorty")


def test_opaque_parameters_set_the_colocation_and_refuse_what_the_enforcer_would() -> None:
    def grant_of(params: dict, uid: str = "c1"):
        claim = allocated_claim(uid, "p", NODE, [{"device": name_of(0), "memory": 4 * GiB}],
                                config=[{"opaque": {"driver": "gpuslice.io", "parameters": params}}])
        return claim_grant(read_allocation(claim, NODE), by_name(), Sharing())

    (s,) = grant_of({"colocation": "tidal", "tidalSchedule": "20-8:100"}).slices
    assert (s.colocation.value, s.tidal_schedule) == ("tidal", "20-8:100")
    assert grant_of({}).slices[0].colocation.value == "preemptive"
    for params, field, words in (({"colocation": "polite"}, "colocation", "preemptive, shared or tidal"),
                                 ({"colocation": "tidal", "priority": "high"}, "SliceParameters.colocation",
                                  "low-priority"),
                                 ({"tidalSchedule": "8-20:30"}, "SliceParameters.tidalSchedule", "colocation is tidal")):
        with pytest.raises(SpecError) as err:
            grant_of(params)
        assert err.value.field.endswith(field) and words in err.value.allowed


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c["status"].pop("allocation"), "status.allocation"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="other-node"), "results"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(memory="lots"), "memory"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(memory="1.5"), "memory"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device=7), "device"),
    (lambda c: c["status"]["allocation"]["devices"].update(results={"not": "a list"}), "results"),
])
def test_malformed_or_foreign_allocations_are_refused_naming_the_field(mutate, field) -> None:
    claim = allocated_claim("u8", "bad", NODE, [{"device": name_of(0), "memory": 4 * GiB}])
    mutate(claim)
    with pytest.raises(SpecError) as err:
        read_allocation(claim, NODE)
    assert field in err.value.field


def test_a_device_this_node_does_not_publish_is_refused() -> None:
    claim = allocated_claim("u9", "gone", NODE, [{"device": "gpu-not-here", "memory": 4 * GiB}])
    with pytest.raises(SpecError) as err:
        claim_grant(read_allocation(claim, NODE), by_name(), Sharing())
    assert err.value.value == "gpu-not-here"


# ------------------------------------------------------------------------------------------ checkpoint
def test_checkpoint_round_trips_and_a_damaged_one_is_set_aside(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path)
    api.add_claim(allocated_claim("c1", "one", NODE, [{"device": name_of(0), "memory": 4 * GiB, "compute": 30}]))
    assert driver.prepare([ClaimRef("ml", "c1", "one")])["c1"].error == ""
    again = Checkpoint(driver.cfg.checkpoint_path, NODE)
    assert again.claims() == driver.checkpoint.claims() and again.get("c1").pods == ("p0",)
    assert oct(driver.cfg.checkpoint_path.stat().st_mode & 0o777) == "0o600"
    driver.cfg.checkpoint_path.write_text("{not json")
    fresh = Checkpoint(driver.cfg.checkpoint_path, NODE)
    assert fresh.claims() == {}
    assert [p.name for p in driver.cfg.checkpoint_path.parent.glob("checkpoint.json.bad-*")]
    driver.cfg.checkpoint_path.write_text(json.dumps({"version": 1, "node": "someone-else", "claims": {}}))
    assert Checkpoint(driver.cfg.checkpoint_path, NODE).claims() == {}


# ------------------------------------------------------------------------------------------ prepare
def make_driver(tmp_path: Path, devices=H100, **kw) -> tuple[FakeDraAPI, DraDriver]:
    api = FakeDraAPI()
    files = PluginConfig(node=NODE, host_state_dir=tmp_path / "host-state", local_state_dir=tmp_path / "state",
                         host_library=Path("/opt/gpuslice/libgpuslice.so"), device_nodes="always")
    cfg = DraConfig(node=NODE, files=files, cdi_dir=tmp_path / "cdi", **kw)
    return api, DraDriver(api, cfg, lambda: list(devices))


def test_prepare_writes_the_slice_file_and_a_cdi_spec_that_mounts_it(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path)
    api.add_claim(allocated_claim("c1", "small", NODE, [{"device": name_of(2), "memory": 4 * GiB, "compute": 30}]))
    (dev,) = driver.prepare([ClaimRef("ml", "c1", "small")])["c1"].devices
    assert (dev.requests, dev.pool, dev.device, dev.share_id) == (("gpu",), NODE, name_of(2), "share-0")
    assert dev.cdi == (f"gpuslice.io/claim=c1-{name_of(2)}",)
    state = tmp_path / "state" / "kube"
    sf = read_slice_file(state / "grants" / "dra-c1" / "slice")
    assert (sf.devices, sf.memory_limit, sf.compute, sf.grant) == ((H100[2].uuid,), 4 * GiB, 30, "dra-c1")
    assert sf.region == "/var/run/gpuslice/region/region"
    spec = json.loads((tmp_path / "cdi" / "gpuslice.io-claim_c1.json").read_text())
    assert spec["kind"] == "gpuslice.io/claim" and spec["cdiVersion"] == "0.5.0"
    common = spec["containerEdits"]
    assert f"NVIDIA_VISIBLE_DEVICES={H100[2].uuid}" in common["env"]
    assert "GPUSLICE_SLICE=/etc/gpuslice/slice" in common["env"] and "GPUSLICE_GRANT=dra-c1" in common["env"]
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    host = tmp_path / "host-state" / "kube"
    read_only = {"/etc/gpuslice/slice": str(host / "grants" / "dra-c1" / "slice"),
                 "/usr/local/gpuslice/lib/libgpuslice.so": "/opt/gpuslice/libgpuslice.so",
                 "/etc/ld.so.preload": str(host / "ld.so.preload")}
    for path, source in read_only.items():
        assert mounts[path]["hostPath"] == source and mounts[path]["options"][0] == "ro", path
        assert {"nosuid", "nodev"} <= set(mounts[path]["options"])
    # no host folder writable from the pod (a bind mount's bytes count against no ephemeral-storage limit):
    # the region folder read-only, the region file in it read-write
    assert mounts["/var/run/gpuslice/region"]["options"][0] == "ro"
    assert mounts["/var/run/gpuslice/region/region"]["options"][0] == "rw"
    assert mounts["/var/run/gpuslice/devices"]["options"][0] == "ro"
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    (per_device,) = spec["devices"]
    assert per_device["name"] == f"c1-{name_of(2)}"
    assert [n["path"] for n in per_device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia2"]
    # the device's slice records folder read-only, the claim's own record file in it read-write, the device's
    # roster read-only (root's); no shared .dev file (issue 15)
    records = f"/var/run/gpuslice/devices/{H100[2].uuid}.slices"
    assert [(m["containerPath"], m["hostPath"], m["options"][0]) for m in per_device["containerEdits"]["mounts"]] == \
        [(records, str(tmp_path / "host-state" / "devices" / f"{H100[2].uuid}.slices"), "ro"),
         (f"{records}/dra-c1", str(tmp_path / "host-state" / "devices" / f"{H100[2].uuid}.slices" / "dra-c1"), "rw"),
         (f"/var/run/gpuslice/devices/{H100[2].uuid}.policy",
          str(tmp_path / "host-state" / "devices" / f"{H100[2].uuid}.policy"), "ro")]
    own = tmp_path / "state" / "devices" / f"{H100[2].uuid}.slices" / "dra-c1"
    assert own.is_file() and own.stat().st_size == 0 and own.stat().st_mode & 0o777 == 0o666
    assert not any(m["containerPath"].endswith(".dev") for m in common["mounts"])


def test_prepare_is_idempotent_and_survives_a_restart_without_the_api_server(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path)
    api.add_claim(allocated_claim("c1", "small", NODE, [{"device": name_of(0), "memory": 8 * GiB, "compute": 10}]))
    first = driver.prepare([ClaimRef("ml", "c1", "small")])
    assert driver.prepare([ClaimRef("ml", "c1", "small")]) == first
    asked = [c for c in api.calls if c.startswith("get claim")]
    assert len(asked) == 2  # the second time only for pods it was not prepared for (none): the same answer
    # The agent restarts; the API server now says something else (it must not matter); /var/run/cdi was wiped.
    api.claims.clear()
    (tmp_path / "cdi" / "gpuslice.io-claim_c1.json").unlink()
    _, restarted = make_driver(tmp_path)
    restarted.api = api
    assert restarted.prepare([ClaimRef("ml", "c1", "small")]) == first
    assert (tmp_path / "cdi" / "gpuslice.io-claim_c1.json").exists()


def test_unprepare_removes_everything_and_is_idempotent_even_without_the_checkpoint(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path)
    api.add_claim(allocated_claim("c1", "small", NODE, [{"device": name_of(0), "memory": 8 * GiB}]))
    driver.prepare([ClaimRef("ml", "c1", "small")])
    assert "dra-c1" in read_policies(tmp_path / "state" / "devices", H100[0].uuid)
    assert (tmp_path / "state" / "devices" / f"{H100[0].uuid}.slices" / "dra-c1").is_file()
    state = tmp_path / "state" / "kube"
    (state / "regions" / "dra-c1" / "region").write_bytes(b"x")
    (state / "regions" / "dra-c1" / "link").symlink_to(tmp_path / "cdi")  # a container's mischief
    # and folders nested past rmtree's recursion (it raised out of every unprepare; stop 39)
    make_deep_tree(state / "regions" / "dra-c1", 1500)
    driver.cfg.checkpoint_path.unlink()  # unprepare must not need it
    try:
        _unprepare_removes_everything(tmp_path, state)
    finally:  # pytest's clean-up would recurse as rmtree does
        remove_any_depth(state)


def _unprepare_removes_everything(tmp_path: Path, state: Path) -> None:
    _, fresh = make_driver(tmp_path)
    assert fresh.unprepare([ClaimRef("ml", "c1", "small")]) == {"c1": ""}
    assert not (state / "grants" / "dra-c1").exists() and not (state / "regions" / "dra-c1").exists()
    assert not (tmp_path / "cdi" / "gpuslice.io-claim_c1.json").exists()
    assert (tmp_path / "cdi").is_dir()  # the link was removed, not followed
    assert not (tmp_path / "state" / "devices" / f"{H100[0].uuid}.slices" / "dra-c1").exists()  # its record file
    assert (tmp_path / "state" / "devices" / f"{H100[0].uuid}.slices").is_dir()  # the device's folder stays
    assert "dra-c1" not in read_policies(tmp_path / "state" / "devices", H100[0].uuid)  # off the roster
    assert fresh.unprepare([ClaimRef("ml", "c1", "small")]) == {"c1": ""}
    assert fresh.unprepare([ClaimRef("ml", "never-seen", "x")]) == {"never-seen": ""}
    assert all(n.startswith("regions-dra-c1-") for n in os.listdir(state / "regions" / ".left"))
    assert all(n.startswith("grants-dra-c1-") for n in os.listdir(state / "grants" / ".left"))


def test_each_claim_is_answered_on_its_own(tmp_path: Path) -> None:
    api, driver = make_driver(tmp_path)
    api.add_claim(allocated_claim("good", "good", NODE, [{"device": name_of(0), "memory": 4 * GiB}]))
    api.add_claim(allocated_claim("other-uid", "recreated", NODE, [{"device": name_of(1), "memory": 4 * GiB}]))
    api.add_claim(allocated_claim("far", "far", NODE, [{"device": name_of(1), "memory": 4 * GiB, "pool": "n2"}]))
    done = driver.prepare([ClaimRef("ml", "good", "good"), ClaimRef("ml", "old-uid", "recreated"),
                           ClaimRef("ml", "far", "far"), ClaimRef("ml", "missing", "missing")])
    assert done["good"].error == "" and done["good"].devices
    assert "deleted and created again" in done["old-uid"].error
    assert "pool n1" in done["far"].error
    assert "404" in done["missing"].error or "missing" in done["missing"].error
    assert set(driver.checkpoint.claims()) == {"good"}
    assert not (tmp_path / "cdi" / "gpuslice.io-claim_far.json").exists()


def test_bad_cdi_names_are_refused() -> None:
    with pytest.raises(SpecError):
        cdi.spec_path(Path("/x"), "../escape")


# ------------------------------------------------------------------------------------------ publisher
def test_publisher_creates_then_writes_only_changes_with_a_new_generation() -> None:
    api = FakeDraAPI()
    api.add_node(NODE)
    api.slices["old"] = {"metadata": {"name": "old", "resourceVersion": "0"},
                         "spec": {"nodeName": NODE, "driver": "gpuslice.io", "devices": []}}
    pub = SlicePublisher(api, NODE, H100, Sharing())
    pub.publish()
    name = slice_name(NODE)
    assert set(api.slices) == {name}  # the stray slice of this driver on this node is gone
    made = api.slices[name]
    assert made["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": f"uid-{NODE}"}
    assert made["spec"]["pool"]["generation"] == 1
    pub.publish()
    assert pub.writes == 1  # nothing changed: nothing written
    pub.health_changed({H100[1].uuid: "Unhealthy"})
    pub.publish()
    spec = api.slices[name]["spec"]
    assert pub.writes == 2 and spec["pool"]["generation"] == 2
    assert [d["name"] for d in spec["devices"] if d.get("taints")] == [name_of(1)]
    pub.devices_changed(H100[:4], {})
    pub.publish()
    assert len(api.slices[name]["spec"]["devices"]) == 4 and api.slices[name]["spec"]["pool"]["generation"] == 3


def test_publisher_retries_when_the_slice_changed_under_it() -> None:
    api = FakeDraAPI()
    api.add_node(NODE)
    pub = SlicePublisher(api, NODE, H100, Sharing())
    pub.publish()
    real = api.replace_resource_slice
    bumped = []

    def racing(name, body):
        if not bumped:  # someone else writes first: our resourceVersion is stale
            bumped.append(1)
            api.slices[name]["metadata"]["resourceVersion"] = "999"
        return real(name, body)

    api.replace_resource_slice = racing
    pub.health_changed({H100[0].uuid: "Unhealthy"})
    pub.publish()
    assert api.slices[slice_name(NODE)]["spec"]["devices"][0].get("taints") and pub.writes == 2
