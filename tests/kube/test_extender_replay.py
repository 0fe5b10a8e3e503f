"""The extender decides what the simulator decides: an openb arrival sequence (the simulator's own, for 30 of
openb's GPU nodes with their CPU and memory) goes through the extender's filter, prioritize and bind placement,
as kube-scheduler would send it, with the pods' CPU and memory counted as the pod watch would count them — and
every pod lands on the simulator's node and devices. No API server: the real one is in
tests/e2e/test_kube_placement_authority.py; this pins the decisions themselves, pod by pod."""

from __future__ import annotations

import numpy as np
import pytest

import openbreplay as rp
from gpuslice.kube import formats, podrequest, resources
from gpuslice.kube.extender import Extender
from gpuslice.kube.extender.usage import PodUsage, pod_requests
from gpuslice.placement import PlacementPolicy, WorkloadMix
from gpuslice.sim.engine import Cluster, SimConfig, _shape
from gpuslice.spec import Grant

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [5, 6])
def test_extender_places_every_pod_where_the_simulator_does(seed: int) -> None:
    specs = rp.replay_nodes(seed, 30, cpu_scale=1)
    tasks, _ = rp.replay_tasks(seed, specs)
    policy = PlacementPolicy.parse("fgd")
    sim = Cluster.build(specs, SimConfig(seed=seed, cpu_tasks="skip"))
    mix, rng = WorkloadMix(), np.random.default_rng([seed, 7])
    usage = PodUsage()
    ext = Extender(None, resources.KubeConfig(policy=policy), usage=usage)
    nodes = {}
    for s in specs:
        n = {**rp.node_object(s, {}, {"key": "x", "effect": "NoSchedule"}), **rp.node_status(s)}
        n["metadata"].update(resourceVersion="1", uid=f"uid-{s.name}")
        nodes[s.name] = n
        ext.views.view(n)
    version = 1
    for i, task in enumerate(tasks):
        mix.observe(_shape(task))
        token = sim.try_place(task, policy, mix.workload(), rng)
        want = (token[1].node, sorted(s.device_uuid for s in token[1].slices)) if token else None
        pod = rp.hami_pod(task, f"t-{i}", scheduler="gpuslice-scheduler", policy="fgd", label={}, toleration={})
        pod["metadata"].update(namespace="replay", uid=f"uid-{i}")
        pod["status"] = {"phase": "Pending"}
        # kube-scheduler's own filter (CPU, memory) as the simulator's, then the extender's filter and scores.
        feasible = [n for n in nodes if sim_fits(sim, n, task, token)]
        fitting = ext.filter({"Pod": pod, "NodeNames": feasible})["NodeNames"]
        scores = ext.prioritize({"Pod": pod, "NodeNames": fitting})
        top = [s["Host"] for s in scores if s["Score"] == 10]
        if want is None:
            assert not fitting or not top, (i, task, top)
            continue
        assert top == [want[0]], (i, task, top, want)
        view = ext.views.get(want[0])
        req = podrequest.pod_request(pod, ext.cfg)
        placed = ext._place_all(req, ext._state_for(view, req), pod_requests(pod))
        grant = formats.PodGrant(node=want[0], pod_uid=f"uid-{i}", namespace="replay", pod=f"t-{i}", containers=tuple(
            formats.ContainerGrant(c.name, Grant(formats.grant_id_for(f"uid-{i}", c.name), p.slices, p.exclusive))
            for c, p in placed))
        assert sorted(s.device_uuid for c in grant.containers for s in c.slices) == want[1], (i, task)
        version += 1
        node = nodes[want[0]]
        node["metadata"]["annotations"][formats.NODE_LEDGER] = formats.encode_ledger(view.ledger.with_entry(grant))
        node["metadata"]["resourceVersion"] = str(version)
        ext.views.view(node)
        pod["spec"]["nodeName"] = want[0]
        usage.assume(pod, want[0])
    assert ext.mix.workload() == mix.workload()


def sim_fits(sim: Cluster, name: str, task, token) -> bool:
    """Whether the node had the task's CPU and memory before the simulator placed it (kube-scheduler's filter)."""
    i = sim.fleet.index[name]
    cpu = int(sim.fleet.cpu_total[i] - sim.fleet.cpu_used[i])
    mem = int(sim.fleet.hm_total[i] - sim.fleet.hm_used[i])
    if token is not None and token[1].node == name:  # already applied: add it back
        cpu, mem = cpu + task.cpu_milli, mem + task.host_memory
    return cpu >= task.cpu_milli and mem >= task.host_memory
