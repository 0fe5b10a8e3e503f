"""CDI (Container Device Interface) specs for prepared claims: how the container runtime gives a container its slice.

The kubelet passes the CDI device IDs that ``NodePrepareResources`` returned to the runtime (containerd ≥ 1.7,
CRI-O ≥ 1.23 with CDI on), which finds them in the spec files of its CDI folders (``/var/run/cdi``, ``/etc/cdi``)
and applies their container edits. One spec file per claim, ``<cdi dir>/gpuslice.io-claim_<uid>.json``, kind
``gpuslice.io/claim``, with one CDI device per allocated GPU (``<uid>-<DRA device name>``). The edits are the
device plugin's Allocate answer for the same grant (:meth:`gpuslice.kube.allocator.Allocator.response`), split in
two so that nothing is applied twice:

* the spec's own ``containerEdits`` — applied once to a container that gets any device of the spec, however
  many of them it gets: ``env`` ``NVIDIA_VISIBLE_DEVICES=<UUIDs>`` (the NVIDIA runtime hook gives the container
  those GPUs and the driver's libraries), ``GPUSLICE_SLICE``, ``GPUSLICE_GRANT``; mounts of the slice file, the
  enforcer library and ``/etc/ld.so.preload`` read-only (``ro``), the slice's region folder read-only and its
  region file in it read-write, the slice's device-state folder read-only, all ``nosuid,nodev``;
  ``/dev/nvidiactl`` and ``/dev/nvidia-uvm*``;
* each device's ``containerEdits``, inside the device-state folder (so they come after it): the device's slice
  records folder (``<stem>.slices``, read-only) and in it the claim's own record file (read-write), the device's
  policy roster (``<stem>.policy``, read-only), and its ``/dev/nvidia<minor>``.

Spec version 0.5.0: the oldest with every field used here, so older runtimes read it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from gpuslice.spec import SpecError
from gpuslice.spec.files import write_atomic

CDI_VERSION = "0.5.0"
VENDOR = "gpuslice.io"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def device_name(claim_uid: str, dra_device: str) -> str:
    return f"{claim_uid}-{dra_device}"


def device_id(name: str) -> str:
    """The fully qualified CDI device ID the kubelet hands the runtime (``gpuslice.io/claim=<name>``)."""
    return f"{KIND}={name}"


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    if not _NAME.fullmatch(claim_uid) or len(claim_uid) > 128:
        raise SpecError("claim uid", claim_uid, "a UID of letters, digits, '-', '_', '.' (at most 128)")
    return Path(cdi_dir) / f"{VENDOR}-{CLASS}_{claim_uid}.json"


Answer = Mapping[str, Any]  # an Allocate-style answer: envs (dict), mounts ((container, host, ro) triples), devices


def edits(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if answer.get("envs"):
        out["env"] = [f"{k}={v}" for k, v in answer["envs"].items()]
    if answer.get("mounts"):
        out["mounts"] = [{"hostPath": host, "containerPath": container,
                          "options": ["ro" if ro else "rw", "nosuid", "nodev", "bind"]}
                         for container, host, ro in answer["mounts"]]
    if answer.get("devices"):
        out["deviceNodes"] = [{"path": p, "hostPath": p} for p in answer["devices"]]
    return out


def claim_spec(claim_uid: str, common: Answer, devices: Mapping[str, Answer]) -> dict[str, Any]:
    """The CDI spec of one claim: ``common`` edits once, ``devices``: per CDI device name, its own edits."""
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "containerEdits": edits(common),
            "devices": [{"name": name, "containerEdits": edits(d)} for name, d in devices.items()]}


def write_spec(cdi_dir: Path, claim_uid: str, common: Answer, devices: Mapping[str, Answer]) -> Path:
    """Write (atomically, 0644: the runtime reads it) the claim's spec; returns its path."""
    path = spec_path(cdi_dir, claim_uid)
    for name in devices:
        if not _NAME.fullmatch(name):
            raise SpecError("CDI device name", name, "letters, digits, '-', '_', '.', ':'")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(claim_spec(claim_uid, common, devices), indent=1) + "\n", 0o644)
    return path


def remove_spec(cdi_dir: Path, claim_uid: str) -> bool:
    try:
        os.unlink(spec_path(cdi_dir, claim_uid))
        return True
    except FileNotFoundError:
        return False
