"""The mutating admission webhook (AdmissionReview ``admission.k8s.io/v1``) for pods asking for GPU slices.

For a Pod CREATE whose containers ask for GPU slices (HAMi's resource names or ours), the response
JSONPatch:

* sets ``spec.schedulerName`` to the gpuslice scheduler (the kube-scheduler profile that calls our extender)
  when the pod names no scheduler or one of ``adopt_schedulers`` (``default-scheduler``); a pod naming
  another scheduler is left to it, as HAMi does, with a warning;
* rewrites ``nvidia.com/mig-<profile>: N`` (NVIDIA's MIG names, which no node advertises under gpuslice) to
  the advertised count N plus the pod annotation ``gpuslice.io/mig-profile``;
* fills counts of init containers and sidecars too (HAMi mutates and counts them);
* refuses a pod over its namespace's GPU quota (``quota``: :class:`gpuslice.kube.quota.AdmissionQuota`) with 403,
  and one asking for high priority in a namespace the cluster's ``high_priority`` policy leaves out
  (:class:`gpuslice.kube.resources.HighPriorityNamespaces`) with 403 (the extender's bind refuses it too);
* fills HAMi's default count: a container with GPU memory / cores / memory percent but no GPU count gets
  ``defaultGPUNum`` devices (limits and requests; the memory and cores defaults need no field: the
  extender applies them when it parses the pod's limits, as here); the advertised count (``nvidia.com/gpu``) is added when the count was given only as ``gpuslice.io/gpu``
  (the kubelet asks the device plugin only for the advertised resource);
* returns what HAMi's rules ignore (a priority without a GPU, memory/cores without a count when
  ``defaultGPUNum`` is 0) as admission ``warnings``, which kubectl prints;
* drops any ``gpuslice.io/grant`` / ``gpuslice.io/allocated`` the pod was created with (only the extender
  and the device plugin write those);
* refuses a pod that would step out of its slice: a volume mounted over the enforcer's paths
  (``/etc/ld.so.preload``, ``/etc/gpuslice``, the library, ``/var/run/gpuslice``), or ``LD_PRELOAD``,
  ``LD_AUDIT`` or a device-plugin ``GPUSLICE_*`` variable in its spec (:mod:`gpuslice.kube.escapes`);
* judges ephemeral containers (``kubectl debug``: an UPDATE of the ``pods/ephemeralcontainers``
  subresource, which the chart's webhook rules include) by the same two checks, and patches nothing there.

It writes no normalised request: the extender parses every pod from its resource limits, which are
immutable and are what the kubelet allocates by (an annotation could say something else, and a pod
admitted while the webhook was down would have none).

Contradictory requests are refused with ``allowed: false`` and a message naming the field. A payload that
is not an AdmissionReview is answered with HTTP 400 by the server (:mod:`gpuslice.kube.server`).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Mapping

from gpuslice.spec.errors import GpusliceError
from gpuslice.kube import escapes, formats, hami, podrequest, resources
from gpuslice.spec import SpecError

ADMISSION_VERSION = "admission.k8s.io/v1"
MAX_WARNING = 256  # characters per warning; the API server shortens longer ones anyway


class BadReview(GpusliceError):
    """Not an AdmissionReview we can answer (HTTP 400)."""


def _escape(key: str) -> str:
    """JSON Pointer escaping (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _review(uid: str, allowed: bool, patch: list[dict[str, Any]] | None = None, message: str = "",
            code: int = 422, warnings: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if warnings:  # shown by kubectl as "Warning: ..." (AdmissionResponse.warnings)
        response["warnings"] = [w[:MAX_WARNING] for w in warnings]
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if not allowed:
        reason = {422: "Invalid", 403: "Forbidden"}.get(code, "BadRequest")
        response["status"] = {"code": code, "message": message, "reason": reason}
    return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}


def parse_review(body: Any) -> tuple[str, Mapping[str, Any]]:
    """(request uid, request) of an AdmissionReview, or :class:`BadReview` saying what is wrong."""
    if not isinstance(body, dict):
        raise BadReview("the body must be a JSON AdmissionReview object")
    if body.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview (got {body.get('kind')!r})")
    if body.get("apiVersion") != ADMISSION_VERSION:
        raise BadReview(f"apiVersion must be {ADMISSION_VERSION} (got {body.get('apiVersion')!r})")
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview.request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("AdmissionReview.request.uid must be a non-empty string")
    return uid, request


QuotaCheck = Callable[[str, Mapping[str, Any], podrequest.PodRequest], str]


def mutate(body: Any, cfg: resources.KubeConfig, quota: QuotaCheck | None = None) -> dict[str, Any]:
    """Answer one AdmissionReview. Raises :class:`BadReview` for malformed payloads (HTTP 400). ``quota``
    (namespace, pod, request) says why the pod would pass its namespace's GPU quota ('' when it does not)."""
    uid, request = parse_review(body)
    kind = request.get("kind") or {}
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or kind.get("group", "") != "":
        return _review(uid, True)  # not ours: let it through untouched
    operation = request.get("operation", "CREATE")
    if operation == "UPDATE" and request.get("subResource") == "ephemeralcontainers":
        return _ephemeral(uid, request, cfg)
    if operation != "CREATE":
        return _review(uid, True)
    pod = _pod_of(request)
    namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default")
    try:
        req = podrequest.pod_request(pod, cfg, namespace)
    except resources.PriorityRefused as exc:
        return _review(uid, False, message=f"gpuslice: {exc}", code=403)
    except SpecError as exc:
        return _review(uid, False, message=f"gpuslice: {exc}")
    device_env = escapes.device_env_problem(pod)  # in every pod: it would reach GPUs without a slice
    if device_env:
        return _review(uid, False, message=f"gpuslice: {device_env}")
    if req.empty:
        return _review(uid, True, warnings=req.notes)
    escape = escapes.escape_problem(pod)  # mounts over the enforcer's paths, LD_PRELOAD, GPUSLICE_*
    if escape:
        return _review(uid, False, message=f"gpuslice: {escape}")
    spec = pod["spec"]
    named = spec.get("schedulerName") or ""
    if named and named != cfg.scheduler_name and named not in cfg.adopt_schedulers:
        # HAMi leaves a pod that names another scheduler to it; so do we (only the forged marks go).
        return _review(uid, True, _forged(pod), warnings=(*req.notes, (
            f"spec.schedulerName {named!r} is kept (gpuslice takes over pods of {', '.join(cfg.adopt_schedulers)}); "
            f"gpuslice's device plugin allocates {cfg.names.advertised} only to pods {cfg.scheduler_name} placed")))
    if spec.get("nodeName"):
        return _review(uid, False, message=(
            f"gpuslice: spec.nodeName {spec['nodeName']!r} is not allowed on a pod asking for GPU slices; "
            f"expected no nodeName (the {cfg.scheduler_name} scheduler must place it so that its grant is recorded)"))
    if quota is not None:
        why = quota(namespace, pod, req)
        if why:
            return _review(uid, False, message=f"gpuslice: {why}", code=403)
    patch: list[dict[str, Any]] = []
    if spec.get("schedulerName") != cfg.scheduler_name:
        op = "replace" if "schedulerName" in spec else "add"
        patch.append({"op": op, "path": "/spec/schedulerName", "value": cfg.scheduler_name})
    notes = list(req.notes)
    patch += _mig_rewrite(pod, req, cfg, notes)
    patch += _count_fill(pod, req, cfg)
    patch += _forged(pod)
    return _review(uid, True, patch, warnings=notes)


def _pod_of(request: Mapping[str, Any]) -> dict[str, Any]:
    """The review's pod, of a shape the checks can read; :class:`BadReview` (HTTP 400) otherwise."""
    pod = request.get("object")
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        raise BadReview("AdmissionReview.request.object must be a Pod with a spec")
    problem = podrequest.pod_shape_problem(pod)
    if problem:
        raise BadReview(f"AdmissionReview.request.object {problem}")
    return pod


def _ephemeral(uid: str, request: Mapping[str, Any], cfg: resources.KubeConfig) -> dict[str, Any]:
    """An UPDATE of the ``pods/ephemeralcontainers`` subresource (``kubectl debug``): the running pod with the
    containers it adds in ``spec.ephemeralContainers``. They ask for no resources and get no slice, but are
    judged as the pod's other containers were at CREATE: ``NVIDIA_VISIBLE_DEVICES`` naming GPUs in any pod, and
    in a pod asking for GPU slices a mount over the enforcer's paths, ``LD_PRELOAD``/``LD_AUDIT`` or a
    device-plugin ``GPUSLICE_*`` variable. Nothing is patched; the pod's request itself was admitted already, so
    one that no longer parses is judged as a GPU pod rather than refused for it."""
    pod = _pod_of(request)
    device_env = escapes.device_env_problem(pod)
    if device_env:
        return _review(uid, False, message=f"gpuslice: {device_env}")
    try:
        gpu = not podrequest.pod_request(pod, cfg).empty
    except SpecError:
        gpu = True
    escape = escapes.escape_problem(pod) if gpu else None
    if escape:
        return _review(uid, False, message=f"gpuslice: {escape}")
    return _review(uid, True)


def _count_fill(pod: Mapping[str, Any], req: podrequest.PodRequest, cfg: resources.KubeConfig) -> list[dict[str, Any]]:
    """Every GPU container must ask for the advertised resource: the kubelet calls the device plugin's
    Allocate only for it. Filled in when missing (HAMi's defaultGPUNum, a count given only as
    gpuslice.io/gpu, or MIG instances asked by nvidia.com/mig-<profile>), in limits and requests alike
    (extended resources need them equal); init containers and sidecars too (HAMi mutates them)."""
    patch: list[dict[str, Any]] = []
    count_name = cfg.names.advertised
    for c in req.containers:
        container = pod["spec"][c.part][c.index]
        res = container.get("resources")
        given = res.get("limits") if isinstance(res, dict) else None
        if isinstance(given, dict) and count_name in given:
            continue
        value = str(c.request.count)
        base = f"/spec/{c.part}/{c.index}/resources"
        if not isinstance(res, dict):
            patch.append({"op": "add", "path": base, "value": {"limits": {count_name: value},
                                                                "requests": {count_name: value}}})
            continue
        for part in ("limits", "requests"):
            if isinstance(res.get(part), dict):
                patch.append({"op": "add", "path": f"{base}/{part}/{_escape(count_name)}", "value": value})
            else:
                patch.append({"op": "add", "path": f"{base}/{part}", "value": {count_name: value}})
    return patch


def _mig_rewrite(pod: Mapping[str, Any], req: podrequest.PodRequest, cfg: resources.KubeConfig,
                 notes: list[str]) -> list[dict[str, Any]]:
    """MIG instances asked by ``nvidia.com/mig-<profile>: N`` (NVIDIA's mixed strategy): no node advertises
    that name under gpuslice, whose device plugin serves MIG instances as devices of the advertised
    resource. The name is removed (``_count_fill`` adds the count) and the profile goes into the pod's
    ``gpuslice.io/mig-profile``, which the extender reads."""
    asked = [c for c in req.containers if c.mig is not None and c.mig.resource]
    if not asked:
        return []
    patch: list[dict[str, Any]] = []
    for c in asked:
        assert c.mig is not None
        res = pod["spec"][c.part][c.index].get("resources") or {}
        for part in ("limits", "requests"):
            if isinstance(res.get(part), dict) and c.mig.resource in res[part]:
                patch.append({"op": "remove",
                              "path": f"/spec/{c.part}/{c.index}/resources/{part}/{_escape(c.mig.resource)}"})
        notes.append(f"spec.{c.part}[{c.index}]({c.name}): {c.mig.resource}: {c.mig.count} is served as "
                     f"{cfg.names.advertised}: {c.mig.count} with {formats.POD_MIG_PROFILE} {c.name}={c.mig.profile}")
    profiles = {c.name: c.mig.profile for c in req.containers if c.mig is not None and c.mig.profile}
    anns = (pod.get("metadata") or {}).get("annotations")
    value = hami.encode_mig_profiles(profiles)
    if not isinstance(anns, dict):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {formats.POD_MIG_PROFILE: value}})
    else:
        op = "replace" if formats.POD_MIG_PROFILE in anns else "add"
        patch.append({"op": op, "path": f"/metadata/annotations/{_escape(formats.POD_MIG_PROFILE)}", "value": value})
    return patch


def _forged(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Removal of grant marks a pod was created with: only the extender and the plugin write these."""
    anns = (pod.get("metadata") or {}).get("annotations")
    return [{"op": "remove", "path": f"/metadata/annotations/{_escape(forged)}"}
            for forged in (formats.POD_GRANT, formats.POD_ALLOCATED) if isinstance(anns, dict) and forged in anns]


def apply_json_patch(doc: Any, patch: list[dict[str, Any]]) -> Any:
    """Apply the add / replace / remove operations this webhook emits (tests and dry runs)."""
    import copy

    doc = copy.deepcopy(doc)
    for op in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(target, list):
                target.insert(int(last), op["value"]) if op["op"] == "add" else target.__setitem__(int(last), op["value"])
            else:
                if op["op"] == "replace" and last not in target:
                    raise KeyError(op["path"])
                target[last] = op["value"]
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc
