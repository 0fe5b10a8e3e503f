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

from gpuslice.kube import codec
from gpuslice.kube.extender import Extender, NodeCache, sum_grants
from gpuslice.kube.server import make_app, start_in_thread
from gpuslice.placement import PlacementPolicy
from gpuslice.spec import GiB, MiB


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
    del bare["metadata"]["annotations"][codec.NODE_DEVICES]
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
    used = codec.Ledger({}).with_entry(codec.PodGrant("busy", "u0", "ns", "x", (codec.ContainerGrant(
        "main", "k-u0-main", (codec.Slice(codec.decode_node_devices(node("busy")["metadata"]["annotations"][
            codec.NODE_DEVICES]).devices[0].uuid, 40 * GiB, 50),)),)))
    nodes = [node("idle"), node("busy", ledger=codec.encode_ledger(used))]
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
    ("/prioritize", json.dumps({"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [{}]}}).encode(), "NodeList"),
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
    grant = codec.decode_pod_grant(stored["metadata"]["annotations"][codec.POD_GRANT])
    (c,) = grant.containers
    assert c.container == "main" and c.slices[0].memory_limit == 10000 * MiB and c.slices[0].compute == 30
    ledger = codec.decode_ledger(api.get_node("n0")["metadata"]["annotations"][codec.NODE_LEDGER], "n0")
    assert ledger.entries[p["metadata"]["uid"]] == grant
    # binding again (a retry after a lost answer): same node, same pod -> nothing changes
    api.patch_pod_annotations("default", "train", {codec.POD_ALLOCATED: codec.encode_allocated(["main"])})
    calls = len(api.calls)
    assert Extender(api).bind(bind_body(p, "n0"))["Error"] == ""
    assert api.calls[calls:] == []  # no write at all: the allocated mark and the binding stay
    assert "already bound to n0" in Extender(api).bind(bind_body(p, "n1"))["Error"]


def test_concurrent_binds_never_overcommit_across_replicas():
    """60 pods × 30 GiB race for one node with 2 × 80 GiB GPUs through two extender replicas."""
    api = cluster(1, 2)
    pods = [api.add_pod(pod(f"p{i}", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(30 * 1024)})) for i in range(60)]
    replicas = [serve(Extender(api)), serve(Extender(api))]
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
    assert len(bound) == 4 and all(codec.POD_GRANT in p["metadata"]["annotations"] for p in bound)


def test_restarted_extender_rebuilds_state_from_the_api_server():
    api = cluster(2, 1)
    first = Extender(api)
    a = api.add_pod(pod("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "60"}))
    assert first.bind(bind_body(a, "n0"))["Error"] == ""
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
    ledger = codec.decode_ledger(api.get_node("n0")["metadata"]["annotations"].get(codec.NODE_LEDGER), "n0")
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
    g = codec.decode_pod_grant(api.get_pod("default", "two")["metadata"]["annotations"][codec.POD_GRANT])
    assert [c.container for c in g.containers] == ["c0", "c1"]
    assert g.containers[0].uuids != g.containers[1].uuids  # 50000 MiB twice does not fit one 80 GB GPU
    three = api.add_pod(pod("three", containers=cs + [dict(cs[0], name="c2")]))
    out = ext.filter({"Pod": three, "NodeNames": ["n0", "n1"]})  # n0 is full; n1 holds two of three
    assert out["NodeNames"] == [] and "container c2" in out["FailedNodes"]["n1"]


def test_garbage_collection_frees_deleted_and_finished_pods():
    api = cluster(1, 1)
    now = [1000.0]
    ext = Extender(api, gc_grace=60, clock=lambda: now[0])
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
    ledger = codec.decode_ledger(api.get_node("n0")["metadata"]["annotations"][codec.NODE_LEDGER], "n0")
    assert list(ledger.entries) == [c["metadata"]["uid"]]


def test_policy_can_be_set_for_the_cluster():
    ext = Extender(None, codec.KubeConfig(policy=PlacementPolicy.parse("spread")))
    used = codec.Ledger({}).with_entry(codec.PodGrant("busy", "u0", "ns", "x", (codec.ContainerGrant(
        "main", "k-u0-main", (codec.Slice(codec.decode_node_devices(node("busy")["metadata"]["annotations"][
            codec.NODE_DEVICES]).devices[0].uuid, 40 * GiB, 50),)),)))
    nodes = [node("busy", ledger=codec.encode_ledger(used)), node("idle")]
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(args_with_nodes(pod("p", {"nvidia.com/gpu": "1",
                                                                                      "nvidia.com/gpumem": "1000"}), nodes))}
    assert scores["idle"] > scores["busy"]


def test_fleet_index_follows_ledger_changes_like_a_fresh_build():
    """The shared fleet, updated row by row, answers exactly as a per-request build over the same nodes."""
    import random

    from gpuslice.kube.extender import ViewCache

    rng = random.Random(3)
    names = [f"n{i}" for i in range(12)]
    uuids = {n: [d.uuid for d in codec.decode_node_devices(node(n, 2)["metadata"]["annotations"][
        codec.NODE_DEVICES]).devices] for n in names}
    ledgers = {n: codec.Ledger({}) for n in names}
    health = {n: {} for n in names}
    rv = [1]

    def current(n):
        rv[0] += 1
        doc = node(n, 2, rv=str(rv[0]), ledger=codec.encode_ledger(ledgers[n]))
        from kubefixtures import devices as devs
        doc["metadata"]["annotations"][codec.NODE_DEVICES] = codec.encode_node_devices(devs(n, 2), health=health[n])
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
            health[n] = {} if health[n] else {u: codec.UNHEALTHY}
        elif ledgers[n].entries and rng.random() < 0.4:
            ledgers[n] = ledgers[n].without([rng.choice(list(ledgers[n].entries))])
        else:
            mem = rng.choice([4000, 10000, 30000]) * MiB
            u = rng.choice(uuids[n])
            trial = ledgers[n].with_entry(codec.PodGrant(n, f"u{step}", "ns", f"p{step}", (codec.ContainerGrant(
                "main", f"k-u{step}-main", (codec.Slice(u, mem, rng.choice([0, 10, 30])),)),)))
            try:
                codec.node_state(n, codec.decode_node_devices(current(n)["metadata"]["annotations"][
                    codec.NODE_DEVICES]), trial)
                ledgers[n] = trial
            except codec.SpecError:
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
    now = codec.decode_node_devices(fresh["metadata"]["annotations"][codec.NODE_DEVICES]).updated
    quiet["metadata"]["annotations"][codec.NODE_DEVICES] = codec.encode_node_devices(
        codec.decode_node_devices(quiet["metadata"]["annotations"][codec.NODE_DEVICES]).devices, now=now - 600)
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
