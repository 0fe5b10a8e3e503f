"""Allocate's resource manager behind the device plugin's gRPC server: which grant an Allocate call is
for, the files it needs on the host, and the answer for the kubelet.

Finding the grant: the kubelet names device IDs only, never the pod. Candidates are the pending pods
bound to this node whose ledger entry (the Node's ``gpuslice.io/ledger``, written only by the extender)
has a container not yet marked in the pod's ``gpuslice.io/allocated``, whose device count equals the
number of IDs asked for. The candidates must all belong to **one** pod: the extender's allocation lock
(:mod:`gpuslice.kube.alloclock`) binds at most one pod per device count at a time on a node, and if two
pods wait anyway (the lock timed out or is off) Allocate refuses rather than guess — handing one pod
another's grant would over-commit the device once either ends. Within the pod, the kubelet allocates
containers in spec order: the container whose granted UUIDs equal the IDs' UUIDs (GetPreferredAllocation
steers to them), else the first in spec order. Once every container of the pod is allocated, the pod is
removed from the Node's ``gpuslice.io/allocating`` (the lock is released). Init containers and sidecars come
first, in spec order, as the kubelet allocates them (an app container may be handed an init container's
device IDs again — the kubelet reuses them — which is why the order, not the IDs, decides). The ledger is
the truth; a pod annotation that disagrees is ignored and logged.

A spatial container (``engine: spatial``) is a client of its device's MPS control daemon, which Allocate
starts on first use (:class:`gpuslice.host.mpsfleet.MpsDaemons` under ``<state>/kube/mps``; one per device and
user — the container's ``runAsUser``, else the agent's own) and mounts: the daemon's pipe directory at
``/var/run/gpuslice/mps`` (``CUDA_MPS_PIPE_DIRECTORY``, also written into the slice file) and its shared-memory
folder at ``/dev/shm`` (MPS clients and server talk through /dev/shm). :class:`gpuslice.kube.mpsnode.MpsNode`
stops a daemon once no spatial container of the node ledger needs it.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from gpuslice.enforcer.devstate import RECORDS_SUFFIX, device_stem
from gpuslice.enforcer.region import create_region
from gpuslice.enforcer.slicefile import SliceConfig, slice_config, write_slice_file
from gpuslice.host.mps import MpsError, client_env
from gpuslice.host.mpsfleet import DaemonKey, MpsDaemons
from gpuslice.kube import escapes, formats
from gpuslice.kube.api import Conflict, KubeAPI, KubeError, update_node_annotations
from gpuslice.spec import Device, Engine, GpusliceError, Slice, SpecError
from gpuslice.enforcer.policy import (MAX_GRANTS_PER_DEVICE, SUFFIX as POLICY_SUFFIX, RosterChanges, reconcile_policies,
                                      write_policies)
from gpuslice.enforcer.slicerecords import SHARED_MODE, prune_records, write_records
from gpuslice.spec.files import LEFT, remove_tree, write_atomic

log = logging.getLogger("gpuslice.deviceplugin")


API_VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
ID_SEP = "::"

# Container-side paths (the slice file names them, so they are fixed for every pod).
CONTAINER_SLICE = "/etc/gpuslice/slice"
CONTAINER_REGION_DIR = "/var/run/gpuslice/region"
CONTAINER_DEVICE_STATE = "/var/run/gpuslice/devices"
CONTAINER_LIB = "/usr/local/gpuslice/lib/libgpuslice.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_MPS_PIPE = "/var/run/gpuslice/mps"
CONTAINER_SHM = "/dev/shm"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class AllocateError(GpusliceError):
    """Allocate cannot answer (no grant found, unreadable ledger); the kubelet fails the pod with this."""


# ---------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class PluginConfig:
    node: str
    resource_name: str = "nvidia.com/gpu"
    split_count: int = 10
    memory_scaling: float = 1.0
    plugin_dir: Path = DEVICE_PLUGIN_PATH
    socket_name: str = "gpuslice.sock"
    host_state_dir: Path = Path("/var/lib/gpuslice")  # as the host sees it (the kubelet mounts host paths)
    local_state_dir: Path | None = None               # where this process sees it (defaults to the same)
    host_library: Path = Path("/usr/local/gpuslice/lib/libgpuslice.so")
    device_nodes: str = "auto"                        # auto: the ones that exist; always; none
    dev_root: Path = Path("/")
    oom_policy: str = "return"
    oom_wait_ms: int = 30000                          # oom_policy=wait: how long an allocation waits for the device
    log_level: str = "warn"                           # the enforcer's: error, warn, info, debug
    fail_open: bool = False
    watch_interval: float = 1.0                       # how often the kubelet socket is checked
    mps_control: Path | None = None                   # nvidia-cuda-mps-control (None: found on PATH when needed)
    # Each MPS daemon gets a /dev/shm of its own (a private mount namespace; the agent is privileged), which
    # its client containers get at /dev/shm. Off: the daemons share this process's /dev/shm (tests).
    mps_private_shm: bool = True

    def __post_init__(self) -> None:
        if self.device_nodes not in ("auto", "always", "none"):
            raise SpecError("device_nodes", self.device_nodes, "auto, always or none")
        if self.oom_policy not in ("return", "kill", "wait"):
            raise SpecError("oom_policy", self.oom_policy, "return, kill or wait")
        if isinstance(self.oom_wait_ms, bool) or not isinstance(self.oom_wait_ms, int) \
                or not 0 <= self.oom_wait_ms <= 86_400_000:
            raise SpecError("oom_wait_ms", self.oom_wait_ms, "milliseconds from 0 to 86400000")
        if self.log_level not in ("error", "warn", "info", "debug"):
            raise SpecError("log_level", self.log_level, "error, warn, info or debug (the enforcer's)")
        if not isinstance(self.fail_open, bool):
            raise SpecError("fail_open", self.fail_open, "true or false")
        if not 1 <= self.split_count <= MAX_GRANTS_PER_DEVICE:
            raise SpecError("split_count", self.split_count, f"a whole number from 1 to {MAX_GRANTS_PER_DEVICE} (the "
                                                             "grants a pacer lists per device: policy.h GS_POL_MAX)")

    @property
    def local_state(self) -> Path:
        return self.local_state_dir or self.host_state_dir

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET


def device_id(uuid: str, k: int) -> str:
    return f"{uuid}{ID_SEP}{k}"


def uuid_of(device_id_: str) -> str:
    return device_id_.split(ID_SEP, 1)[0]


# ---------------------------------------------------------------------------------------- allocation
@dataclass(frozen=True)
class Match:
    pod: dict[str, Any]
    entry: formats.PodGrant
    grant: formats.ContainerGrant


class Allocator:
    """Finds the grant behind an Allocate / GetPreferredAllocation call and prepares its files."""

    def __init__(self, api: KubeAPI, cfg: PluginConfig, devices: Callable[[], Sequence[Device]]):
        self.api = api
        self.cfg = cfg
        self.devices = devices
        self._lock = threading.Lock()
        self.mps = MpsDaemons(cfg.local_state / "kube" / "mps", cfg.mps_control, shm=cfg.mps_private_shm)
        self.mps_started: dict[DaemonKey, float] = {}  # by Allocate: kept even before the ledger shows them

    # ------------------------------------------------------------------------------------ finding
    def candidates(self, count: int) -> list[Match]:
        node = self.api.get_node(self.cfg.node)
        anns = (node.get("metadata") or {}).get("annotations") or {}
        ledger = formats.decode_ledger(anns.get(formats.NODE_LEDGER), self.cfg.node)
        pods = self.api.list_pods(field_selector=f"spec.nodeName={self.cfg.node}")
        out = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            entry = ledger.entries.get(meta.get("uid", ""))
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if entry is None or phase not in ("Pending", "") or meta.get("deletionTimestamp"):
                continue
            pod_anns = meta.get("annotations") or {}
            try:
                done = formats.decode_allocated(pod_anns.get(formats.POD_ALLOCATED))
            except SpecError as exc:
                log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
                done = set()
            if formats.POD_GRANT in pod_anns:
                try:
                    shown = formats.decode_pod_grant(pod_anns[formats.POD_GRANT])
                    if shown.containers != entry.containers:
                        log.warning("pod %s/%s: its %s differs from the node ledger; using the ledger",
                                    meta.get("namespace"), meta.get("name"), formats.POD_GRANT)
                except SpecError as exc:
                    log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
            spec = pod.get("spec") or {}
            # The kubelet allocates init containers (and sidecars) first, in order, then the app containers.
            listed = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
            order = {c.get("name"): i for i, c in enumerate(listed) if isinstance(c, dict)}
            for g in sorted(entry.containers, key=lambda c: order.get(c.container, 1 << 30)):
                if g.container not in done and len(g.slices) == count:
                    out.append(Match(pod, entry, g))
        out.sort(key=lambda m: m.entry.bound_at)  # stable: container order within a pod
        return out

    def find(self, ids: Sequence[str]) -> Match:
        uuids = {uuid_of(i) for i in ids}
        found = self.one_pod(self.candidates(len(ids)), len(ids))
        # After an init container the kubelet hands its device IDs to the app containers again, so the
        # IDs may name another container's devices: such a pod is matched by spec order alone.
        reused = any(c.kind == "init" for m in found[:1] for c in m.entry.containers)
        for m in found:
            if set(m.grant.uuids) == uuids and not reused:
                return m
        if found:
            return found[0]
        raise AllocateError(
            f"no gpuslice grant on node {self.cfg.node} waits for a container with {len(ids)} device(s); pods asking "
            f"for {self.cfg.resource_name} must be scheduled by the gpuslice scheduler (check the pod's "
            f"spec.schedulerName and its {formats.POD_GRANT} annotation)")

    def one_pod(self, found: list[Match], count: int) -> list[Match]:
        """``found`` when every candidate belongs to one pod; else :class:`AllocateError` (ambiguous)."""
        pods = {m.entry.pod_uid: m.entry for m in found}
        if len(pods) <= 1:
            return found
        names = ", ".join(f"{e.namespace}/{e.pod}" for e in sorted(pods.values(), key=lambda e: e.bound_at))
        raise AllocateError(
            f"cannot tell which pod the kubelet is admitting: pods {names} on node {self.cfg.node} all wait for "
            f"a container of {count} device(s) (the kubelet names devices, not pods); refusing rather than "
            f"handing one pod another's grant. The scheduler's allocation lock ({formats.NODE_ALLOCATING}) "
            f"prevents this unless it timed out or is off (gpuslice scheduler --allocation-timeout)")

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        chosen: list[str] = list(must)[:size]
        try:
            found = self.one_pod(self.candidates(size), size)
        except (KubeError, SpecError, AllocateError) as exc:
            log.warning("GetPreferredAllocation: %s", exc)
            found = []
        want = found[0].grant.uuids if found else ()
        for uuid in want:
            if len(chosen) >= size:
                break
            if any(uuid_of(c) == uuid for c in chosen):
                continue
            for i in available:
                if uuid_of(i) == uuid and i not in chosen:
                    chosen.append(i)
                    break
        for i in available:  # fill up (no grant known, or its IDs are taken): distinct devices first
            if len(chosen) >= size:
                break
            if i not in chosen and all(uuid_of(c) != uuid_of(i) for c in chosen):
                chosen.append(i)
        for i in available:
            if len(chosen) >= size:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen[:size]

    # ------------------------------------------------------------------------------------ files
    def slice_config(self, grant: formats.ContainerGrant) -> SliceConfig:
        """The grant as the enforcer's slice file (paths as the container sees them)."""
        return slice_config(grant.grant, region=f"{CONTAINER_REGION_DIR}/region",
                            device_state_dir=CONTAINER_DEVICE_STATE, oom_policy=self.cfg.oom_policy,
                            log_level=self.cfg.log_level, fail_open=self.cfg.fail_open,
                            mps_pipe_dir=CONTAINER_MPS_PIPE,
                            oom_wait_ms=self.cfg.oom_wait_ms if self.cfg.oom_policy == "wait" else None)

    @staticmethod
    def daemon_key(grant: formats.ContainerGrant, pod: Mapping[str, Any],
                   namespace: str | None = None) -> DaemonKey | None:
        """The MPS daemon a spatial container is a client of (None for a time-sliced one): its device, its
        ``runAsUser`` and its pod's namespace, the tenant boundary (mpsfleet.DaemonKey). ``namespace``: the
        ledger's, for a pod not at hand (then ``pod`` is ``{}`` and the user the default of an empty spec)."""
        spatial = [s for s in grant.slices if s.engine is Engine.SPATIAL]
        if not spatial:
            return None
        if namespace is None:
            namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        return DaemonKey.for_client(spatial[0].device_uuid, run_as_user(pod, grant.container), namespace)

    def roster_daemon(self, grant: formats.ContainerGrant, pod: Mapping[str, Any]) -> str:
        """What the device's roster names as a spatial container's MPS daemon: its pipe directory as the host sees
        it ("" for a time-sliced one). The enforcer caps a yielding spatial process only beside a high-priority
        slice of the same daemon (native/include/gpuslice/mps.h)."""
        return self.daemon_folder(self.daemon_key(grant, pod))

    def daemon_folder(self, key: DaemonKey | None) -> str:
        """The roster's name for daemon ``key``: its pipe folder as the host sees it ("" for None: time-sliced)."""
        return str(self.mps_paths(key)[0]) if key is not None else ""

    def mps_paths(self, key: DaemonKey) -> tuple[Path, Path]:
        """The daemon's pipe and shared-memory folders as the host (the kubelet) sees them."""
        folder = self.cfg.host_state_dir / "kube" / "mps" / key.name
        return folder / "pipe", folder / "shm"

    def paths(self, grant_id: str, local: bool) -> dict[str, Path]:
        state = self.cfg.local_state if local else self.cfg.host_state_dir
        root = state / "kube"
        return {"slice": root / "grants" / grant_id / "slice", "region": root / "regions" / grant_id,
                "devstate": root / "grants" / grant_id / "devices", "devices": state / "devices",
                "preload": root / "ld.so.preload"}

    @staticmethod
    def device_stems(grant: formats.ContainerGrant) -> list[str]:
        """The enforcer's names of the grant's devices (:func:`gpuslice.enforcer.devstate.device_stem`): its
        records folder is ``<stem>.slices``, its roster ``<stem>.policy``."""
        out = []
        for uuid in grant.uuids:
            name = device_stem(uuid)
            if name not in out and "/" not in name:
                out.append(name)
        return out

    def write_files(self, grant: formats.ContainerGrant, daemon: str = "") -> None:
        """The host files of a container's slice, laid out by the trust model (``native/README.md``): the host's
        users can reach none of them (``kube/regions`` and the node-wide ``devices`` folder are root's, 0700; the
        kubelet bind-mounts from them whatever the folders' modes); a container reaches only its own, through its
        mounts. No link is followed; in the node-wide ``devices`` folder, which only root writes, a record file that
        is not root's regular file is replaced (:func:`gpuslice.spec.files.ensure_owned_file`). ``daemon``: the
        roster's name for a spatial container's MPS daemon (:meth:`roster_daemon`; "" = not known here)."""
        local = self.paths(grant.grant_id, local=True)
        local["slice"].parent.mkdir(parents=True, exist_ok=True)
        write_slice_file(local["slice"], self.slice_config(grant))
        # the grant's region and device-state folders are mount points, mounted read-only: nothing is ever made
        # in them from the container (their files are mounted read-write on top, :meth:`response`)
        for folder, mode in ((local["region"].parent, 0o700), (local["devices"], 0o700), (local["region"], 0o755),
                             (local["devstate"], 0o755)):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, mode)
        # The region, made before the kubelet starts the container, writable by every process of that one
        # container (they may run as any user); no one else can reach its folder.
        create_region(local["region"] / "region", mode=0o666)
        self._write_device_files(grant, local, daemon)
        text = CONTAINER_LIB + "\n"
        if not local["preload"].exists() or local["preload"].read_text() != text:
            write_atomic(local["preload"], text, 0o644)

    def _write_device_files(self, grant: formats.ContainerGrant, local: Mapping[str, Path], daemon: str = "") -> None:
        """Per granted device: the slice's record file (root's, 0666, empty: the container's processes may run as
        any uid, and only this container mounts it read-write; it must exist before the kubelet bind-mounts it and
        is never replaced, the mount holds the inode), the slice's roster entry (root's, mounted read-only: the
        policy every pacer there takes for it), and in the grant's own device-state folder the mount points of
        the device's records folder and roster (the runtime cannot make them inside that read-only mount)."""
        write_records(local["devices"], grant.grant_id, grant.uuids, mode=SHARED_MODE)
        write_policies(local["devices"], grant.grant_id, grant.grant.slices, daemon)
        for name in self.device_stems(grant):
            for suffix in (RECORDS_SUFFIX, POLICY_SUFFIX):
                (local["devstate"] / f"{name}{suffix}").mkdir(mode=0o755, exist_ok=True)

    def reconcile_policies(self, wanted: Mapping[str, Iterable[Slice]], older_than: float,
                           daemons: Mapping[str, str] | None = None) -> RosterChanges:
        """The node's rosters brought in line with the device plugin's grants ``wanted`` (grant id -> slices): each
        written where missing or out of date, and the plugin's grants (``k-…``) not in it taken off (files older
        than ``older_than`` seconds only: a newer one may be a grant or resize the ledger read here predates)."""
        return reconcile_policies(self.paths("-", local=True)["devices"], wanted, prefix="k-", older_than=older_than,
                                  daemons=daemons)

    def prune_grant_folders(self, keep_prefixes: Iterable[str], older_than: float,
                            now: float | None = None) -> tuple[str, ...]:
        """Remove the host files of the device plugin's grants — their folders (``kube/grants/k-…``,
        ``kube/regions/k-…``) and their slice record files (``devices/<stem>.slices/k-…``) — whose id starts with
        none of ``keep_prefixes`` (the ledger's grants, and ``k-<uid>-`` of every pod the node still has: they are
        mounted into its containers while the pod exists) and that are older than ``older_than`` seconds. Pods end
        without telling the device plugin, so nothing else removes them. Only real folders and files of ours are
        removed, never through a link; the grant ids removed, sorted."""
        keep = tuple(keep_prefixes)
        now = time.time() if now is None else now
        gone = self._prune_folders(keep, older_than, now)
        gone.update(prune_records(self.paths("-", local=True)["devices"],
                                  lambda g: g.startswith("k-") and not g.startswith(keep), older_than=older_than,
                                  now=now))
        return tuple(sorted(gone))

    def _prune_folders(self, keep: tuple[str, ...], older_than: float, now: float) -> set[str]:
        root = self.paths("-", local=True)["region"].parent.parent
        gone = set()
        for sub in ("grants", "regions"):
            try:
                names = os.listdir(root / sub)
            except FileNotFoundError:
                continue
            for name in names:
                if not name.startswith("k-") or name.startswith(keep):
                    continue
                path = root / sub / name
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < older_than:
                    continue
                # moved aside at once into .left beside it (the same file system; not a k- name, so no pass takes
                # it for a grant), deleted in the background: links inside are removed, not followed, and a tree
                # too deep for rmtree stays there, failing no pass
                if remove_tree(path, root / sub / LEFT):
                    gone.add(name)
        return gone

    def response(self, grant: formats.ContainerGrant, mps: DaemonKey | None = None) -> dict[str, Any]:
        """The ContainerAllocateResponse as plain data (envs, mounts, devices). Mounts, in order (the
        container runtime mounts parents before children):

        * the slice file, read-only — what configures the enforcer;
        * this grant's region folder, read-only, and in it the region file, read-write — the enforcer's shared
          memory accounting of this slice;
        * this grant's own device-state folder, read-only (only mount points in it), and in it, per granted
          device (:meth:`device_mounts`): the device's slice records folder (``<stem>.slices``), read-only — every
          slice's records on the device, which the pacer reads — and in that the grant's own record file,
          read-write; then the device's policy roster (``<stem>.policy``), read-only. Not the node's whole
          folder, so a container sees no other device's pacing state, and writes no other slice's records.
          No host folder is mounted read-write: the kubelet's ephemeral-storage limits do not count a device
          plugin's bind mounts, so a pod wrote into them until the node's disk was full (attacker's review,
          stop 28); only files whose size the enforcer fixes are writable;
        * the enforcer library and ``/etc/ld.so.preload``, read-only.
        """
        host = self.paths(grant.grant_id, local=False)
        mounts = [
            (CONTAINER_SLICE, str(host["slice"]), True),
            (CONTAINER_REGION_DIR, str(host["region"]), True),
            (f"{CONTAINER_REGION_DIR}/region", str(host["region"] / "region"), False),
            (CONTAINER_DEVICE_STATE, str(host["devstate"]), True),
            *[m for stem in self.device_stems(grant)
              for m in self.device_mounts(grant.grant_id, stem, host["devices"])],
            (CONTAINER_LIB, str(self.cfg.host_library), True),
            (CONTAINER_PRELOAD, str(host["preload"]), True),
        ]
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(grant.uuids), "GPUSLICE_SLICE": CONTAINER_SLICE,
                "GPUSLICE_GRANT": grant.grant_id}
        if mps is not None:  # a spatial container: its device's MPS daemon
            pipe, shm = self.mps_paths(mps)
            mounts.append((CONTAINER_MPS_PIPE, str(pipe), False))
            if self.cfg.mps_private_shm:
                mounts.append((CONTAINER_SHM, str(shm), False))
            for item in grant.slices:
                envs.update(client_env(item, CONTAINER_MPS_PIPE))
        return {"envs": envs, "mounts": mounts, "devices": self.device_nodes(grant)}

    @staticmethod
    def device_mounts(grant_id: str, stem: str, devices: Path) -> list[tuple[str, str, bool]]:
        """One granted device's mounts (container path, host path, read-only), parents first: its records folder
        (read-only), the grant's own record file in it (read-write), its roster (read-only)."""
        records, roster = f"{stem}{RECORDS_SUFFIX}", f"{stem}{POLICY_SUFFIX}"
        return [(f"{CONTAINER_DEVICE_STATE}/{records}", str(devices / records), True),
                (f"{CONTAINER_DEVICE_STATE}/{records}/{grant_id}", str(devices / records / grant_id), False),
                (f"{CONTAINER_DEVICE_STATE}/{roster}", str(devices / roster), True)]

    def device_nodes(self, grant: formats.ContainerGrant) -> list[str]:
        if self.cfg.device_nodes == "none":
            return []
        by_uuid: dict[str, Device] = {}
        for d in self.devices():
            by_uuid[d.uuid] = d
            for m in d.mig_instances:
                by_uuid[m.uuid] = d
        nodes = list(CONTROL_DEVICES)
        for uuid in grant.uuids:
            d = by_uuid.get(uuid)
            if d is not None:
                minor = d.extra.get("minor", d.index) if isinstance(d.extra, dict) else d.index
                nodes.append(f"/dev/nvidia{minor}")
        if self.cfg.device_nodes == "always":
            return nodes
        root = self.cfg.dev_root
        return [n for n in nodes if (root / n.lstrip("/")).exists()]

    def allocate(self, ids: Sequence[str]) -> tuple[Match, dict[str, Any]]:
        with self._lock:  # one Allocate at a time: the "allocated" marks must not interleave
            match = self.find(ids)
            # the webhook refuses these at admission, but it fails open (failurePolicy Ignore) and a pod
            # admitted while it was down must not get its slice here either
            problem = escapes.escape_problem(match.pod, lambda c: c.get("name") == match.grant.container) \
                or escapes.device_env_problem(match.pod)
            if problem:
                raise AllocateError(f"container {match.grant.container}: {problem}")
            key = self.daemon_key(match.grant, match.pod)
            self.write_files(match.grant, self.daemon_folder(key))
            if key is not None:  # first use of the device's daemon starts it
                try:
                    self.mps.ensure(key)
                except MpsError as exc:
                    raise AllocateError(f"spatial container {match.grant.container}: {exc}") from None
                self.mps_started[key] = time.monotonic()
            meta = match.pod["metadata"]
            done = formats.decode_allocated(((meta.get("annotations") or {}).get(formats.POD_ALLOCATED)))
            done.add(match.grant.container)
            self.api.patch_pod_annotations(meta["namespace"], meta["name"],
                                           {formats.POD_ALLOCATED: formats.encode_allocated(done)}, uid=meta["uid"])
            if {c.container for c in match.entry.containers} <= done:
                self.release_lock(match.entry.pod_uid)
            return match, self.response(match.grant, key)

    def release_lock(self, pod_uid: str, attempts: int = 8) -> bool:
        """Remove the pod from the Node's ``gpuslice.io/allocating`` (resourceVersion-conditioned, retried on
        conflicts). A failure is logged, not raised: the Allocate answer stands, and the extender drops
        holders whose pod is allocated (at its next bind on this node, or garbage collection)."""
        def drop(anns: Mapping[str, str]) -> dict[str, str | None]:
            holders = formats.decode_allocating(anns.get(formats.NODE_ALLOCATING))
            return {formats.NODE_ALLOCATING: formats.encode_allocating(holders - {pod_uid})} if pod_uid in holders else {}

        try:
            update_node_annotations(self.api, self.cfg.node, drop, attempts)
            return True
        except Conflict:
            log.warning("releasing the allocation lock of pod %s on %s: the node kept changing", pod_uid, self.cfg.node)
        except (KubeError, SpecError) as exc:
            log.warning("releasing the allocation lock of pod %s on %s: %s", pod_uid, self.cfg.node, exc)
        return False


def run_as_user(pod: Mapping[str, Any], container: str) -> int:
    """The container's ``securityContext.runAsUser``, else the pod's; -1 when neither says (the image decides)."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if isinstance(c, dict) and c.get("name") == container:
            uid = (c.get("securityContext") or {}).get("runAsUser")
            if isinstance(uid, int) and not isinstance(uid, bool):
                return uid
    uid = (spec.get("securityContext") or {}).get("runAsUser")
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else -1
