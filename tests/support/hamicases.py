"""The HAMi conformance cases (``tests/kube/hami/*.yaml``): loading, pods from workloads, and the checks
of what a pod was granted. Shared by the unit suite (webhook + extender over a fake fleet,
``tests/kube/test_hami_conformance.py``) and the e2e subset (real kube-apiserver + kube-scheduler,
``tests/e2e/test_kube_hami_conformance.py``).

A case file is a YAML stream: first a ``ConformanceCase`` document, then the workloads as a HAMi user
writes them (Pod, Deployment, Job, CronJob, StatefulSet; other kinds such as a Service or a
PersistentVolumeClaim are carried along and ignored). Workloads annotated
``conformance.gpuslice.io/role: before`` are admitted and bound first (they must be); every pod of the
others (one per replica) is checked against ``expect``, the last one against ``last`` where given::

    apiVersion: conformance.gpuslice.io/v1
    kind: ConformanceCase
    follows: HAMi examples/nvidia/default_use.yaml     # what HAMi behaviour the case pins (text)
    fleet: h100                                        # a fleet preset (the unit suite's FLEETS)
    e2e: true                                          # also run against the real control plane
    quota: {limits.nvidia.com/gpumem: "20000"}         # a ResourceQuota in the pods' namespace
    expect:
      refused: "substring"          # or admitted (default), with:
      warnings: ["substring", ...]
      schedulerName: gpuslice-scheduler                # default when admitted
      limits: {main: {nvidia.com/gpu: "2"}}            # container limits after the webhook
      annotations: {gpuslice.io/mig-profile: main=3g.40gb}
      unschedulable: "substring"    # every node refused in filter, the reason holding this
      bindRefused: "substring"      # filter passes, bind refuses
      node: n2                      # where it lands (unit suite only)
      grant:
        main: {devices: 2, memory: 3000Mi | whole | 50%, compute: 30, exclusive: false, kind: app, engine: spatial,
               cards: 1, numa: 1, profiles: [1g.10gb], indexes: [0, 1], nvlinked: true}
      apart_from_before: true       # no device shared with the "before" pods
      accounted: {memory: 20000Mi}  # what the pod holds on its node (init containers counted as HAMi)
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import yaml

CASES = Path(__file__).resolve().parent.parent / "kube" / "hami"
ROLE = "conformance.gpuslice.io/role"
MiB = 1024**2
WORKLOAD_KINDS = ("Pod", "Deployment", "Job", "CronJob", "StatefulSet")


def case_files() -> list[Path]:
    return sorted(CASES.glob("*.yaml"))


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the case, its workloads) of one file; refuses a file without a case or a subject."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    case = docs[0]
    assert case.get("kind") == "ConformanceCase", f"{path.name}: the first document must be the ConformanceCase"
    assert case.get("follows"), f"{path.name}: say which HAMi behaviour the case follows"
    workloads = [d for d in docs[1:] if d.get("kind") in WORKLOAD_KINDS]
    assert any(role(w) != "before" for w in workloads), f"{path.name}: no workload to check"
    return case, workloads


def role(workload: dict[str, Any]) -> str:
    return ((workload.get("metadata") or {}).get("annotations") or {}).get(ROLE, "subject")


def template_of(workload: dict[str, Any]) -> dict[str, Any]:
    kind = workload["kind"]
    if kind == "Pod":
        return {"metadata": workload.get("metadata") or {}, "spec": workload["spec"]}
    if kind == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]
    return workload["spec"]["template"]


def pods_of(workload: dict[str, Any], namespace: str) -> Iterator[dict[str, Any]]:
    """The pods the workload's controller would create (one per replica; a Job / CronJob: one), each as
    a Pod object the API server would receive: the template's metadata and spec, a generated name."""
    kind = workload["kind"]
    name = workload["metadata"]["name"]
    template = template_of(workload)
    replicas = int((workload.get("spec") or {}).get("replicas", 1)) if kind in ("Deployment", "StatefulSet") else 1
    for k in range(replicas):
        meta = copy.deepcopy(template.get("metadata") or {})
        meta.pop("name", None)
        meta["name"] = name if kind == "Pod" else f"{name}-{k}"
        meta["namespace"] = namespace
        anns = dict(meta.get("annotations") or {})
        if kind == "Pod":
            anns.pop(ROLE, None)
        meta["annotations"] = anns
        spec = copy.deepcopy(template["spec"])
        spec.setdefault("schedulerName", "default-scheduler")  # what the API server defaults
        for part in ("initContainers", "containers"):
            for c in spec.get(part) or []:
                res = c.setdefault("resources", {})
                limits = {k2: str(v) for k2, v in (res.get("limits") or {}).items()}
                res["limits"] = limits
                # The API server defaults requests of extended resources from limits.
                res["requests"] = {**limits, **{k2: str(v) for k2, v in (res.get("requests") or {}).items()}}
        yield {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def quantity_bytes(text: Any) -> int:
    text = str(text)
    for suffix, scale in (("Gi", 1024**3), ("Mi", MiB)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * scale)
    return int(text)


def check_grant(grant: Any, want: dict[str, Any], device: dict[str, dict[str, Any]], where: str,
                node_specific: bool = True) -> None:
    """``grant`` (a formats.PodGrant) against ``want`` (``expect.grant``); ``device`` maps each UUID the
    node publishes (GPUs and MIG instances) to {memory, numa, index, card, profile, peers}."""
    got = {c.container: c for c in grant.containers}
    assert set(got) == set(want), f"{where}: granted containers {sorted(got)}, expected {sorted(want)}"
    for name, w in want.items():
        c = got[name]
        slices = c.slices
        info = [device[s.device_uuid] for s in slices]
        if "devices" in w:
            assert len(slices) == w["devices"], f"{where}/{name}: {len(slices)} devices, expected {w['devices']}"
        if "kind" in w:
            assert c.kind == w["kind"], f"{where}/{name}: kind {c.kind}"
        if "exclusive" in w:
            assert c.exclusive == w["exclusive"], f"{where}/{name}: exclusive {c.exclusive}"
        if "compute" in w:
            assert all(s.compute == w["compute"] for s in slices), f"{where}/{name}: compute {[s.compute for s in slices]}"
        assert all(s.engine.value == w.get("engine", "timeslice") for s in slices), \
            f"{where}/{name}: engine {[s.engine.value for s in slices]}, expected {w.get('engine', 'timeslice')}"
        if "memory" in w:
            m = str(w["memory"])
            for s, d in zip(slices, info):
                expected = d["memory"] if m == "whole" else d["memory"] * int(m[:-1]) // 100 if m.endswith("%") \
                    else quantity_bytes(m)
                assert s.memory_limit == expected, f"{where}/{name}: memory {s.memory_limit}, expected {expected} ({m})"
        if "cards" in w:
            assert len({d["card"] for d in info}) == w["cards"], f"{where}/{name}: cards {[d['card'] for d in info]}"
        if "numa" in w:
            assert len({d["numa"] for d in info}) == w["numa"], f"{where}/{name}: NUMA nodes {[d['numa'] for d in info]}"
        if "profiles" in w:
            assert sorted(d["profile"] for d in info) == sorted(w["profiles"]), \
                f"{where}/{name}: profiles {[d['profile'] for d in info]}"
        if "nvlinked" in w:
            linked = all(b["uuid"] in a["peers"] for a in info for b in info if a is not b)
            assert linked == w["nvlinked"], f"{where}/{name}: NVLinked {linked}"
        if node_specific and "indexes" in w:
            assert sorted(d["index"] for d in info) == sorted(w["indexes"]), \
                f"{where}/{name}: device indexes {[d['index'] for d in info]}"
        if node_specific and "index_in" in w:
            assert all(d["index"] in w["index_in"] for d in info), f"{where}/{name}: indexes {[d['index'] for d in info]}"
