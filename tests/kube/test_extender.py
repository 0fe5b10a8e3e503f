"""The scheduler extender over real HTTP (httpx -> uvicorn on loopback) with kube-scheduler's JSON.

Binding runs against tests/kube/fakeapi.py (resourceVersion / UID preconditions like the API server);
the real API server and kube-scheduler are driven by tests/e2e/test_kube*.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

httpx = pytest.importorskip("httpx")  # pinned in pyproject; absent only on bare GPU images
from fakeapi import FakeAPI
from kubefixtures import H100, node, pod

from gpuslice.kube import formats, nodestate, podrequest, resources
from gpuslice.kube.extender import Extender, NodeCache, extender_scores, sum_grants
from gpuslice.kube.server import make_app, start_in_thread
from gpuslice.placement import PlacementPolicy
from gpuslice.spec import GiB, Grant, MiB, Slice, SpecError


def serve(extender):
    running = start_in_thread(make_app(extender, webhook_enabled=False))
    return running, httpx.Client(base_url=running.url, timeout=30)


@pytest.fixture
def plain():
    running, client = serve(Extender(None))
    yield client
    client.close()
    running.stop()


def args_with_nodes(p, nodes):
    return {"Pod": p, "Nodes": {"metadata": {"resourceVersion": "5"}, "items": nodes}, "NodeNames": None}


def test_filter_with_full_nodes(plain):
    bare = node("bare")
    del bare["metadata"]["annotations"][formats.NODE_DEVICES]
    small = node("small", memory=16 * GiB)
    big = node("big")
    p = pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"})
    r = plain.post("/filter", json=args_with_nodes(p, [bare, small, big]))
    assert r.status_code == 200
    out = r.json()
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["big"]
    assert set(out["FailedNodes"]) == {"bare", "small"} and out["Error"] == ""
    assert "gpuslice.io/devices" in out["FailedNodes"]["bare"]
    assert "needs 29.3 GiB" in out["FailedNodes"]["small"]  # 30000 MiB, the reason from placement


def test_filter_passes_non_gpu_pods_and_reports_bad_requests(plain):
    nodes = [node("a"), node("b")]
    out = plain.post("/filter", json=args_with_nodes(pod("cpu", {"cpu": "2"}), nodes)).json()
    assert len(out["Nodes"]["items"]) == 2 and out["FailedNodes"] == {}
    bad = pod("bad", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "400"})
    out = plain.post("/filter", json=args_with_nodes(bad, nodes)).json()
    assert "nvidia.com/gpucores" in out["Error"] and out["Nodes"]["items"] == []


def test_prioritize_follows_the_pod_policy(plain):
    used = formats.Ledger({}).with_entry(formats.PodGrant("busy", "u0", "ns", "x", (formats.ContainerGrant(
        "main", Grant("k-u0-main", (Slice(formats.decode_node_devices(node("busy")["metadata"]["annotations"][
            formats.NODE_DEVICES]).devices[0].uuid, 40 * GiB, 50),))),)))
    nodes = [node("idle"), node("busy", ledger=formats.encode_ledger(used))]
    base = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}
    binpack = plain.post("/prioritize", json=args_with_nodes(pod("p", base), nodes)).json()
    spread = plain.post("/prioritize", json=args_with_nodes(
        pod("p", base, annotations={"hami.io/node-scheduler-policy": "spread"}), nodes)).json()
    assert [h["Host"] for h in binpack] == ["idle", "busy"]
    assert all(0 <= h["Score"] <= 10 and isinstance(h["Score"], int) for h in binpack + spread)
    score = {h["Host"]: h["Score"] for h in binpack}
    assert score["busy"] > score["idle"]
    score = {h["Host"]: h["Score"] for h in spread}
    assert score["idle"] > score["busy"]


@pytest.mark.parametrize("path, body, needle", [
    ("/filter", b"nope", "not JSON"),
    ("/filter", json.dumps({"Pod": "x", "NodeNames": []}).encode(), "Pod must be a Pod object"),
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {}}}).encode(), "Nodes"),
    ("/prioritize", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [{}]}}).encode(),
     "Nodes.items[0].metadata must be an object"),
    ("/prioritize", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": 7}}).encode(), "NodeList"),
    # Node annotations of the wrong shape: the extender reads them, so 400 naming the field, never 500
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [
        {"metadata": {"name": "n1", "annotations": ["gpuslice.io/devices"]}}]}}).encode(),
     "Nodes.items[0].metadata.annotations of node n1 must be an object of strings (got list)"),
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [
        {"metadata": {"name": "n1", "annotations": "gpuslice.io/devices"}}]}}).encode(), "(got str)"),
    ("/prioritize", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [
        {"metadata": {"name": "n1"}}, {"metadata": {"name": "n2", "annotations": {"gpuslice.io/devices": {"version": 1}}}}]}}
    ).encode(), "Nodes.items[1].metadata.annotations[gpuslice.io/devices] of node n2 must be a string"),
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [
        {"metadata": {"name": ""}}]}}).encode(), "metadata.name must be a non-empty string"),
    ("/prioritize", json.dumps({"pod": {"metadata": {}, "spec": {}}, "nodenames": [1]}).encode(), "list of node names"),
    ("/bind", json.dumps({"PodName": "p", "PodNamespace": "default", "Node": "n"}).encode(), "PodUID"),
    ("/bind", b"[]", "ExtenderBindingArgs"),
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {"containers": "x"}}, "NodeNames": []}).encode(),
     "containers must be a list"),
    ("/filter", json.dumps({"Pod": {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {
        "limits": ["nvidia.com/gpu"]}}]}}, "NodeNames": ["n"]}).encode(), "limits/requests objects"),
])
def test_malformed_payloads_get_400(plain, path, body, needle):
    r = plain.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and needle in r.json()["error"], r.text
    assert plain.get("/healthz").status_code == 200


# ------------------------------------------------------------------------------ bind
def cluster(n_nodes=1, gpus=2):
    api = FakeAPI()
    for i in range(n_nodes):
        api.add_node(f"n{i}", node(f"n{i}", gpus)["metadata"]["annotations"])
    return api


def bind_body(p, node_name):
    m = p["metadata"]
    return {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node_name}


def test_bind_writes_ledger_grant_and_binding():
    api = cluster()
    p = api.add_pod(pod("train", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}))
    running, client = serve(Extender(api))
    try:
        r = client.post("/bind", json=bind_body(p, "n0"))
        assert r.status_code == 200 and r.json() == {"Error": ""}
    finally:
        client.close()
        running.stop()
    stored = api.get_pod("default", "train")
    assert stored["spec"]["nodeName"] == "n0"
    grant = formats.decode_pod_grant(stored["metadata"]["annotations"][formats.POD_GRANT])
    (c,) = grant.containers
    assert c.container == "main" and c.slices[0].memory_limit == 10000 * MiB and c.slices[0].compute == 30
    ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0")
    assert ledger.entries[p["metadata"]["uid"]] == grant
    # binding again (a retry after a lost answer): same node, same pod -> nothing changes
    api.patch_pod_annotations("default", "train", {formats.POD_ALLOCATED: formats.encode_allocated(["main"])})
    calls = len(api.calls)
    assert Extender(api).bind(bind_body(p, "n0"))["Error"] == ""
    assert api.calls[calls:] == []  # no write at all: the allocated mark and the binding stay
    assert "already bound to n0" in Extender(api).bind(bind_body(p, "n1"))["Error"]


def test_concurrent_binds_never_overcommit_across_replicas():
    """60 pods × 30 GiB race for one node with 2 × 80 GiB GPUs through two extender replicas. The
    allocation lock is off here (it would admit one pod at a time): this is the ledger's CAS alone."""
    api = cluster(1, 2)
    pods = [api.add_pod(pod(f"p{i}", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(30 * 1024)})) for i in range(60)]
    replicas = [serve(Extender(api, allocation_timeout=0)), serve(Extender(api, allocation_timeout=0))]
    try:
        def bind(i):
            return replicas[i % 2][1].post("/bind", json=bind_body(pods[i], "n0")).json()
        with cf.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(bind, range(60)))
    finally:
        for running, client in replicas:
            client.close()
            running.stop()
    ok = [r for r in results if r["Error"] == ""]
    assert len(ok) == 4  # floor(81559 MiB / 30 GiB) = 2 per GPU
    assert all("cannot take" in r["Error"] for r in results if r["Error"])
    totals = sum_grants(api.list_nodes()[0])
    assert len(totals) == 2 and all(t["memory"] <= H100 and t["slices"] == 2 for t in totals.values())
    bound = [p for p in api.list_pods() if p["spec"].get("nodeName") == "n0"]
    assert len(bound) == 4 and all(formats.POD_GRANT in p["metadata"]["annotations"] for p in bound)


def test_restarted_extender_rebuilds_state_from_the_api_server():
    api = cluster(2, 1)
    first = Extender(api)
    a = api.add_pod(pod("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "60"}))
    assert first.bind(bind_body(a, "n0"))["Error"] == ""
    api.patch_pod_annotations("default", "a", {formats.POD_ALLOCATED: formats.encode_allocated(["main"])})
    # a brand-new extender (restart) with a node cache listing from the API server
    cache = NodeCache(api)
    cache.refresh()
    second = Extender(api, cache=cache)
    b = api.add_pod(pod("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "60"}))
    out = second.filter({"Pod": b, "NodeNames": ["n0", "n1"]})
    assert out["NodeNames"] == ["n1"] and "n0" in out["FailedNodes"]
    # even when the scheduler insists on n0 (stale view), bind refuses: the ledger is the truth
    assert "cannot take" in second.bind(bind_body(b, "n0"))["Error"]
    assert second.bind(bind_body(b, "n1"))["Error"] == ""


def test_failed_binding_takes_the_grant_back():
    api = cluster()
    p = api.add_pod(pod("doomed", {"nvidia.com/gpu": "1"}))
    api.fail_bind.add("doomed")
    out = Extender(api).bind(bind_body(p, "n0"))
    assert "taken back" in out["Error"]
    ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"].get(formats.NODE_LEDGER), "n0")
    assert ledger.entries == {}


def test_recreated_pod_is_refused():
    api = cluster()
    p = api.add_pod(pod("x", {"nvidia.com/gpu": "1"}))
    body = bind_body(p, "n0") | {"PodUID": "some-older-uid"}
    assert "recreated" in Extender(api).bind(body)["Error"]


def test_multi_container_pod_gets_one_grant_per_container():
    api = cluster(2, 2)
    cs = [{"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}}}
          for i in range(2)]
    p = api.add_pod(pod("two", containers=cs))
    ext = Extender(api)
    out = ext.filter({"Pod": p, "NodeNames": ["n0"]})
    assert out["NodeNames"] == ["n0"]
    assert ext.bind(bind_body(p, "n0"))["Error"] == ""
    g = formats.decode_pod_grant(api.get_pod("default", "two")["metadata"]["annotations"][formats.POD_GRANT])
    assert [c.container for c in g.containers] == ["c0", "c1"]
    assert g.containers[0].uuids != g.containers[1].uuids  # 50000 MiB twice does not fit one 80 GB GPU
    three = api.add_pod(pod("three", containers=cs + [dict(cs[0], name="c2")]))
    out = ext.filter({"Pod": three, "NodeNames": ["n0", "n1"]})  # n0 is full; n1 holds two of three
    assert out["NodeNames"] == [] and "container c2" in out["FailedNodes"]["n1"]


def test_garbage_collection_frees_deleted_and_finished_pods():
    api = cluster(1, 1)
    now = [1000.0]
    ext = Extender(api, gc_grace=60, clock=lambda: now[0], allocation_timeout=0)  # three pods on one node at once
    a = api.add_pod(pod("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}))
    b = api.add_pod(pod("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}))
    c = api.add_pod(pod("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}))
    for x in (a, b, c):
        assert ext.bind(bind_body(x, "n0"))["Error"] == ""
    assert ext.collect_garbage() == 0  # everything alive
    api.delete_pod("default", "a")
    api.pods[("default", "b")]["status"]["phase"] = "Succeeded"
    assert ext.collect_garbage() == 1  # b finished; a's deletion is too recent to trust a list
    now[0] += 120
    assert ext.collect_garbage() == 1
    ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0")
    assert list(ledger.entries) == [c["metadata"]["uid"]]


def test_extender_priorities_give_10_to_placements_choice_alone():
    got = {h["Host"]: h["Score"] for h in extender_scores({"a": 99.5, "b": 99.2, "c": 40.0, "d": 0.0}, "abcde")}
    assert got == {"a": 10, "b": 9, "c": 4, "d": 0, "e": 0}  # e: not scored (did not fit)
    tied = {h["Host"]: h["Score"] for h in extender_scores({"a": 70.0, "b": 70.0}, "ab")}
    assert tied == {"a": 10, "b": 10}  # an exact tie stays kube-scheduler's to break
    assert extender_scores({}, ["a"]) == [{"Host": "a", "Score": 0}]


def test_fgd_prioritize_names_the_node_placement_picks_among_identical_idle_nodes():
    """fgd's ties follow a fixed node order (it keeps other nodes whole for large tasks): the extender
    must hand kube-scheduler that one node, not a draw among equals."""
    from gpuslice.placement import place

    ext = Extender(None, resources.KubeConfig(policy=PlacementPolicy.parse("fgd")))
    nodes = [node(f"n{i}") for i in range(6)]
    p = pod("p", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"})
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(args_with_nodes(p, nodes))}
    top = [n for n, s in scores.items() if s == 10]
    states = [nodestate.node_state(n["metadata"]["name"], formats.decode_node_devices(
        n["metadata"]["annotations"][formats.NODE_DEVICES]), formats.Ledger({})) for n in nodes]
    req = podrequest.pod_request(p, resources.KubeConfig()).containers[0].request
    assert top == [place(req, states, PlacementPolicy.parse("fgd")).node]


def test_policy_can_be_set_for_the_cluster():
    ext = Extender(None, resources.KubeConfig(policy=PlacementPolicy.parse("spread")))
    used = formats.Ledger({}).with_entry(formats.PodGrant("busy", "u0", "ns", "x", (formats.ContainerGrant(
        "main", Grant("k-u0-main", (Slice(formats.decode_node_devices(node("busy")["metadata"]["annotations"][
            formats.NODE_DEVICES]).devices[0].uuid, 40 * GiB, 50),))),)))
    nodes = [node("busy", ledger=formats.encode_ledger(used)), node("idle")]
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(args_with_nodes(pod("p", {"nvidia.com/gpu": "1",
                                                                                      "nvidia.com/gpumem": "1000"}), nodes))}
    assert scores["idle"] > scores["busy"]


def test_fleet_index_follows_ledger_changes_like_a_fresh_build():
    """The shared fleet, updated row by row, answers exactly as a per-request build over the same nodes."""
    import random

    from gpuslice.kube.extender import ViewCache

    rng = random.Random(3)
    names = [f"n{i}" for i in range(12)]
    uuids = {n: [d.uuid for d in formats.decode_node_devices(node(n, 2)["metadata"]["annotations"][
        formats.NODE_DEVICES]).devices] for n in names}
    ledgers = {n: formats.Ledger({}) for n in names}
    health = {n: {} for n in names}
    rv = [1]

    def current(n):
        rv[0] += 1
        doc = node(n, 2, rv=str(rv[0]), ledger=formats.encode_ledger(ledgers[n]))
        from kubefixtures import devices as devs
        doc["metadata"]["annotations"][formats.NODE_DEVICES] = formats.encode_node_devices(devs(n, 2), health=health[n])
        return doc

    views = ViewCache()
    cache = type("C", (), {"views": views})()
    fast, slow = Extender(None, cache=cache), Extender(None, cache=cache, use_index=False)
    for n in names:
        views.view(current(n))
    shapes = [{"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(rng.choice([4000, 20000, 40000]))},
              {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "60"}, {"nvidia.com/gpu": "2"}]
    for step in range(60):
        n = rng.choice(names)
        if step % 17 == 16:  # a device turns unhealthy / healthy again: rebuild path
            u = uuids[n][1]
            health[n] = {} if health[n] else {u: formats.UNHEALTHY}
        elif ledgers[n].entries and rng.random() < 0.4:
            ledgers[n] = ledgers[n].without([rng.choice(list(ledgers[n].entries))])
        else:
            mem = rng.choice([4000, 10000, 30000]) * MiB
            u = rng.choice(uuids[n])
            trial = ledgers[n].with_entry(formats.PodGrant(n, f"u{step}", "ns", f"p{step}", (formats.ContainerGrant(
                "main", Grant(f"k-u{step}-main", (Slice(u, mem, rng.choice([0, 10, 30])),))),)))
            try:
                nodestate.node_state(n, formats.decode_node_devices(current(n)["metadata"]["annotations"][
                    formats.NODE_DEVICES]), trial)
                ledgers[n] = trial
            except SpecError:
                pass  # would over-commit: the extender never writes that
        views.view(current(n))
        p = pod("p", rng.choice(shapes), annotations={"gpuslice.io/policy": rng.choice(["binpack", "spread"])})
        args = {"Pod": p, "NodeNames": names}
        a, b = fast.filter(args), slow.filter(args)
        assert a["NodeNames"] == b["NodeNames"] and a["FailedNodes"] == b["FailedNodes"]
        assert fast.prioritize(args) == slow.prioritize(args)
    assert fast.index.rebuilds <= 1 + 60 // 17 + 1  # ledger changes never rebuild


def test_node_cache_follows_the_api_server_without_a_watch():
    api = cluster(1, 1)
    cache = NodeCache(api, poll_interval=0.02)
    cache.start()
    try:
        assert cache.synced.wait(5)
        api.add_node("late", node("late", 1)["metadata"]["annotations"])
        ext = Extender(api, cache=cache)
        p = pod("p", {"nvidia.com/gpu": "1"})
        import time as _t
        deadline = _t.monotonic() + 5
        while cache.views.get("late") is None and _t.monotonic() < deadline:
            _t.sleep(0.01)
        assert ext.filter({"Pod": p, "NodeNames": ["n0", "late"]})["NodeNames"] == ["n0", "late"]
        del api.nodes["late"]
        deadline = _t.monotonic() + 5
        while cache.views.get("late") is not None and _t.monotonic() < deadline:
            _t.sleep(0.01)
        out = ext.filter({"Pod": p, "NodeNames": ["n0", "late"]})
        assert out["NodeNames"] == ["n0"] and "late" in out["FailedNodes"]
    finally:
        cache.stop()


def test_nodes_whose_agent_went_quiet_are_skipped_when_ageing_is_on():
    fresh, quiet = node("fresh"), node("quiet")
    now = formats.decode_node_devices(fresh["metadata"]["annotations"][formats.NODE_DEVICES]).updated
    quiet["metadata"]["annotations"][formats.NODE_DEVICES] = formats.encode_node_devices(
        formats.decode_node_devices(quiet["metadata"]["annotations"][formats.NODE_DEVICES]).devices, now=now - 600)
    p = pod("p", {"nvidia.com/gpu": "1"})
    ext = Extender(None, stale_after=300, clock=lambda: now + 1)
    out = ext.filter(args_with_nodes(p, [fresh, quiet]))
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["fresh"]
    assert "has not published" in out["FailedNodes"]["quiet"] and "601 s" in out["FailedNodes"]["quiet"]
    assert len(Extender(None).filter(args_with_nodes(p, [fresh, quiet]))["Nodes"]["items"]) == 2  # off by default


def test_use_gputype_matches_a_substring_of_the_card_type_through_filter_prioritize_and_bind():
    """HAMi's use-gputype: "H100" must select nodes whose discovered model is H100-80GB-HBM3 (the NVML
    name is "NVIDIA H100 80GB HBM3"), case-insensitively; nouse-gputype likewise."""
    api = FakeAPI()
    api.add_node("h", node("h", 2)["metadata"]["annotations"])                       # H100-80GB-HBM3
    api.add_node("a", node("a", 2, model="A100-SXM4-80GB")["metadata"]["annotations"])
    cache = NodeCache(api)
    cache.refresh()
    ext = Extender(api, cache=cache)
    running, client = serve(ext)
    try:
        p = api.add_pod(pod("typed", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
                            annotations={"nvidia.com/use-gputype": "h100"}))
        out = client.post("/filter", json={"Pod": p, "NodeNames": ["a", "h"]}).json()
        assert out["NodeNames"] == ["h"] and "a" in out["FailedNodes"], out
        scores = {s["Host"]: s["Score"] for s in client.post("/prioritize", json={"Pod": p, "NodeNames": ["a", "h"]}).json()}
        assert scores["a"] == 0
        assert client.post("/bind", json={"PodName": "typed", "PodNamespace": "default",
                                          "PodUID": p["metadata"]["uid"], "Node": "h"}).json()["Error"] == ""
        # bind re-checks on the node itself: the same pod cannot land on the A100 node
        q = api.add_pod(pod("typed2", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": "H100"}))
        err = client.post("/bind", json={"PodName": "typed2", "PodNamespace": "default",
                                         "PodUID": q["metadata"]["uid"], "Node": "a"}).json()["Error"]
        assert "H100" in err
        avoid = api.add_pod(pod("not-h", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "80GB HBM3"}))
        out = client.post("/filter", json={"Pod": avoid, "NodeNames": ["a", "h"]}).json()
        assert out["NodeNames"] == ["a"], out
    finally:
        client.close()
        running.stop()


# ------------------------------------------------------------------------------ the allocation lock
def holders(api, name="n0"):
    return formats.decode_allocating(api.get_node(name)["metadata"]["annotations"].get(formats.NODE_ALLOCATING))


def allocated(api, p, containers=("main",)):
    api.patch_pod_annotations(p["metadata"]["namespace"], p["metadata"]["name"],
                              {formats.POD_ALLOCATED: formats.encode_allocated(containers)})


def test_allocation_lock_admits_one_pod_per_device_count_until_it_is_allocated():
    api = cluster(2, 2)
    now = [1000.0]
    ext = Extender(api, clock=lambda: now[0], allocation_timeout=300)
    small = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    a, b = api.add_pod(pod("a", small)), api.add_pod(pod("b", small))
    two = api.add_pod(pod("two", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}))
    assert ext.bind(bind_body(a, "n0"))["Error"] == ""
    assert holders(api) == {a["metadata"]["uid"]}
    # filter leaves n0 out for another 1-device pod (with the reason), not for a 2-device one
    out = ext.filter({"Pod": b, "NodeNames": ["n0", "n1"]})
    assert out["NodeNames"] == ["n1"] and "allocate pod default/a" in out["FailedNodes"]["n0"]
    assert ext.filter({"Pod": two, "NodeNames": ["n0", "n1"]})["NodeNames"] == ["n0", "n1"]
    # bind re-checks on the fresh node (a scheduler with a stale view): refused, nothing written
    err = ext.bind(bind_body(b, "n0"))["Error"]
    assert "waiting for the kubelet to allocate pod default/a" in err
    assert api.get_pod("default", "b")["spec"].get("nodeName") is None
    assert set(formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0").entries) \
        == {a["metadata"]["uid"]}
    assert ext.bind(bind_body(two, "n0"))["Error"] == ""  # Allocate can tell 2 IDs from 1: no wait
    assert holders(api) == {a["metadata"]["uid"], two["metadata"]["uid"]}
    # the device plugin allocated a but its release was lost: bind reads a, sees it allocated, goes on
    allocated(api, a)
    assert ext.bind(bind_body(b, "n0"))["Error"] == ""
    assert holders(api) == {two["metadata"]["uid"], b["metadata"]["uid"]}
    # a holder the kubelet never admits stops counting after the timeout
    c = api.add_pod(pod("c", small))
    assert "allocate pod default/b" in ext.bind(bind_body(c, "n0"))["Error"]
    now[0] += 301
    assert ext.filter({"Pod": c, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]
    assert ext.bind(bind_body(c, "n0"))["Error"] == ""
    assert holders(api) == {c["metadata"]["uid"]}  # timed-out holders are dropped on the way


def test_allocation_lock_is_taken_atomically_across_replicas():
    """30 one-device pods race for one empty node through two replicas: one wins, the rest wait."""
    api = cluster(1, 2)
    pods = [api.add_pod(pod(f"p{i}", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"})) for i in range(30)]
    replicas = [Extender(api), Extender(api)]
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: replicas[i % 2].bind(bind_body(pods[i], "n0")), range(30)))
    won = [i for i, r in enumerate(results) if r["Error"] == ""]
    assert len(won) == 1, results
    assert all("waiting for the kubelet" in r["Error"] for r in results if r["Error"])
    assert holders(api) == {pods[won[0]]["metadata"]["uid"]}


def test_taking_back_a_failed_binding_releases_its_lock():
    api = cluster()
    p = api.add_pod(pod("doomed", {"nvidia.com/gpu": "1"}))
    api.fail_bind.add("doomed")
    assert "taken back" in Extender(api).bind(bind_body(p, "n0"))["Error"]
    assert holders(api) == frozenset()
    assert formats.NODE_ALLOCATING not in api.get_node("n0")["metadata"]["annotations"]  # no empty leftovers


def test_garbage_collection_drops_lock_holders_that_no_longer_hold_it():
    api = cluster(4, 1)
    now = [1000.0]
    ext = Extender(api, clock=lambda: now[0], gc_grace=60)
    small = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    names = ["waiting", "done", "gone", "failed"]
    ps = {n: api.add_pod(pod(n, small)) for n in names}
    for k, n in enumerate(names):
        assert ext.bind(bind_body(ps[n], f"n{k}"))["Error"] == ""
    allocated(api, ps["done"])
    api.delete_pod("default", "gone")
    api.pods[("default", "failed")]["status"]["phase"] = "Failed"
    ext.collect_garbage()
    assert holders(api, "n0") == {ps["waiting"]["metadata"]["uid"]}
    assert holders(api, "n1") == frozenset() and holders(api, "n3") == frozenset()
    assert holders(api, "n2") == {ps["gone"]["metadata"]["uid"]}  # gone for less than 30 s: a lagging list?
    now[0] += 31
    ext.collect_garbage()
    assert holders(api, "n2") == frozenset() and holders(api, "n0") == {ps["waiting"]["metadata"]["uid"]}
    now[0] += 300
    ext.collect_garbage()
    assert holders(api, "n0") == frozenset()  # timed out


def test_a_malformed_lock_annotation_makes_the_node_unreadable_not_the_extender():
    api = cluster(2, 1)
    api.patch_node_annotations("n0", {formats.NODE_ALLOCATING: '{"version": 1, "pods": "uid-1"}'})
    cache = NodeCache(api)
    cache.refresh()
    out = Extender(api, cache=cache).filter({"Pod": pod("p", {"nvidia.com/gpu": "1"}), "NodeNames": ["n0", "n1"]})
    assert out["NodeNames"] == ["n1"]
    assert "gpuslice.io/allocating.pods" in out["FailedNodes"]["n0"]


def test_a_node_whose_ledger_names_a_lost_gpu_still_takes_pods_on_its_other_gpus():
    """A GPU vanished from gpuslice.io/devices while a pod still holds a slice on it: the node is not
    'unreadable'; filter (shared fleet and per-request build alike) and bind use its other GPUs."""
    api = cluster(1, 2)
    ghost = formats.PodGrant("n0", "uid-old", "default", "old", (formats.ContainerGrant(
        "main", Grant("k-uid-old-main", (Slice("GPU-lost", 40 * GiB, 50),))),), bound_at=1.0)
    api.patch_node_annotations("n0", {formats.NODE_LEDGER: formats.encode_ledger(formats.Ledger({}).with_entry(ghost))})
    api.add_pod(pod("old", {"nvidia.com/gpu": "1"}, uid="uid-old"))
    cache = NodeCache(api)
    cache.refresh()
    p = api.add_pod(pod("new", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}))
    for use_index in (True, False):
        out = Extender(api, cache=cache, use_index=use_index).filter({"Pod": p, "NodeNames": ["n0"]})
        assert out["NodeNames"] == ["n0"], out
    three = api.add_pod(pod("three", {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1000"}))
    assert Extender(api, cache=cache).filter({"Pod": three, "NodeNames": ["n0"]})["NodeNames"] == []  # not on it
    assert Extender(api).bind(bind_body(p, "n0"))["Error"] == ""
    g = formats.decode_pod_grant(api.get_pod("default", "new")["metadata"]["annotations"][formats.POD_GRANT])
    assert "GPU-lost" not in g.containers[0].uuids
    ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0")
    assert set(ledger.entries) == {"uid-old", p["metadata"]["uid"]}  # the lost GPU's grant is kept


# ------------------------------------------------------------------------------ the pod's grant annotation
class HookedAPI(FakeAPI):
    """FakeAPI that runs ``hook`` (once) just before the next pod-annotation patch: a second bind of the
    same pod slips in between a bind's read of the pod and its annotation write."""

    def __init__(self):
        super().__init__()
        self.hook = None
        self.lost_answer: set[str] = set()  # pods whose binding lands but whose answer is lost

    def patch_pod_annotations(self, namespace, name, changes, **kw):
        hook, self.hook = self.hook, None
        if hook:
            hook()
        return super().patch_pod_annotations(namespace, name, changes, **kw)

    def bind_pod(self, namespace, name, uid, node):
        super().bind_pod(namespace, name, uid, node)
        if name in self.lost_answer:
            from gpuslice.kube.api import KubeError

            raise KubeError(f"POST binding of {name}: timed out (test)", 0)


def _anns(api, name):
    return api.get_pod("default", name)["metadata"].get("annotations") or {}


def test_a_losing_bind_never_leaves_its_grant_on_a_pod_bound_elsewhere():
    api = HookedAPI()
    for n in ("n0", "n1"):
        api.add_node(n, node(n, 2)["metadata"]["annotations"])
    p = api.add_pod(pod("twice", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}))
    first, second = Extender(api), Extender(api)
    # second has read the pod and committed on n1; before it writes the annotation, first binds it to n0
    api.hook = lambda: first.bind(bind_body(p, "n0"))
    err = second.bind(bind_body(p, "n1"))["Error"]
    assert "bound to n0 meanwhile" in err and "taken back" in err
    stored = api.get_pod("default", "twice")
    assert stored["spec"]["nodeName"] == "n0"
    grant = formats.decode_pod_grant(_anns(api, "twice")[formats.POD_GRANT])
    assert grant.node == "n0"
    ledgers = {n: formats.decode_ledger(api.get_node(n)["metadata"]["annotations"].get(formats.NODE_LEDGER), n)
               for n in ("n0", "n1")}
    assert ledgers["n0"].entries[p["metadata"]["uid"]] == grant and ledgers["n1"].entries == {}


def test_a_binding_whose_answer_was_lost_keeps_its_grant():
    api = HookedAPI()
    api.add_node("n0", node("n0", 2)["metadata"]["annotations"])
    p = api.add_pod(pod("lost", {"nvidia.com/gpu": "1"}))
    api.lost_answer.add("lost")
    assert Extender(api).bind(bind_body(p, "n0"))["Error"] == ""  # it is bound: not a failure
    ledger = formats.decode_ledger(api.get_node("n0")["metadata"]["annotations"][formats.NODE_LEDGER], "n0")
    assert set(ledger.entries) == {p["metadata"]["uid"]}  # not taken back under a running pod
    assert formats.decode_pod_grant(_anns(api, "lost")[formats.POD_GRANT]).node == "n0"


def test_a_failed_binding_removes_its_grant_annotation():
    api = cluster()
    p = api.add_pod(pod("doomed", {"nvidia.com/gpu": "1"}))
    api.fail_bind.add("doomed")
    assert "taken back" in Extender(api).bind(bind_body(p, "n0"))["Error"]
    assert formats.POD_GRANT not in _anns(api, "doomed")


def test_a_lock_released_before_the_watch_says_so_is_read_fresh():
    """kube-scheduler retries a waiting pod on the Node update that releases the lock, which can come
    before the extender's own watch delivers it: filter confirms a blocking lock with a fresh read."""
    api = cluster(1, 2)
    cache = NodeCache(api)
    ext = Extender(api, cache=cache, allocation_timeout=300)
    small = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    a, b = api.add_pod(pod("a", small)), api.add_pod(pod("b", small))
    assert ext.bind(bind_body(a, "n0"))["Error"] == ""
    cache.refresh()  # the watch has seen the lock taken
    assert ext.filter({"Pod": b, "NodeNames": ["n0"]})["NodeNames"] == []
    api.patch_node_annotations("n0", {formats.NODE_ALLOCATING: None})  # the device plugin releases it ...
    stale = cache.views.get("n0")
    assert stale is not None and stale.allocating == {a["metadata"]["uid"]}  # ... unseen by the watch
    assert ext.filter({"Pod": b, "NodeNames": ["n0"]})["NodeNames"] == ["n0"]
    assert cache.views.get("n0").allocating == frozenset()  # the fresh read also refreshed the cache
