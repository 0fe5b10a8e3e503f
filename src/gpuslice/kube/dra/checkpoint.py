"""The DRA driver's checkpoint: which claims this node prepared, and what the kubelet was told.

The kubelet calls ``NodePrepareResources`` again for claims it already prepared (after its own restart, for every
pod that still runs) and may call it while the agent restarts; the answer must be the same every time, whatever
happened to the agent in between, without re-reading what the API server may have changed meanwhile. So every
prepared claim is recorded here (after its files are written, before the answer goes out), and a claim found here
is answered from the record (its files written again if something removed them — ``/var/run/cdi`` is a tmpfs).
Unprepare removes the files first, then the record: a crash between leaves a record whose files are gone, which
the next unprepare (the kubelet retries) removes.

File: ``<state>/kube/dra/checkpoint.json`` (mode 0600, replaced atomically), JSON::

    {"version": 1, "node": "n1",
     "claims": {"<claim uid>": {"namespace": "ml", "name": "train-gpu", "preparedAt": 1795366801.2,
                                "pods": ["train-0"],
                                "grant": <gpuslice.spec.codec grant>,
                                "devices": [{"requests": ["gpu"], "pool": "n1", "device": "gpu-…",
                                             "shareID": "…", "cdi": ["gpuslice.io/claim=<claim uid>"]}]}}}

A checkpoint that cannot be read (another version, a damaged file) is moved aside to ``checkpoint.json.bad-<time>``
and the driver starts empty, logging it: unprepare needs nothing from it (every path derives from the claim UID),
and a claim prepared again is prepared from its allocation.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gpuslice.spec import Grant, SpecError, grant_from_json, grant_to_json
from gpuslice.spec.files import write_atomic

log = logging.getLogger("gpuslice.dra")
VERSION = 1
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class PreparedDevice:
    """One ``Device`` of the kubelet's ``NodePrepareResourceResponse``."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi: tuple[str, ...]
    share_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"requests": list(self.requests), "pool": self.pool, "device": self.device,
                "shareID": self.share_id, "cdi": list(self.cdi)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "PreparedDevice":
        if not isinstance(data, dict):
            raise SpecError(where, data, "an object")
        lists = {k: data.get(k) for k in ("requests", "cdi")}
        texts = {k: data.get(k) for k in ("pool", "device", "shareID")}
        for k, v in lists.items():
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise SpecError(f"{where}.{k}", v, "a list of strings")
        for k, v in texts.items():
            if not isinstance(v, str):
                raise SpecError(f"{where}.{k}", v, "a string")
        return cls(tuple(lists["requests"]), texts["pool"], texts["device"], tuple(lists["cdi"]), texts["shareID"])


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    grant: Grant
    devices: tuple[PreparedDevice, ...]
    prepared_at: float = field(default=0.0, compare=False)
    pods: tuple[str, ...] = ()  # the pods the claim was reserved for when it was prepared (metrics labels)

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "preparedAt": round(self.prepared_at, 3),
                "pods": list(self.pods), "grant": grant_to_json(self.grant),
                "devices": [d.to_json() for d in self.devices]}

    @classmethod
    def from_json(cls, uid: str, data: Any, where: str) -> "PreparedClaim":
        if not isinstance(data, dict):
            raise SpecError(where, data, "an object")
        for k in ("namespace", "name"):
            if not isinstance(data.get(k), str) or not data[k]:
                raise SpecError(f"{where}.{k}", data.get(k), "a non-empty string")
        devices = data.get("devices")
        if not isinstance(devices, list):
            raise SpecError(f"{where}.devices", devices, "a list")
        at = data.get("preparedAt", 0.0)
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise SpecError(f"{where}.preparedAt", at, "unix seconds")
        pods = data.get("pods", [])
        if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
            raise SpecError(f"{where}.pods", pods, "a list of pod names")
        return cls(uid, data["namespace"], data["name"], grant_from_json(data.get("grant"), f"{where}.grant"),
                   tuple(PreparedDevice.from_json(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)),
                   float(at), tuple(pods))


class Checkpoint:
    """The prepared claims of one node, in memory and in ``path``; every change is written before it returns."""

    def __init__(self, path: Path, node: str):
        self.path = Path(path)
        self.node = node
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            if len(raw) > MAX_BYTES:
                raise SpecError("checkpoint", f"{len(raw)} bytes", f"at most {MAX_BYTES} bytes")
            return self.parse(json.loads(raw))
        except (ValueError, SpecError) as exc:
            aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
            os.replace(self.path, aside)
            log.error("DRA checkpoint %s cannot be read (%s); moved to %s, starting with no prepared claims "
                      "(unprepare does not need it; a claim prepared again is prepared from its allocation)",
                      self.path, exc, aside)
            return {}

    def parse(self, data: Any) -> dict[str, PreparedClaim]:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise SpecError("checkpoint.version", data.get("version") if isinstance(data, dict) else data,
                            f"{VERSION}")
        if data.get("node") != self.node:
            raise SpecError("checkpoint.node", data.get("node"), f"this node ({self.node})")
        claims = data.get("claims")
        if not isinstance(claims, dict):
            raise SpecError("checkpoint.claims", claims, "an object of claim UIDs")
        return {uid: PreparedClaim.from_json(uid, c, f"checkpoint.claims[{uid}]") for uid, c in claims.items()}

    def _save(self, claims: Mapping[str, PreparedClaim]) -> None:
        doc = {"version": VERSION, "node": self.node,
               "claims": {uid: c.to_json() for uid, c in sorted(claims.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(doc, separators=(",", ":")), 0o600)

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def claims(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            claims = {**self._claims, claim.uid: claim}
            self._save(claims)
            self._claims = claims

    def drop(self, uid: str) -> bool:
        with self._lock:
            if uid not in self._claims:
                return False
            claims = {k: v for k, v in self._claims.items() if k != uid}
            self._save(claims)
            self._claims = claims
            return True
