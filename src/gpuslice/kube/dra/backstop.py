"""The backstop in DRA mode (``gpuslice kube-agent --dra``): the same loop as the device plugin's
(:class:`gpuslice.kube.backstop.KubeBackstop`: NVML's per-process device memory, a process's container from its
cgroup, report then kill after the grace), with the grants taken from the prepared claims of the checkpoint.

A claim's slice is shared by every container that gets the claim (``resources.claims``) in the pods the claim
was reserved for when it was prepared; their processes' memory is summed against the slice's limit, as the
enforcer sums it in the claim's one region.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuslice.host.backstop import Tracked
from gpuslice.kube.dra.checkpoint import PreparedClaim
from gpuslice.kube.dra.claims import containers_with_claim

Claims = Mapping[str, PreparedClaim]  # claim UID -> the prepared claim (Checkpoint.claims())


def claim_tracked(claims: Claims) -> list[Tracked]:
    """Each prepared claim's slices, labelled ``namespace/claim``."""
    return [Tracked(c.grant.grant_id, s.device_uuid, s.memory_limit, f"{c.namespace}/{c.name}")
            for c in claims.values() for s in c.grant.slices]


def claim_containers(claims: Claims, pods: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``{container ID: grant id}`` of the containers that get a prepared claim, in the pods it was prepared for
    (a pod is named by namespace and name; its UID is not in the claim's checkpoint record)."""
    by_name = {((p.get("metadata") or {}).get("namespace"), (p.get("metadata") or {}).get("name")): p for p in pods}
    out: dict[str, str] = {}
    for claim in claims.values():
        for pod_name in claim.pods:
            pod = by_name.get((claim.namespace, pod_name))
            if pod is None:
                continue
            users = containers_with_claim(pod, claim.name)
            status = pod.get("status") or {}
            for s in (*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())):
                if isinstance(s, dict) and s.get("name") in users:
                    cid = str(s.get("containerID") or "").split("://", 1)[-1]
                    if cid:
                        out[cid] = claim.grant.grant_id
    return out
