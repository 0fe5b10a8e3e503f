"""The allocation lock: at most one pod per device count waits for the kubelet's Allocate on a node.

Why: the kubelet's ``Allocate`` names device IDs, never the pod, and the kubelet does not promise to
admit pods in the order they were bound. With two bound pods on a node both waiting for a container of
the same device count, the device plugin cannot know which of them the kubelet is admitting: it could
hand pod B the grant of pod A (B runs with A's limits; when B ends its ledger entry is freed while A
still runs → over-commit). So the extender does not create that situation (HAMi's node lock, per
device count):

* ``bind`` adds the pod's UID to the Node's ``gpuslice.io/allocating`` in the same resourceVersion-
  conditioned patch that commits its ledger entry, and refuses a pod while another pod in that list
  still waits for a container of one of its device counts (``filter`` leaves such nodes out, so the
  scheduler picks another node or retries when the Node changes);
* the device plugin removes the UID once every container of the pod is allocated;
* a holder stops counting after ``timeout`` seconds (the kubelet may never admit it), and ``bind`` and
  garbage collection drop holders whose pod is gone, finished, deleted, bound elsewhere or allocated.

Pure functions over codec data; the API calls are the extender's and the plugin's.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpuslice.kube import formats
from gpuslice.spec import SpecError

DEFAULT_TIMEOUT = 300.0  # seconds; HAMi releases its node lock after 5 minutes


def blockers(ledger: formats.Ledger, allocating: frozenset[str], pod_uid: str, counts: frozenset[int],
             now: float, timeout: float) -> list[formats.PodGrant]:
    """Ledger entries of the other pods that hold the lock against a pod with containers of ``counts``
    devices: in ``allocating``, in the ledger, bound less than ``timeout`` s ago, sharing a count.
    Oldest first; empty when the lock is off (``timeout`` 0)."""
    if timeout <= 0:
        return []
    out = []
    for uid in allocating:
        entry = ledger.entries.get(uid)
        if uid == pod_uid or entry is None or entry.bound_at < now - timeout:
            continue
        if formats.device_counts(entry) & counts:
            out.append(entry)
    return sorted(out, key=lambda e: (e.bound_at, e.pod_uid))


def live_holders(ledger: formats.Ledger, allocating: frozenset[str], now: float, timeout: float) -> frozenset[str]:
    """The holders worth keeping: in the ledger and not timed out (the rest no longer count)."""
    if timeout <= 0:
        return frozenset()
    return frozenset(u for u in allocating if u in ledger.entries and ledger.entries[u].bound_at >= now - timeout)


def released(pod: Mapping[str, Any] | None, entry: formats.PodGrant) -> str:
    """Why ``pod`` (as the API server returns it, ``None`` if gone) no longer waits for Allocate on the
    node of ``entry``; '' while it still does."""
    if pod is None:
        return "the pod is gone"
    meta = pod.get("metadata") or {}
    if meta.get("uid") != entry.pod_uid:
        return "the pod was recreated"
    if meta.get("deletionTimestamp"):
        return "the pod is being deleted"
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase != "Pending":
        return f"the pod is {phase}"
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound and bound != entry.node:
        return f"the pod is bound to {bound}"
    try:
        done = formats.decode_allocated((meta.get("annotations") or {}).get(formats.POD_ALLOCATED))
    except SpecError:
        done = set()  # unreadable mark: not proof of allocation, keep the lock (it times out)
    if {c.container for c in entry.containers} <= done:
        return "the device plugin allocated it"
    return ""


def reason(entry: formats.PodGrant, now: float) -> str:
    """What ``filter`` / ``bind`` tell the scheduler about a node held by ``entry``."""
    counts = ", ".join(str(n) for n in sorted(formats.device_counts(entry)))
    return (f"waiting for the kubelet to allocate pod {entry.namespace}/{entry.pod} (bound "
            f"{max(0.0, now - entry.bound_at):.0f} s ago, containers of {counts} device(s)): gpuslice binds one pod "
            f"per device count at a time on a node, so that the device plugin can tell pods apart "
            f"({formats.NODE_ALLOCATING})")
