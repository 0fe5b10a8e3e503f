"""Pods that would step out of their slice: the webhook refuses them (issue 15).

The device plugin gives every GPU container the enforcer through a read-only ``/etc/ld.so.preload``, the
library at its fixed path, the slice file read-only at ``/etc/gpuslice/slice`` and the slice's region and
slice records under ``/var/run/gpuslice``. A container that mounts a volume of its own over any of these
paths, or sets ``LD_PRELOAD``/``LD_AUDIT`` (loaded before ``/etc/ld.so.preload``: a library there can
answer the driver calls first) or a ``GPUSLICE_*`` variable that is the device plugin's to set
(``GPUSLICE_SLICE``, ``GPUSLICE_GRANT``, …) in its spec, is trying to leave or to loosen its slice; its pod is
refused with a message naming the container and the field. Init, app and ephemeral containers (``kubectl
debug`` adds those to a running pod; the webhook reviews that update too) are judged alike. The variables a tenant may set because they can
only tighten its own slice (``GPUSLICE_MEMORY_LIMIT``, ``GPUSLICE_COMPUTE``, ``GPUSLICE_FAIL_OPEN``,
``GPUSLICE_LOG_LEVEL``; ``native/README.md``) stay allowed, and so does ``GPUSLICE_SPATIAL_YIELD`` (the spatial
yield gate, ``native/include/gpuslice/mps.h``: a trainer that sets it holds only itself, a server that sets it
makes only neighbours that set it too hold).

Any pod that sets ``NVIDIA_VISIBLE_DEVICES`` to GPUs is refused as well (:func:`device_env_problem`), and
the device plugin's Allocate runs both checks again for the container it gives a slice (the webhook fails
open).

What this cannot see (``README.md`` Limits): variables a program sets for its own children, the image's own
``ENV`` (in the image config, not the pod), and the keys an ``envFrom`` ConfigMap or Secret brings (they are
not in the pod, and may change after admission). An ``envFrom`` whose ``prefix`` would turn a key into one of
the refused names (``LD_``, ``GPUSLICE_``, or a beginning of them) is refused; an empty prefix cannot be judged.
The out-of-process backstop (:mod:`gpuslice.host.backstop`) holds the memory limit against all of these.
"""

from __future__ import annotations

import posixpath
from typing import Any, Callable, Iterable, Mapping

# The container paths the device plugin mounts (gpuslice.kube.allocator), and /run/gpuslice, which is the
# same folder wherever the image links /var/run to /run.
PROTECTED_PATHS = ("/etc/ld.so.preload", "/etc/gpuslice", "/usr/local/gpuslice", "/var/run/gpuslice",
                   "/run/gpuslice")
FORBIDDEN_ENV = ("LD_PRELOAD", "LD_AUDIT")
FORBIDDEN_ENV_PREFIX = "GPUSLICE_"
# lower only; GPUSLICE_SPATIAL_YIELD holds only the process that sets it, or (a server) only neighbours that set it too
TENANT_ENV = ("GPUSLICE_MEMORY_LIMIT", "GPUSLICE_COMPUTE", "GPUSLICE_FAIL_OPEN", "GPUSLICE_LOG_LEVEL",
              "GPUSLICE_SPATIAL_YIELD")
# ephemeralContainers: added to a running pod through the pods/ephemeralcontainers subresource (kubectl debug),
# which the webhook reviews too (deploy/helm/gpuslice/templates/mutatingwebhook.yaml)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
# The NVIDIA container toolkit gives a container the GPUs this variable names, and the kubelet puts the pod's
# own env after the device plugin's: a pod that sets it reaches GPUs no slice of its holds, unenforced, even
# without asking for a GPU (attacker's review of issue 15). Only the values that ask for none stay allowed.
DEVICE_ENV = "NVIDIA_VISIBLE_DEVICES"
DEVICE_ENV_NONE = ("", "none", "void")


def _covers(mount_path: str) -> str | None:
    """The protected path that ``mount_path`` is, or lies under; None if it touches none."""
    path = posixpath.normpath("/" + mount_path.strip().lstrip("/"))
    for protected in PROTECTED_PATHS:
        if path == protected or path.startswith(protected + "/"):
            return protected
    return None


def _containers(spec: Mapping[str, Any]) -> Iterable[tuple[str, int, Mapping[str, Any]]]:
    for kind in CONTAINER_LISTS:
        items = spec.get(kind) or []
        if isinstance(items, list):
            for i, c in enumerate(items):
                if isinstance(c, dict):
                    yield kind, i, c


def escape_problem(pod: Mapping[str, Any], only: Callable[[Mapping[str, Any]], bool] | None = None) -> str | None:
    """Why ``pod`` would step out of its slice (naming the container and the field), or None. ``only``: check
    just the containers it accepts (those that get the slice)."""
    spec = pod.get("spec") or {}
    for kind, i, c in _containers(spec):
        if only is not None and not only(c):
            continue
        where = f"spec.{kind}[{i}] ({c.get('name', '?')})"
        for m, mount in enumerate(c.get("volumeMounts") or []):
            path = mount.get("mountPath", "") if isinstance(mount, dict) else ""
            hit = _covers(str(path)) if path else None
            if hit:
                return (f"{where}.volumeMounts[{m}].mountPath {path!r} is not allowed: it covers {hit}, where the "
                        "node agent mounts the enforcer and the slice of every GPU container")
        for d, device in enumerate(c.get("volumeDevices") or []):
            path = device.get("devicePath", "") if isinstance(device, dict) else ""
            hit = _covers(str(path)) if path else None
            if hit:
                return f"{where}.volumeDevices[{d}].devicePath {path!r} is not allowed: it covers {hit}"
        problem = _env_from_problem(where, c)
        if problem:
            return problem
        for e, var in enumerate(c.get("env") or []):
            name = var.get("name", "") if isinstance(var, dict) else ""
            if isinstance(name, str) and (name in FORBIDDEN_ENV or (name.startswith(FORBIDDEN_ENV_PREFIX)
                                                                     and name not in TENANT_ENV)):
                return (f"{where}.env[{e}].name {name!r} is not allowed in a pod asking for GPU slices: "
                        f"{', '.join(FORBIDDEN_ENV)} and {FORBIDDEN_ENV_PREFIX}* are the node agent's to set "
                        f"(allowed, as they only lower a limit or hold the process itself: {', '.join(TENANT_ENV)})")
    return None


def _env_from_problem(where: str, container: Mapping[str, Any]) -> str | None:
    """An ``envFrom`` prefix that makes some key a refused name (``LD_`` + ``PRELOAD``, ``GPUSLICE_`` + …)."""
    for f, source in enumerate(container.get("envFrom") or []):
        prefix = source.get("prefix", "") if isinstance(source, dict) else ""
        if not isinstance(prefix, str) or not prefix:
            continue
        if any(name.startswith(prefix) or prefix.startswith(name) for name in FORBIDDEN_ENV) or \
                prefix.startswith(FORBIDDEN_ENV_PREFIX) or FORBIDDEN_ENV_PREFIX.startswith(prefix):
            return (f"{where}.envFrom[{f}].prefix {prefix!r} is not allowed in a pod asking for GPU slices: with it a "
                    f"key could become {', '.join(FORBIDDEN_ENV)} or {FORBIDDEN_ENV_PREFIX}*, the node agent's to set")
    return None


def device_env_problem(pod: Mapping[str, Any]) -> str | None:
    """Why ``pod`` would reach GPUs around the device plugin (NVIDIA_VISIBLE_DEVICES naming devices, in any
    container, GPU request or not), or None."""
    for kind, i, c in _containers(pod.get("spec") or {}):
        for e, var in enumerate(c.get("env") or []):
            if not isinstance(var, dict) or var.get("name") != DEVICE_ENV:
                continue
            value = var.get("value")
            if "valueFrom" in var or not isinstance(value, (str, type(None))) or (value or "").strip().lower() \
                    not in DEVICE_ENV_NONE:
                return (f"spec.{kind}[{i}] ({c.get('name', '?')}).env[{e}] {DEVICE_ENV} is not allowed except "
                        f"{' or '.join(repr(v) for v in DEVICE_ENV_NONE if v)}: GPUs come from the device plugin, "
                        "held to the pod's slices")
    return None


def claim_escape_problem(pod: Mapping[str, Any], claim_name: str) -> str | None:
    """:func:`escape_problem` for the containers of ``pod`` that get the ResourceClaim named ``claim_name`` (DRA:
    no webhook sees these pods, so the driver checks them when the kubelet prepares the claim). A container gets
    a claim through ``resources.claims[].name``, naming an entry of ``spec.resourceClaims`` that is the claim
    itself (``resourceClaimName``) or a template the claim was made from (``status.resourceClaimStatuses``)."""
    from gpuslice.kube.dra.claims import containers_with_claim

    users = containers_with_claim(pod, claim_name)
    problem = escape_problem(pod, lambda c: c.get("name") in users)
    if problem is None:
        return None
    meta = pod.get("metadata") or {}
    return f"pod {meta.get('namespace', '?')}/{meta.get('name', '?')}: {problem}"
