"""What ``NodePrepareResources`` and ``NodeUnprepareResources`` do, behind the gRPC server (:mod:`.plugin`).

Prepare, per claim (the kubelet names namespace, name and UID; each claim is answered on its own — one claim's
failure is its own error string, the others are prepared):

1. a claim in the checkpoint is answered from it (its files written again, the same answer as before);
2. else the claim is read from the API server (its UID must be the one the kubelet named: a recreated claim is
   refused), its allocation for this node's pool read (:func:`~.claims.read_allocation`) and turned into a grant
   (:func:`~.claims.claim_grant`);
3. the grant's files are written exactly as the device plugin writes them for a container
   (:class:`gpuslice.kube.allocator.Allocator`: the slice file through ``gpuslice.enforcer.slicefile.slice_config``,
   the region and device-state folders, the slice's record file and roster entry on each device,
   ``ld.so.preload``), then its CDI spec (:mod:`.cdi`);
4. the claim is recorded in the checkpoint; the answer names, per allocated device, its request, pool, device,
   share ID and CDI device.

Unprepare removes the claim's CDI spec, its roster entries and slice record files, its slice folder
(``<state>/kube/grants/dra-<uid>``) and region folder, then its checkpoint record — everything is named by the claim UID, so it works for claims the checkpoint does not
know (an unknown claim is already unprepared: success). Both are idempotent; calls for one claim are serialised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from gpuslice.enforcer.policy import remove_policies
from gpuslice.enforcer.slicerecords import remove_records
from gpuslice.enforcer.slicefile import SliceFileError
from gpuslice.kube import escapes, formats
from gpuslice.kube.allocator import CONTROL_DEVICES, Allocator, PluginConfig
from gpuslice.kube.api import KubeError, NotFound
from gpuslice.kube.dra import cdi
from gpuslice.kube.dra.api import DraAPI
from gpuslice.kube.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from gpuslice.kube.dra.claims import ClaimAllocation, claim_grant, grant_id, read_allocation
from gpuslice.kube.dra.resourceslice import DRIVER, Sharing, device_name, slice_devices
from gpuslice.kube.resources import HighPriorityNamespaces
from gpuslice.spec import ComputeMode, Device, Grant, GpusliceError, SpecError
from gpuslice.spec.files import LEFT, remove_tree

log = logging.getLogger("gpuslice.dra")

PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER
REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
CDI_DIR = Path("/var/run/cdi")


@dataclass(frozen=True)
class DraConfig:
    """The DRA side of ``gpuslice kube-agent --dra``. ``files`` holds what the device plugin also uses: the state
    folders (host and local view), the enforcer library, device nodes and the enforcer settings of slice files."""

    node: str
    sharing: Sharing = field(default_factory=Sharing)
    files: PluginConfig | None = None
    plugin_dir: Path = PLUGIN_DIR          # our DRA service socket: <plugin_dir>/dra.sock
    registry_dir: Path = REGISTRY_DIR      # the kubelet's plugin watcher: <registry_dir>/gpuslice.io-reg.sock
    cdi_dir: Path = CDI_DIR
    default_mode: ComputeMode = ComputeMode.HARD
    watch_interval: float = 1.0
    high_priority: HighPriorityNamespaces = field(default_factory=HighPriorityNamespaces)  # who may set priority high

    def __post_init__(self) -> None:
        if not self.node:
            raise SpecError("node", self.node, "the node's name")
        if self.files is None:
            object.__setattr__(self, "files", PluginConfig(node=self.node, split_count=self.sharing.split_count,
                                                           memory_scaling=self.sharing.memory_scaling))

    @property
    def file_config(self) -> PluginConfig:
        assert self.files is not None
        return self.files

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_path(self) -> Path:
        return self.registry_dir / f"{DRIVER}-reg.sock"

    @property
    def checkpoint_path(self) -> Path:
        return self.file_config.local_state / "kube" / "dra" / "checkpoint.json"


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet names: the claim's namespace, UID and name."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class Prepared:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class DraDriver:
    """Prepare / unprepare on plain data; the gRPC server turns kubelet messages into calls of these."""

    def __init__(self, api: DraAPI, cfg: DraConfig, devices: Callable[[], Sequence[Device]]):
        self.api = api
        self.cfg = cfg
        self.devices = devices
        self.files = Allocator(None, cfg.file_config, devices)  # type: ignore[arg-type]  # files only: no API use
        self.checkpoint = Checkpoint(cfg.checkpoint_path, cfg.node)
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)

    def _lock(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks[uid]

    # ------------------------------------------------------------------------------------ prepare
    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared]:
        return {c.uid: self._answer(c, self.prepare_one) for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return {c.uid: self._answer(c, self.unprepare_one).error for c in claims}

    def _answer(self, claim: ClaimRef, work: Callable[[ClaimRef], Prepared]) -> Prepared:
        try:
            return work(claim)
        except (GpusliceError, SpecError, KubeError, SliceFileError, OSError) as exc:
            log.error("%s %s/%s (%s): %s", work.__name__, claim.namespace, claim.name, claim.uid, exc)
            return Prepared(error=f"gpuslice: {exc}")
        except Exception as exc:  # a bug must still answer the kubelet with a reason, for this claim only
            log.exception("%s %s/%s (%s)", work.__name__, claim.namespace, claim.name, claim.uid)
            return Prepared(error=f"gpuslice: internal error {type(exc).__name__}: {exc}")

    def prepare_one(self, ref: ClaimRef) -> Prepared:
        if not ref.uid or not ref.name or not ref.namespace:
            raise SpecError("claim", f"{ref.namespace}/{ref.name} ({ref.uid})", "namespace, name and uid")
        with self._lock(ref.uid):
            known = self.checkpoint.get(ref.uid)
            if known is not None:  # answered from the checkpoint (a restart needs no API server)
                self._check_new_consumers(ref, known)
                self._write(known.uid, known.grant, [d.device for d in known.devices])
                return Prepared(known.devices)
            alloc = read_allocation(self._claim(ref), pool=self.cfg.node)
            self._check_pods(alloc.namespace, alloc.name, alloc.pods)
            grant = claim_grant(alloc, self.by_name(), self.cfg.sharing, self.cfg.default_mode, self.cfg.high_priority)
            devices = self.prepared_devices(alloc)
            self._write(alloc.uid, grant, [d.device for d in devices])
            record = PreparedClaim(alloc.uid, alloc.namespace, alloc.name, grant, devices, time.time(), alloc.pods)
            self.checkpoint.put(record)
            log.info("prepared claim %s/%s (%s): grant %s on %s", alloc.namespace, alloc.name, alloc.uid,
                     grant.grant_id, ", ".join(grant.uuids))
            return Prepared(devices)

    def _check_new_consumers(self, ref: ClaimRef, known: PreparedClaim) -> None:
        """A claim prepared before, prepared again: the pods it is reserved for now that it was not prepared for
        (a pod that shares the claim by name) are checked as the first ones were (issue 15, attacker's review:
        they were not). Without an API server (a kubelet restart during an outage) or once the claim is gone,
        the checkpoint's answer stands."""
        try:
            alloc = read_allocation(self._claim(ref), pool=self.cfg.node)
        except (KubeError, SpecError) as exc:
            log.warning("claim %s/%s (%s) prepared again; its pods cannot be read now (%s): answered from the "
                        "checkpoint", ref.namespace, ref.name, ref.uid, exc)
            return
        new = [p for p in alloc.pods if p not in known.pods]
        if not new:
            return
        self._check_pods(alloc.namespace, alloc.name, new)
        self.checkpoint.put(replace(known, pods=(*known.pods, *new)))

    def _claim(self, ref: ClaimRef) -> dict[str, Any]:
        claim = self.api.get_resource_claim(ref.namespace, ref.name)
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise SpecError(f"ResourceClaim {ref.namespace}/{ref.name}: metadata.uid", uid,
                            f"{ref.uid}, the claim the kubelet prepares (it was deleted and created again)")
        return claim

    def _check_pods(self, namespace: str, claim_name: str, pods: Sequence[str]) -> None:
        """Refuse to prepare a claim for a pod whose containers that get it would step out of their slice
        (a mount over the enforcer's paths, LD_PRELOAD/LD_AUDIT, a GPUSLICE_* variable: :mod:`..escapes`). No
        webhook sees DRA pods; the kubelet shows the refusal as the pod's FailedPrepareDynamicResources event
        and starts none of its containers. A pod already gone is skipped; any other read error refuses too.
        Checked when the claim is first prepared on the node, and for each pod it is reserved for later
        (:meth:`_check_new_consumers`)."""
        for pod_name in pods:
            try:
                pod = self.api.get_pod(namespace, pod_name)
            except NotFound:
                continue
            problem = escapes.claim_escape_problem(pod, claim_name)
            if problem:
                raise SpecError(f"pod {namespace}/{pod_name}", "its spec", f"a pod that stays in its slice: {problem}")

    def by_name(self) -> dict[str, Any]:
        return {d.name: d for d in slice_devices(self.devices())}

    @staticmethod
    def prepared_devices(alloc: ClaimAllocation) -> tuple[PreparedDevice, ...]:
        return tuple(PreparedDevice(requests=(d.request,), pool=d.pool, device=d.device, share_id=d.share_id,
                                    cdi=(cdi.device_id(cdi.device_name(alloc.uid, d.device)),))
                     for d in alloc.devices)

    def _write(self, uid: str, grant: Grant, devices: Sequence[str]) -> None:
        """The grant's files and its CDI spec (the same files every time: prepare is idempotent)."""
        cg = formats.ContainerGrant(container=f"claim-{uid}", grant=grant)
        self.files.write_files(cg)
        answer = self.files.response(cg)
        uuids = {device_name(u): u for u in grant.uuids}  # DRA names derive from UUIDs (a lost GPU too)
        per_device: dict[str, dict[str, Any]] = {}
        moved: set[tuple[str, str, bool]] = set()
        host_devices = self.files.paths(grant.grant_id, local=False)["devices"]
        for name in dict.fromkeys(devices):  # a device allocated twice to the claim is one CDI device
            uuid = uuids.get(name)
            if uuid is None:
                raise SpecError("device", name, f"a device of grant {grant.grant_id} ({', '.join(grant.uuids)})")
            one = formats.ContainerGrant(container=cg.container,
                                         grant=Grant(grant.grant_id, tuple(s for s in grant.slices if s.device_uuid == uuid)))
            pacing = {m for stem in self.files.device_stems(one)
                      for m in self.files.device_mounts(grant.grant_id, stem, host_devices)}
            mounts = [m for m in answer["mounts"] if m in pacing]  # in the answer's order: parents first
            moved.update(mounts)
            nodes = [n for n in self.files.device_nodes(one) if n not in CONTROL_DEVICES]
            per_device[cdi.device_name(uid, name)] = {"mounts": mounts, "devices": nodes}
        gpu_nodes = {n for d in per_device.values() for n in d["devices"]}
        common = {"envs": answer["envs"], "mounts": [m for m in answer["mounts"] if m not in moved],
                  "devices": [n for n in answer["devices"] if n not in gpu_nodes]}
        cdi.write_spec(self.cfg.cdi_dir, uid, common, per_device)

    # ------------------------------------------------------------------------------------ unprepare
    def unprepare_one(self, ref: ClaimRef) -> Prepared:
        if not ref.uid:
            raise SpecError("claim.uid", ref.uid, "the claim's UID")
        with self._lock(ref.uid):
            cdi.remove_spec(self.cfg.cdi_dir, ref.uid)
            paths = self.files.paths(grant_id(ref.uid), local=True)
            remove_policies(paths["devices"], grant_id(ref.uid))
            remove_records(paths["devices"], grant_id(ref.uid))
            for folder in (paths["slice"].parent, paths["region"]):
                # moved aside at once (into .left beside it: the same file system, a name no listing takes for a
                # grant) and deleted in the background, never through a link inside, so nothing in the folder can
                # fail or stall the unprepare (rmtree raised RecursionError on a tree too deep for it; the
                # container's mount of the folder is read-only, so only the node could have put one there)
                if not remove_tree(folder, folder.parent / LEFT):  # kept: the kubelet asks again
                    raise GpusliceError(f"claim {ref.uid}: {folder} could not be removed (the node's log says why)")
            if self.checkpoint.drop(ref.uid):
                log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
        with self._guard:
            self._locks.pop(ref.uid, None)
        return Prepared()
