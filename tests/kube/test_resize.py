"""Live resize in Kubernetes (device-plugin path): the ``gpuslice.io/resize`` pod annotation goes node agent
(checked against the container's usage) -> extender (the node's ledger, under its resourceVersion) -> node agent
(slice file rewritten one generation up), answered in ``gpuslice.io/resize-status``; refusals name the field;
a resize racing another resize and a bind on the same device never over-commits it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from devstatekit import write_record
from fakeapi import FakeAPI
from kubefixtures import devices, node, pod
from regionfile import DeviceRecord, ProcRecord, write_region

from gpuslice.enforcer.policy import read_policies
from gpuslice.enforcer.slicefile import read_slice_file
from gpuslice.kube import formats
from gpuslice.kube.allocator import Allocator, PluginConfig, device_id
from gpuslice.kube.extender import Extender
from gpuslice.kube.extender.resize import LedgerResizer
from gpuslice.kube.resize import NodeResizer, decode_resize
from gpuslice.spec import MiB, SpecError

LIMITS = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"}  # MiB, on one 81559 MiB H100


def cluster(*names: str, gpumem: str = "30000") -> tuple[FakeAPI, Extender]:
    api = FakeAPI()
    api.add_node("n0", node("n0", 1)["metadata"]["annotations"])
    ext = Extender(api, allocation_timeout=0)
    for name in names:
        bind(api, ext, name, gpumem)
    return api, ext


def bind(api: FakeAPI, ext: Extender, name: str, gpumem: str = "30000") -> str:
    m = api.add_pod(pod(name, {**LIMITS, "nvidia.com/gpumem": gpumem}))["metadata"]
    return ext.bind({"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "n0"})["Error"]


@pytest.fixture
def alloc(tmp_path):
    def make(api):
        cfg = PluginConfig(node="n0", host_state_dir=tmp_path / "st", device_nodes="none", mps_private_shm=False)
        return Allocator(api, cfg, lambda: devices("n0", 1))
    return make


def grant_of(api: FakeAPI, name: str) -> formats.ContainerGrant:
    p = api.get_pod("default", name)
    return formats.decode_pod_grant(p["metadata"]["annotations"][formats.POD_GRANT]).containers[0]


def ledger_limit(api: FakeAPI, name: str) -> int:
    anns = api.get_node("n0")["metadata"]["annotations"]
    uid = api.get_pod("default", name)["metadata"]["uid"]
    return formats.decode_ledger(anns[formats.NODE_LEDGER], "n0").entries[uid].containers[0].slices[0].memory_limit


def ask(api: FakeAPI, name: str, value: dict | str) -> None:
    api.patch_pod_annotations("default", name, {formats.POD_RESIZE: value if isinstance(value, str) else json.dumps(value)})


def status(api: FakeAPI, name: str) -> dict:
    return json.loads(api.get_pod("default", name)["metadata"]["annotations"][formats.POD_RESIZE_STATUS])


def test_resize_goes_agent_extender_agent_and_the_slice_file_follows(alloc):
    api, _ = cluster("a")
    allocator = alloc(api)
    g = grant_of(api, "a")
    _, resp = allocator.allocate([device_id(g.uuids[0], 0)])
    slice_file = Path(dict((c, h) for c, h, _ in resp["mounts"])["/etc/gpuslice/slice"])
    assert read_slice_file(slice_file).generation == 0
    agent, ext = NodeResizer(api, "n0", allocator), LedgerResizer(api)
    ask(api, "a", {"memory": "40000Mi", "compute": 30})
    assert ext.handle(api.get_pod("default", "a")) is None  # not checked yet: not the extender's turn
    assert agent.handle(api.get_pod("default", "a")) == "checked"
    assert agent.handle(api.get_pod("default", "a")) is None  # waits for the extender
    assert ext.handle(api.get_pod("default", "a")) == "granted"
    assert ledger_limit(api, "a") == 40000 * MiB and grant_of(api, "a").slices[0].compute == 30
    assert agent.handle(api.get_pod("default", "a")) == "done"
    cfg = read_slice_file(slice_file)
    assert (cfg.memory_limit, cfg.compute, cfg.generation) == (40000 * MiB, 30, 1)
    assert status(api, "a")["state"] == "done" and status(api, "a")["generation"] == 1
    assert agent.handle(api.get_pod("default", "a")) is None and ext.handle(api.get_pod("default", "a")) is None
    ask(api, "a", {"memory": "20000Mi"})  # a new request: a new round, one generation up
    for side, want in ((agent, "checked"), (ext, "granted"), (agent, "done")):
        assert side.handle(api.get_pod("default", "a")) == want
    assert read_slice_file(slice_file).generation == 2 and read_slice_file(slice_file).memory_limit == 20000 * MiB


def test_a_resize_that_does_not_fit_is_refused_by_the_extender(alloc):
    api, _ = cluster("a", "b")
    agent, ext = NodeResizer(api, "n0", alloc(api)), LedgerResizer(api)
    ask(api, "a", {"memory": "60000Mi"})
    assert agent.handle(api.get_pod("default", "a")) == "checked"
    assert ext.handle(api.get_pod("default", "a")) == "refused"
    assert "does not fit" in status(api, "a")["message"] and ledger_limit(api, "a") == 30000 * MiB
    assert agent.handle(api.get_pod("default", "a")) is None  # refused is final for this request


def test_lower_below_what_the_container_holds_is_refused_by_the_agent(alloc):
    api, _ = cluster("a")
    allocator = alloc(api)
    g = grant_of(api, "a")
    allocator.allocate([device_id(g.uuids[0], 0)])
    region = allocator.paths(g.grant_id, local=True)["region"] / "region"
    # pid 4242 is the container's (its own pid namespace): counted whatever the node's pid 4242 is
    write_region(region, [DeviceRecord(g.uuids[0], 30000 * MiB, used=25000 * MiB)],
                 [ProcRecord(pid=4242, start_time=1, used={0: 25000 * MiB})])
    ask(api, "a", {"memory": "20000Mi"})
    assert NodeResizer(api, "n0", allocator).handle(api.get_pod("default", "a")) == "refused"
    assert "is below the 24.4 GiB the slice's processes hold now" in status(api, "a")["message"]
    assert ledger_limit(api, "a") == 30000 * MiB


@pytest.mark.parametrize("value,field", [
    ('{"memory": "lots"}', "gpuslice.io/resize.memory"),
    ('{"memory": "8Gi", "evict": true}', "gpuslice.io/resize.evict"),
    ('{"container": "side", "memory": "8Gi"}', "gpuslice.io/resize.container"),
    ('{}', "gpuslice.io/resize.resize"),
    ('not json', "gpuslice.io/resize"),
])
def test_bad_requests_are_refused_naming_the_field(alloc, value, field):
    api, _ = cluster("a")
    ask(api, "a", value)
    assert NodeResizer(api, "n0", alloc(api)).handle(api.get_pod("default", "a")) == "refused"
    assert field in status(api, "a")["message"], status(api, "a")
    if field != "gpuslice.io/resize.container":
        with pytest.raises(SpecError) as err:
            decode_resize(value)
        assert err.value.field == field


def test_resizes_racing_a_bind_never_over_commit(alloc):
    """Two 30000 MiB slices on one 81559 MiB card: growing either to 45000 MiB, or binding a 16000 MiB pod,
    fits alone, no two together. Decided at once from three threads: exactly one wins, every round."""
    for _ in range(5):
        api, ext = cluster("a", "b")
        agent, side = NodeResizer(api, "n0", alloc(api)), LedgerResizer(api)
        for name in ("a", "b"):
            ask(api, name, {"memory": "45000Mi"})
            assert agent.handle(api.get_pod("default", name)) == "checked"
        go, results = threading.Barrier(3), {}

        def resize(name):
            go.wait()
            results[name] = side.handle(api.get_pod("default", name))

        def late_bind():
            go.wait()
            results["c"] = "granted" if bind(api, ext, "c", "16000") == "" else "refused"

        threads = [threading.Thread(target=resize, args=(n,)) for n in ("a", "b")] + [threading.Thread(target=late_bind)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(results.values()) == ["granted", "refused", "refused"], results
        anns = api.get_node("n0")["metadata"]["annotations"]
        shared, _ = formats.decode_ledger(anns[formats.NODE_LEDGER], "n0").slices()
        assert sum(s.memory_limit for s in shared) <= devices("n0", 1)[0].memory_total


def test_the_loops_list_and_follow_pods(alloc):
    """Each side's loop hands every listed pod (and every changed one) to its step: a full round by lists."""
    api, _ = cluster("a")
    agent, ext = NodeResizer(api, "n0", alloc(api)), LedgerResizer(api)
    ask(api, "a", {"memory": "31000Mi"})
    agent.refresh()
    assert status(api, "a")["state"] == "checked"
    ext._event("MODIFIED", api.get_pod("default", "a"))
    assert status(api, "a")["state"] == "granted"
    ext.refresh()  # nothing more for the extender
    agent._event("DELETED", api.get_pod("default", "a"))  # a deleted pod is not acted on
    assert status(api, "a")["state"] == "granted"
    agent.refresh()
    assert status(api, "a")["state"] == "done" and ledger_limit(api, "a") == 31000 * MiB


def test_a_new_share_reaches_the_devices_roster_not_the_slices_record_file(alloc, tmp_path):
    """The node agent's last step writes the new share into the device's roster on the host, which the
    container's running pacers read (mounted read-only; local mode does the same: tests/local/test_resize.py);
    the slice's record file, which its container writes, is not root's to write (same bytes, same inode)."""
    api, _ = cluster("a")
    allocator = alloc(api)
    g = grant_of(api, "a")
    allocator.allocate([device_id(g.uuids[0], 0)])
    folder = allocator.paths(g.grant_id, local=True)["devices"]
    [name] = Allocator.device_stems(g)
    assert read_policies(folder, name)[g.grant_id].compute == g.slices[0].compute
    dev = write_record(folder, name, g.grant_id, pids=(1,))
    before = (dev.read_bytes(), dev.stat().st_ino)
    agent, ext = NodeResizer(api, "n0", allocator), LedgerResizer(api)
    ask(api, "a", {"compute": 40})
    for side, want in ((agent, "checked"), (ext, "granted"), (agent, "done")):
        assert side.handle(api.get_pod("default", "a")) == want
    assert read_policies(folder, name)[g.grant_id].compute == 40
    assert (dev.read_bytes(), dev.stat().st_ino) == before
