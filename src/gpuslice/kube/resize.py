"""Live resize in Kubernetes: the ``gpuslice.io/resize`` pod annotation, its answer, and the node agent's part.

A user (or an operator) annotates a running pod (device-plugin path)::

    gpuslice.io/resize: '{"container": "main", "memory": "8Gi", "compute": 40}'

``container`` may be left out when one container of the pod holds a grant; ``memory``, ``compute``,
``priority``, ``mode`` as in a request, at least one. The answer is ``gpuslice.io/resize-status``:
``{"version": 1, "request": <the resize annotation it answers, verbatim>, "state": ..., "message": ...,
"generation": <the slice file's generation, once done>}``. A new ``gpuslice.io/resize`` value is a new
request; one value is answered once. Each side does what it owns, and hands on through ``state``:

1. **checked** — the node agent (it sees the container's region): the request parses and no new memory
   size is below what the container's processes hold now; else **refused** saying how much is in use.
2. **granted** — the extender (it owns the node's ledger, :mod:`gpuslice.kube.extender.resize`): the new
   sizes fit beside the node's other slices by placement's rules; the ledger is written as binds write it
   (read the Node, decide, write under a resourceVersion precondition, retry on a conflict), so a resize
   racing binds or other resizes never over-commits; the pod's ``gpuslice.io/grant`` follows. Else
   **refused** naming the device and what is free.
3. **done** — the node agent (it owns the slice file): the container's slice file is rewritten from the
   ledger, one generation up (a new file renamed over the old one); its running processes follow within a
   second (``native/README.md``, Live resize). A container not allocated yet gets the new sizes at Allocate.

Refused at step 1 or 2 (the message names the field): no grant on this node, an unknown container, an init
container, a spatial slice, the memory or compute of a grant of whole devices, and ``evict`` (from the node a
container's processes cannot be told apart: they live in the pod's pid namespace). Between the check at
step 1 and the rewrite the program may allocate more; then it keeps what it holds and its next allocations
are refused until it is under the new size. Not handled: DRA claims (their capacity is the claim's).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Mapping

from gpuslice.enforcer.policy import write_policies
from gpuslice.enforcer.slicefile import read_slice_file, write_slice_file
from gpuslice.host.usage import Watched, below_usage
from gpuslice.kube import formats
from gpuslice.kube.allocator import Allocator
from gpuslice.kube.api import KubeAPI
from gpuslice.kube.extender.follow import follow
from gpuslice.placement import resized_slices
from gpuslice.spec import GpusliceError, Resize, SpecError

log = logging.getLogger("gpuslice.resize")

CHECKED, GRANTED, DONE, REFUSED = "checked", "granted", "done", "refused"


def decode_resize(text: Any) -> tuple[str, Resize]:
    """``gpuslice.io/resize`` -> (container name, "" for the pod's one GPU container; the change)."""
    key = formats.POD_RESIZE
    try:
        data = json.loads(text) if isinstance(text, str) and len(text) <= 4096 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise SpecError(key, text, 'a JSON object like {"container": "main", "memory": "8Gi"} (at most 4096 bytes)')
    data = dict(data)
    if data.pop("version", 1) != 1:
        raise SpecError(f"{key}.version", text, "1")
    container = data.pop("container", "")
    if not isinstance(container, str):
        raise SpecError(f"{key}.container", container, "a container name")
    if data.get("evict"):
        raise SpecError(f"{key}.evict", True, "false on Kubernetes: the node agent cannot tell a container's "
                        "processes apart (they live in the pod's pid namespace); free memory in the program first")
    try:
        return container, Resize.from_mapping(data)
    except SpecError as exc:
        raise SpecError(f"{key}.{exc.field}", exc.value, exc.allowed) from None


def encode_status(request: str, state: str, message: str, generation: int = 0) -> str:
    return json.dumps({"version": formats.FORMAT_VERSION, "request": request, "state": state, "message": message,
                       "generation": generation, "at": round(time.time(), 3)}, separators=(",", ":"))


def pending(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the pod's resize request, the state its answer reached: "" when none yet), or None when the pod
    has no request."""
    anns = (pod.get("metadata") or {}).get("annotations") or {}
    text = anns.get(formats.POD_RESIZE)
    if not text:
        return None
    try:
        status = json.loads(anns.get(formats.POD_RESIZE_STATUS) or "{}")
    except ValueError:
        status = {}
    if not isinstance(status, dict) or status.get("request") != text:
        return text, ""
    return text, str(status.get("state", ""))


def container_of(entry: formats.PodGrant, name: str) -> formats.ContainerGrant:
    """The container a resize names (or the pod's only one); refused naming the field otherwise."""
    key = f"{formats.POD_RESIZE}.container"
    if name:
        found = entry.container(name)
        if found is None:
            raise SpecError(key, name, "one of " + ", ".join(c.container for c in entry.containers))
    elif len(entry.containers) == 1:
        found = entry.containers[0]
    else:
        raise SpecError(key, "", "the container to resize; this pod has grants for "
                        + ", ".join(c.container for c in entry.containers))
    if found.kind == "init":
        raise SpecError(key, found.container, "an app container or a sidecar (an init container has ended)")
    return found


def answer(api: KubeAPI, pod: Mapping[str, Any], text: str, state: str, message: str, generation: int = 0,
           extra: Mapping[str, str] | None = None) -> str:
    meta = pod.get("metadata") or {}
    changes = {**(extra or {}), formats.POD_RESIZE_STATUS: encode_status(text, state, message, generation)}
    api.patch_pod_annotations(str(meta.get("namespace") or ""), str(meta.get("name") or ""), changes,
                              uid=meta.get("uid"))
    log.info("resize of pod %s/%s: %s (%s)", meta.get("namespace"), meta.get("name"), state, message)
    return state


class PodFollower:
    """List the pods of ``selector`` (a field selector), then follow their changes, handing each pod to
    :meth:`handle` (one side of live resize); a pod's trouble is logged, never stops the loop."""

    selector = ""

    def __init__(self, api: KubeAPI, poll_interval: float = 5.0):
        self.api = api
        self.poll_interval = poll_interval
        self._stop = threading.Event()

    def handle(self, pod: Mapping[str, Any]) -> str | None:
        raise NotImplementedError

    def refresh(self) -> str:
        lister = getattr(self.api, "list_pods_at", None)
        pods, rv = lister(field_selector=self.selector) if lister else (self.api.list_pods(field_selector=self.selector), "")
        for pod in pods:
            self._safe(pod)
        return rv

    def _safe(self, pod: Mapping[str, Any]) -> None:
        try:
            self.handle(pod)
        except Exception as exc:  # a gone pod, the API away: the next event or list tries again
            log.warning("resize of pod %s: %s", (pod.get("metadata") or {}).get("name"), exc)

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._safe(pod)

    def start(self) -> threading.Thread:
        watch = getattr(self.api, "watch_pods", None)
        follow_ = (lambda rv: watch(rv, field_selector=self.selector)) if watch else None
        t = threading.Thread(target=follow, name="gpuslice-resize", daemon=True,
                             args=("pod resize", self.refresh, follow_, self._event, self._stop, self.poll_interval))
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


class NodeResizer(PodFollower):
    """The node agent's part of live resize: check a request against the container's usage (step 1) and,
    once the extender granted it, rewrite the container's slice file from the ledger (step 3)."""

    def __init__(self, api: KubeAPI, node: str, allocator: Allocator, poll_interval: float = 5.0):
        super().__init__(api, poll_interval)
        self.node = node
        self.selector = f"spec.nodeName={node}"
        self.allocator = allocator

    def handle(self, pod: Mapping[str, Any]) -> str | None:
        """Move the pod's resize on by one step if it is this side's turn; the state written, else None."""
        found = pending(pod)
        if found is None or found[1] not in ("", GRANTED):
            return None
        text, state = found
        try:
            name, change = decode_resize(text)
            entry = self._entry(pod)
            grant = container_of(entry, name)
            if state == GRANTED:
                return answer(self.api, pod, text, DONE, "resized; the container's processes follow within a second",
                              self._rewrite(grant, pod))
            self._check(grant, change)
            return answer(self.api, pod, text, CHECKED, "fits what the container holds now; waiting for the scheduler")
        except (SpecError, GpusliceError) as exc:
            return answer(self.api, pod, text, REFUSED, str(exc))

    def _entry(self, pod: Mapping[str, Any]) -> formats.PodGrant:
        anns = (self.api.get_node(self.node).get("metadata") or {}).get("annotations") or {}
        ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), self.node)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        entry = ledger.entries.get(uid)
        if entry is None:
            raise SpecError(formats.POD_RESIZE, uid, f"a pod holding a grant on node {self.node}")
        return entry

    def _check(self, grant: formats.ContainerGrant, change: Resize) -> None:
        devices = {d.uuid: d.memory_total for d in self.allocator.devices()}
        devices.update({m.uuid: m.memory_total for d in self.allocator.devices() for m in d.mig_instances})
        new = resized_slices(grant.grant, change, devices)
        region = self.allocator.paths(grant.grant_id, local=True)["region"] / "region"
        over = below_usage(Watched(grant.grant, "", str(region)), {s.device_uuid: s.memory_limit for s in new},
                           same_pid_namespace=False)
        if over:
            raise GpusliceError(f"memory: {over}; free memory in the program first")

    def _rewrite(self, grant: formats.ContainerGrant, pod: Mapping[str, Any]) -> int:
        """Rewrite the container's slice file (if Allocate wrote one) one generation up; the generation."""
        path = self.allocator.paths(grant.grant_id, local=True)["slice"]
        if not path.exists():
            return 0  # not allocated yet: Allocate writes the ledger's new sizes
        generation = read_slice_file(path).generation + 1
        write_slice_file(path, replace(self.allocator.slice_config(grant), generation=generation))
        # the running pacers take a new share, mode and priority from the device's roster within 100 ms
        write_policies(self.allocator.paths(grant.grant_id, local=True)["devices"], grant.grant_id, grant.grant.slices,
                       self.allocator.roster_daemon(grant, pod))
        return generation

