"""The node's MPS control daemons: which run, started on first use and stopped with the last spatial slice.

The node side (local mode's ledger, the Kubernetes node agent) knows its spatial slices; it hands the set
of daemons they need to :meth:`MpsDaemons.reconcile`, which makes the folder ``root`` (``<state>/mps``)
match: a daemon per wanted (device, user) key runs, none other does. Every change of the node's grants
reconciles, and so does every reclaim pass and the start of an agent — so a daemon whose last slice ended
while its owner was down (a killed agent, a killed ``gpuslice run``) is stopped at the next pass, and one
that died is started again. Layout::

    <root>/<device>-<user>/     one daemon's folder (:class:`gpuslice.host.mps.MpsControl`)
    <root>/<device>-<user>/restarts.json  how often this folder's daemon was started again, when and why
    <root>/faults.json          every daemon fault the node side acted on (restart, or retire with its
                                last slice): counted, the last ten kept with device, time and log lines
    <root>/logs/<device>-<user>/  the logs of the last daemon of that name, kept when it stopped
    <root>/.lock                held while reconciling (several processes share a state dir)
    <root>/troubles.json        per daemon name: how many of its starts and stops were slow lately, and the
                                last one's time (the hold on its next start, below)

``<device>`` is the first 12 hex digits of the device UUID (``m`` in front for a MIG instance), ``<user>``
the uid the daemon runs as (``self``: the node side's own). MPS serves one user per server at a time: a
second user's client waits until the first user's clients are done, so each user gets a daemon of their
own on a device (their kernels run at once within a user; the users' servers take turns on the device).

Faults: MPS propagates a fatal fault of one client (an illegal address) to every client of its server on
that device; the server takes no new client until they have all exited. :meth:`status` reports a daemon
whose logs show a fault, and reconcile restarts it once no client of it is left (``busy`` says whether one
is), giving new slices a fresh daemon. It never ends a slice's processes itself. Each restart (after a fault,
or of a daemon that died) is counted in the daemon's ``restarts.json``, and every fault acted on (also a
daemon retired because its slices ended after one) in the node's ``faults.json``, with time and log lines:
on the H100 (2026-11-25) a client's illegal address ended all four neighbours' work within 2.2 s; their
slices ended and the daemon was retired with them, well inside one ``ps`` poll, so a view of the daemons'
states alone never showed the fault.

Held starts: a daemon runs as its tenant, who may stop it (SIGSTOP), fault its log or kill it at will, and its
starts and stops happen while the node side holds its ledger's write lock, so a daemon that answers no control
command held every tenant's grants, releases and the backstop for the start and quit timeouts (15 + 10 s) on
every pass (37.2, 17.1, 15.0 s in a row; attacker's review, stop 28). A stopped or traced daemon is killed at
once (:meth:`gpuslice.host.mps.MpsControl.stop`), and for any other hang a start or stop that takes
longer than :data:`TROUBLE_S` (failed or not) counts against the daemon's name (in the root's
``troubles.json``, which outlives the daemon's folder), and the next start of that name waits :data:`HOLD_BASE_S` doubling with each
trouble, up to :data:`HOLD_MAX_S`, until :data:`TROUBLE_RESET_S` pass without one. A held start is refused
(``ensure``) or reported (``reconcile``), never waited for. What is left: one stall of up to ~37 s (a quit
and its wait, the kill, a start) per hold, so about 5 in such a tenant's first 10 minutes and then one per 10
minutes (README, Limits). Normal starts and stops take well under a second and never count.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from gpuslice.host.mps import DaemonRecord, MpsControl, MpsError, find_control
from gpuslice.spec.files import LEFT, remove_tree

LOCK = ".lock"
LOGS = "logs"
RESTARTS = "restarts.json"
TROUBLES = "troubles.json"
TROUBLE_S = 3.0  # a start or stop slower than this counts as trouble (its timeouts: 15 s start, 10 s quit)
HOLD_BASE_S = 30.0  # the hold on the next start after one trouble; doubled per further trouble
HOLD_MAX_S = 600.0
TROUBLE_RESET_S = 3600.0  # troubles are forgotten once none came for this long
FAULTS = "faults.json"  # <root>/faults.json: the node's daemon faults, counted, the last RECENT_FAULTS kept
RECENT_FAULTS = 10
_HEX = re.compile(r"[^0-9a-f]")


@dataclass(frozen=True, order=True)
class DaemonKey:
    """A daemon's identity: the device it serves, the user it runs as (-1: the node side's own) and the tenant
    it serves ("": every client of that user, local mode; Kubernetes: the pod's namespace). One daemon never
    serves two tenants: its clients share its pipe and shared-memory folders, and pods of one ``runAsUser`` in
    two namespaces shared a daemon before (issue 15, attacker's review)."""

    device: str
    uid: int = -1
    tenant: str = ""

    @classmethod
    def for_client(cls, device: str, uid: int, tenant: str = "") -> "DaemonKey":
        """The daemon a spatial client of user ``uid`` (-1: unknown) of ``tenant`` uses on ``device``: run as
        that user when the node side is root (MPS serves one user per server at a time), else as the node side's
        own."""
        return cls(device, uid if os.geteuid() == 0 and uid > 0 else -1, tenant)

    @property
    def name(self) -> str:
        """The folder name: short (MPS sockets live in it), stable, and distinct per device, user and tenant
        (a tenant as 10 hex digits of its SHA-256: any namespace name fits, none can name a path)."""
        prefix = "m" if self.device.upper().startswith("MIG-") else ""
        digits = _HEX.sub("", self.device.split("-", 1)[-1].lower())[:12] or "x"
        user = self.uid if self.uid >= 0 else "self"
        tenant = f"-{hashlib.sha256(self.tenant.encode()).hexdigest()[:10]}" if self.tenant else ""
        return f"{prefix}{digits}-{user}{tenant}"


@dataclass(frozen=True)
class DaemonStatus:
    """What ``ps``, the metrics and the dashboard show of one daemon."""

    device: str
    uid: int
    pid: int | None
    state: str  # running | fault | down
    faults: tuple[str, ...] = ()
    started: float = 0.0
    restarts: int = 0
    last_restart: "Restart | None" = None

    def to_json(self) -> dict:
        return {"device": self.device, "uid": self.uid, "pid": self.pid, "state": self.state,
                "faults": list(self.faults), "started": self.started, "restarts": self.restarts,
                "last_restart": self.last_restart.to_json() if self.last_restart else None}


@dataclass(frozen=True)
class Restart:
    """A daemon's end or restart that its logs tie to a fault: when, what gpuslice did (``fault``: restarted
    once its clients had gone, ``died``: found dead and started again, ``retired``: its last spatial slice
    ended after the fault) and the fault lines its logs showed then (the logs move to ``<root>/logs``)."""

    at: float
    reason: str
    faults: tuple[str, ...] = ()
    device: str = ""
    uid: int = -1

    def to_json(self) -> dict:
        return {"at": self.at, "reason": self.reason, "faults": list(self.faults), "device": self.device,
                "uid": self.uid}

    @classmethod
    def from_json(cls, data: dict) -> "Restart":
        return cls(float(data["at"]), str(data["reason"]), tuple(map(str, data["faults"])),
                   str(data.get("device", "")), int(data.get("uid", -1)))


def _uid_of_name(name: str) -> int:
    """The user in a daemon folder's name (``<device>-<uid>[-<tenant>]``); -1 for ``self`` or a name not ours."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1


def _read_events(path: Path) -> tuple[int, list[Restart]]:
    """(count, events) of a restarts.json or faults.json; (0, []) when there is none or it does not read."""
    try:
        data = json.loads(path.read_text())
        return int(data["count"]), [Restart.from_json(e) for e in data["events"]]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, []


def _add_event(path: Path, event: Restart, keep: int) -> None:
    """Count ``event`` in ``path`` and keep the last ``keep`` events (written whole, then renamed)."""
    count, events = _read_events(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"count": count + 1, "events": [e.to_json() for e in [*events, event][-keep:]]}))
    os.replace(tmp, path)


@dataclass
class Reconciled:
    """What a reconcile pass did, and what it could not do (one line per daemon, not raised)."""

    started: list[DaemonKey] = field(default_factory=list)
    stopped: list[DaemonKey] = field(default_factory=list)
    restarted: list[DaemonKey] = field(default_factory=list)
    problems: dict[DaemonKey, str] = field(default_factory=dict)


def _never_busy(key: DaemonKey) -> bool:
    return False


class MpsDaemons:
    """The daemons under ``root``. ``binary`` is nvidia-cuda-mps-control (None: :func:`find_control` when
    first needed); ``shm``: each daemon gets a /dev/shm folder of its own (Kubernetes)."""

    def __init__(self, root: Path, binary: Path | None = None, *, shm: bool = False,
                 start_timeout: float | None = None, quit_timeout: float | None = None):
        self.root = Path(root)
        self._binary = binary
        self.shm = shm
        self._timeouts = {k: v for k, v in (("start_timeout", start_timeout), ("quit_timeout", quit_timeout))
                          if v is not None}

    # -------------------------------------------------------------------------------------- places
    @property
    def binary(self) -> Path:
        if self._binary is None:
            found = find_control()
            if found is None:
                raise MpsError("the spatial engine needs NVIDIA's nvidia-cuda-mps-control, which is not on PATH "
                               "(install the driver's MPS binaries, or set GPUSLICE_MPS_CONTROL to its path)")
            self._binary = found
        return self._binary

    def _known_binary(self) -> Path:
        """The control binary if there is one, else a path of none: stopping and listing daemons needs it to tell
        a daemon's processes (``MpsControl._program``), but must work on a node without MPS too."""
        try:
            return self.binary
        except MpsError:
            return Path("/nonexistent")

    def available(self) -> bool:
        try:
            return self.binary is not None
        except MpsError:
            return False

    def folder(self, key: DaemonKey) -> Path:
        return self.root / key.name

    def pipe_dir(self, key: DaemonKey) -> Path:
        """Where the clients of ``key``'s daemon find it (CUDA_MPS_PIPE_DIRECTORY), known before it starts."""
        return self.folder(key) / "pipe"

    def shm_dir(self, key: DaemonKey) -> Path:
        return self.folder(key) / "shm"

    def control(self, key: DaemonKey) -> MpsControl:
        return MpsControl(self.binary, self.folder(key), key.device, key.uid, shm=self.shm, tenant=key.tenant,
                          **self._timeouts)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def known(self) -> dict[str, DaemonKey | None]:
        """Folder name -> the key its daemon.json names (None: a folder without a readable record)."""
        found: dict[str, DaemonKey | None] = {}
        if not self.root.is_dir():
            return found
        for entry in sorted(self.root.iterdir()):
            if not entry.is_dir() or entry.name == LOGS or entry.name.startswith("."):
                continue
            try:
                rec = DaemonRecord.from_json(json.loads((entry / "daemon.json").read_text()))
                found[entry.name] = DaemonKey(rec.device, rec.uid, rec.tenant)
            except (OSError, ValueError, MpsError):
                found[entry.name] = None
        return found

    # -------------------------------------------------------------------------------------- troubles
    def held_for(self, name: str, now: float | None = None) -> float:
        """Seconds the next start of daemon ``name`` must still wait (0: none) after its troubles."""
        return self._hold(name, now)[0]

    def _hold(self, name: str, now: float | None = None) -> tuple[float, int]:
        """(held_for, the trouble count it comes from), from one read of troubles.json."""
        count, last = self._troubles().get(name, (0, 0.0))
        now = time.time() if now is None else now
        since = now - last
        # a last trouble ahead of the clock (a clock stepped back) tells nothing of when it was: forgotten, so a
        # hold never outlasts HOLD_MAX_S (at worst one more slow start is seen and counted anew)
        if count <= 0 or since > TROUBLE_RESET_S or since < -60:
            return 0.0, count
        since = max(0.0, since)
        hold = HOLD_BASE_S * 2 ** min(count - 1, 16)  # bounded: HOLD_MAX_S caps it long before, no float overflow
        return max(0.0, min(HOLD_MAX_S, hold) - since), count

    def _troubles(self) -> dict[str, tuple[int, float]]:
        try:
            data = json.loads((self.root / TROUBLES).read_text())
            return {str(k): (int(v[0]), float(v[1])) for k, v in data.items()}
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return {}

    def _note_trouble(self, name: str) -> None:
        """Count one; a file that cannot be written (a full disk) costs the hold, never the start or stop it
        follows (this runs in ``_watched``'s finally)."""
        now = time.time()
        found = {k: v for k, v in self._troubles().items() if now - v[1] <= TROUBLE_RESET_S}
        count = found.get(name, (0, 0.0))[0]
        found[name] = (min(count + 1, 1000), now)
        tmp = self.root / (TROUBLES + ".tmp")
        try:
            tmp.write_text(json.dumps(found))
            os.replace(tmp, self.root / TROUBLES)
        except OSError:
            pass

    @contextmanager
    def _watched(self, name: str) -> Iterator[None]:
        """Count a start or stop of daemon ``name`` that took longer than TROUBLE_S, failed or not (one that
        fails at once holds nobody up, and a retry of it must not wait)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            if time.monotonic() - t0 > TROUBLE_S:
                self._note_trouble(name)

    def _check_hold(self, key: DaemonKey) -> None:
        wait, count = self._hold(key.name)
        if wait > 0:
            raise MpsError(f"the MPS daemon of {key.device} for uid {key.uid} was slow to start or stop "
                           f"{count} time(s) lately (a daemon its user stopped?); its next start waits {wait:.0f} s "
                           "more, so that it cannot hold the node's other slices up")

    def _start(self, ctl: MpsControl, key: DaemonKey, checked: bool = False) -> int:
        """Start ``key``'s daemon unless it is held (``checked``: the caller checked before stopping it, and a
        slow stop just now must not leave it down)."""
        if not checked:
            self._check_hold(key)
        with self._watched(key.name):
            return ctl.start()

    def _stop(self, ctl: MpsControl, name: str) -> None:
        with self._watched(name):
            ctl.stop()

    # -------------------------------------------------------------------------------------- changes
    def ensure(self, key: DaemonKey) -> int:
        """Start ``key``'s daemon unless it runs (first use); its pid. Raises MpsError when it cannot start, or
        when its start is held after troubles (module doc)."""
        with self._locked():
            ctl = self.control(key)
            pid = ctl.pid()
            return pid if pid is not None else self._start(ctl, key)

    def reconcile(self, wanted: Iterable[DaemonKey], busy: Callable[[DaemonKey], bool] = _never_busy) -> Reconciled:
        """Make the running daemons exactly ``wanted``: stop the others (and clear folders left by crashes),
        start wanted ones that do not run, restart a wanted daemon that reported a fault once ``busy(key)``
        says no client of it is left. Failures are reported per daemon, never raised."""
        wanted = set(wanted)
        done = Reconciled()
        with self._locked():
            for name, key in self.known().items():
                if key is None or key not in wanted or key.name != name:
                    self._retire(name, key, done)
            for key in sorted(wanted):
                try:
                    self._keep(key, busy, done)
                except MpsError as exc:
                    done.problems[key] = str(exc)
        return done

    def _retire(self, name: str, key: DaemonKey | None, done: Reconciled) -> None:
        """Stop a daemon nobody wants (or clear a folder without a record) and keep its logs."""
        folder = self.root / name
        # a folder without a record: its name says whose daemon it was (DaemonKey.name), whom root may signal
        uid = key.uid if key else _uid_of_name(name)
        ctl = MpsControl(self._known_binary(), folder, key.device if key else "", uid, **self._timeouts)
        faults = ctl.faults() if key is not None else []
        try:
            self._stop(ctl, name)
        except OSError as exc:
            done.problems[key or DaemonKey(name)] = f"stopping the MPS daemon in {folder}: {exc}"
            return
        if key is not None and faults:
            self._faulted(ctl, key, "retired", faults, restarted=False)
        self._keep_logs(ctl)
        remove_tree(folder, self.root / LEFT)
        if key is not None:
            done.stopped.append(key)

    def _faulted(self, ctl: MpsControl, key: DaemonKey, reason: str, faults: list[str], restarted: bool) -> None:
        """Record a fault acted on: in the node's history, and (``restarted``) in the daemon's restart count."""
        event = Restart(time.time(), reason, tuple(faults[-3:]), key.device, key.uid)
        if restarted:
            _add_event(ctl.folder / RESTARTS, event, 1)
        if faults:
            self.root.mkdir(parents=True, exist_ok=True)
            _add_event(self.root / FAULTS, event, RECENT_FAULTS)

    def fault_history(self) -> tuple[int, list[Restart]]:
        """(faults acted on since the state dir was made, the last RECENT_FAULTS of them, oldest first)."""
        return _read_events(self.root / FAULTS)

    def _keep_logs(self, ctl: MpsControl) -> None:
        if not ctl.log_dir.is_dir():
            return
        target = self.root / LOGS / ctl.folder.name
        remove_tree(target, self.root / LEFT)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:  # one rename (the same file system): a copy of a tenant's tree would recurse as rmtree did
            os.rename(ctl.log_dir, target)
        except OSError:
            remove_tree(ctl.log_dir, self.root / LEFT)

    def _keep(self, key: DaemonKey, busy: Callable[[DaemonKey], bool], done: Reconciled) -> None:
        ctl = self.control(key)
        if ctl.running():
            faults = ctl.faults()
            if faults and not busy(key):
                self._check_hold(key)  # before it is stopped: a held restart leaves it as it is
                self._keep_logs(ctl)
                self._stop(ctl, key.name)
                self._start(ctl, key, checked=True)
                self._faulted(ctl, key, "fault", faults, restarted=True)
                done.restarted.append(key)
            return
        if ctl.mps_processes() and busy(key):
            # the control daemon is gone but its server still serves live clients: leave them be
            done.problems[key] = (f"the MPS control daemon of {key.device} is down while its server still serves "
                                  "clients; it is started again once they have exited")
            return
        previous = ctl.record()
        died = previous is not None and previous.pid > 0  # it ran here before: not a first start
        self._check_hold(key)
        faults = ctl.faults() if died else []
        if faults:
            self._keep_logs(ctl)  # else the fresh daemon would read as faulted and be restarted once more
        self._stop(ctl, key.name)  # clears a crashed daemon's stale sockets and servers, if any
        self._start(ctl, key, checked=True)
        if died:
            self._faulted(ctl, key, "died", faults, restarted=True)
        done.started.append(key)

    def stop_all(self) -> Reconciled:
        return self.reconcile(())

    # -------------------------------------------------------------------------------------- views
    def status(self) -> list[DaemonStatus]:
        """Every daemon folder: running, fault (its logs report one) or down (its process is gone)."""
        out = []
        for name, key in self.known().items():
            if key is None:
                continue
            ctl = MpsControl(self._known_binary(), self.root / name, key.device, key.uid)
            pid = ctl.pid()
            faults = tuple(ctl.faults()[-3:])
            rec = ctl.record()
            state = "down" if pid is None else ("fault" if faults else "running")
            count, last = _read_events(ctl.folder / RESTARTS)
            out.append(DaemonStatus(key.device, key.uid, pid, state, faults, rec.started if rec else 0.0,
                                    count, last[-1] if last else None))
        return out


__all__ = ["DaemonKey", "DaemonStatus", "MpsDaemons", "Reconciled", "Restart"]
