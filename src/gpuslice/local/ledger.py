"""The local ledger: grants and the wait queue of one node, in SQLite (WAL) under the state dir.

Every change runs in one ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock on the file
before reading: two ``gpuslice run`` processes (or a run and the agent) can never both see the same free
memory, so over-commit is impossible. Inside that transaction the ledger first reclaims stale grants, then
asks the placement core.

Reclaim: a grant lives while its holder (pid + start time) lives. Once the holder is gone, the grant's
processes are ended — SIGTERM (and SIGCONT, for a stopped job), then SIGKILL on the first pass at least
``$GPUSLICE_KILL_GRACE`` seconds later (the time of the SIGTERM is kept in the record) — and the grant is
freed when none is left (:func:`slice_processes` says which processes are provably the grant's). A pass
never waits the grace out inside the transaction: it signals, waits a moment, and leaves the rest to the
next pass (any ``run``/``ps``, or the agent every few seconds).

A request that cannot fit even on an empty node (more devices than there are, more memory than any device
holds) is refused at once (:func:`gpuslice.local.admission.never_fits`), never queued.

Spatial grants (``Engine.SPATIAL``) are clients of their device's MPS control daemon, which the ledger owns
through :class:`gpuslice.host.mpsfleet.MpsDaemons` (``<state>/mps``): a grant is recorded only once its
daemon runs (started on first use, inside the grant's transaction: a daemon that cannot start refuses the
grant, nothing half-applied), and every change — a release, every reclaim pass (any ``run``/``ps``/``top``,
the agent every few seconds, an agent starting) — makes the running daemons exactly those the recorded
spatial grants need. A daemon whose last slice ended while nobody was there to stop it (a killed agent or
launcher) is stopped at the next pass; one that died is started again.

The wait queue is ordered by priority (high first), then arrival. A request is placed only on devices that
no live waiter ahead of it could use (:func:`gpuslice.local.admission.candidate_devices`): a big waiting
request is not starved by a stream of small ones that compete for its devices, and requests for other
devices do not wait behind it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from gpuslice.enforcer.policy import RosterChanges, reconcile_policies
from gpuslice.enforcer.slicerecords import RecordChanges
from gpuslice.host import procs
from gpuslice.host.mps import MpsError, yields
from gpuslice.host.mpsfleet import DaemonKey, MpsDaemons, Reconciled
from gpuslice.host.usage import region_pids
from gpuslice.local import ledgerdb
from gpuslice.local.ledgercheck import BadRow, LostGrant, decode_rows, lost_grants, refusal as lost_refusal
from gpuslice.local.admission import candidate_devices, check_queue_room, holds_back, never_fits, restrict
from gpuslice.local.errors import Forbidden, LedgerError, UnknownGrant
from gpuslice.local.grantfiles import reconcile_grant_records, remove_grant_files, write_grant_files
from gpuslice.local.paths import StateDir
from gpuslice.local import nofit
from gpuslice.local.nofit import device_names, local_words
from gpuslice.local.records import LIVE_HOLDER, Ask, GrantRecord, Queued, Waiter
from gpuslice.local.resize import Resized, evict, resized_request, share_live
from gpuslice.host.usage import below_usage
from gpuslice.placement import NodeState, NoFit, Placement, PlacementPolicy, place, resize, resized_slices
from gpuslice.placement.model import describe_free
from gpuslice.spec import (
    Colocation, Device, Engine, Grant, GpusliceError, HoldsGrant, Priority, Resize, SpecError, request_from_json,
    request_to_json,
)

# A roster file newer than this that differs from the ledger is left alone by the reconcile: it may be a resize
# another process (a CLI holding the ledger) wrote after the ledger was read here. Record files of grants the
# ledger does not hold go only once this old too (a grant made after the ledger was read here).
ROSTER_GRACE = 60.0
SETTLE_S = 0.5  # how long a reclaim pass waits for signalled processes to go before leaving it to the next

# Pids the enforcer recorded in a grant's region: grant -> the live ones. Used for one thing only: whether a
# faulted MPS daemon still has clients (its restart waits for them). Never evidence that a process belongs to
# a slice: a region is its user's to write (issue 15), so it never keeps a grant alive nor gets a pid signalled.
RegionPids = Callable[[GrantRecord], list[int]]


def _no_region_pids(grant: GrantRecord) -> list[int]:
    return []


def recorded_pids(grant: GrantRecord) -> list[int]:
    """The live pids the enforcer recorded in the grant's region (MPS client evidence, see RegionPids)."""
    return region_pids(grant.watched())


log = logging.getLogger("gpuslice.ledger")


class SpatialUnavailable(GpusliceError):
    """A spatial grant whose device's MPS daemon could not be started (the message says why): nothing granted."""


@dataclass(frozen=True)
class SpatialRoom:
    """Where an ask whose engine is left to gpuslice may be spatial (:func:`spatial_room`): never on ``foreign``
    devices (another user's spatial slices: MPS serves each user apart, so their daemons are time-sliced against
    each other with no priority between them, and a default that joined one would disturb that user's
    high-priority server as plain time-slicing does); at low priority only on ``own_high`` ones (this user's
    high-priority preemptive spatial slices: a yielding process takes its SM cap from the roster when it starts,
    so a trainer spatial before its server kept every SM, and a server of short kernels read 3.6x its alone p50
    beside it on the H100, 2026-12-06, where the time-sliced pair stayed within 2x); at high priority not on
    ``own_low_alone`` ones (this user's yielding spatial slices with no high one beside them: their processes
    may have started uncapped, a trainer named spatial or one whose server ended, helper 44)."""

    foreign: frozenset[str] = frozenset()
    own_high: frozenset[str] = frozenset()
    own_low_alone: frozenset[str] = frozenset()  # this user's yielding spatial slices, no high one: maybe uncapped


def place_ask(ask: Ask, node: NodeState, policy: PlacementPolicy,
              room: SpatialRoom = SpatialRoom()) -> tuple[Placement, Ask]:
    """Placement of ``ask`` on ``node``, and the ask as placed. One whose engine was left to gpuslice
    (``Ask.engine_auto``) and that fits only with the other engine (a device runs one engine at a time: the one
    it would share runs the other; or it may be spatial only where ``room`` says) takes that one; where neither
    fits, the refusal of the try that saw more of the node is raised (the preferred one's on a tie)."""
    mine = _for_auto(ask, node, room)
    try:
        return place(ask.request, [mine], policy), ask
    except NoFit as preferred:
        other = _other_engine(ask)
        if other is None:
            raise
        theirs = _for_auto(other, node, room)
        try:
            return place(other.request, [theirs], policy), other
        except NoFit as second:
            # the refusal of the try that saw more of the node: one the room emptied would name no real reason
            # (a low-priority default with no server of its own: "no device of model on any node")
            raise (second if len(theirs.devices) > len(mine.devices) else preferred) from None


def _for_auto(ask: Ask, node: NodeState, room: SpatialRoom) -> NodeState:
    """The devices an auto ask may take with its engine (all of them, but for a spatial one: ``room``)."""
    if not (ask.engine_auto and ask.request.engine is Engine.SPATIAL):
        return node
    node = restrict(node, drop=room.foreign)
    if ask.request.priority is Priority.LOW:
        return restrict(node, keep=room.own_high)
    return restrict(node, drop=room.own_low_alone)


def usable_devices(ask: Ask, node: NodeState, room: SpatialRoom) -> NodeState:
    """The devices of ``node`` that ``ask`` may take with an engine it may have (the refusal offers sizes that
    fit on these only): its engine's, and for an auto ask the other engine's, each within ``room``."""
    keep = set()
    for each in (ask, _other_engine(ask)):
        if each is not None:
            keep.update(d.uuid for d in _for_auto(each, node, room).devices if d.takes(each.request.engine))
    return restrict(node, keep=frozenset(keep))


def _timesliced(ask: Ask) -> Ask:
    """The ask on the time-sliced engine, its engine no longer gpuslice's to choose."""
    return replace(ask, request=replace(ask.request, engine=Engine.TIMESLICE), engine_auto=False)


def _other_engine(ask: Ask) -> Ask | None:
    """The auto ask with the other engine, or None: its engine was named; the other cannot serve it (a spatial
    request covers one device, a tidal one needs the time-sliced engine); or it would change what the request
    means (a compute share is a share of the device's time on the time-sliced engine, of its SMs on the spatial
    one, where the mode means nothing: such a request keeps its engine)."""
    if not ask.engine_auto:
        return None
    if ask.request.engine is Engine.TIMESLICE and ask.request.compute:
        return None
    other = Engine.TIMESLICE if ask.request.engine is Engine.SPATIAL else Engine.SPATIAL
    try:
        return replace(ask, request=replace(ask.request, engine=other))
    except SpecError:
        return None


class Ledger:
    """Grants of one node. ``devices`` are the node's GPUs (NVML or a snapshot)."""

    def __init__(self, state: StateDir, devices: Sequence[Device], *, node_name: str | None = None,
                 region_pids: RegionPids = _no_region_pids, kill_grace: float | None = None,
                 mps: MpsDaemons | None = None):
        self.kill_grace = procs.grace_seconds() if kill_grace is None else kill_grace  # a bad env: error now
        self.state = state.ensure()
        self.devices = list(devices)
        self.node_name = node_name or socket.gethostname() or "local"
        self.region_pids = region_pids  # MPS client evidence only (see RegionPids)
        self.mps = mps if mps is not None else MpsDaemons(self.state.mps)
        self.mps_problems: dict[DaemonKey, str] = {}  # of the last reconcile pass, for ps
        self._candidate_cache: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}
        self._problems: list[str] = []
        self._bad: list[BadRow] = []
        self._bad_waiters: list[str] = []
        self._live_lost: list[LostGrant] = []
        self._db = ledgerdb.connect(self.state.ledger)

    # -------------------------------------------------------------------------------------- storage
    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            with ledgerdb.immediate(self._db) as db:
                yield db
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"ledger {self.state.ledger}: {exc}") from None

    # -------------------------------------------------------------------------------------- queries
    def grants(self) -> list[GrantRecord]:
        return self._grants(self._db)

    def grant(self, grant_id: str) -> GrantRecord:
        return self._get(self._db, grant_id)

    def waiters(self) -> list[Waiter]:
        return self._waiters(self._db)

    def _waiters(self, db: sqlite3.Connection) -> list[Waiter]:
        rows = db.execute(
            "SELECT ticket, priority, enqueued, pid, pid_start, owner, request, devices, uid FROM waiters "
            "ORDER BY priority, ticket").fetchall()
        out, self._bad_waiters = [], []
        for t, p, e, pid, ps, o, r, d, u in rows:
            try:
                out.append(Waiter(t, p, e, pid, ps, o, request_from_json(json.loads(r)), tuple(json.loads(d or "[]")),
                                  int(u)))
            except (ValueError, TypeError, SpecError) as exc:  # reported and skipped; gone with its process
                self._bad_waiters.append(f"ledger {self.state.ledger}: queue ticket {t}: unreadable ({str(exc)[:80]}); "
                                         "skipped")
        return out

    def problems(self) -> list[str]:
        """What the ledger could not read at its last look (bad rows, lost grants), one line each, for ``ps``."""
        lost = [lost_refusal(str(self.state.ledger), self._live_lost)] if self._live_lost else []
        return [*self._problems, *self._bad_waiters, *lost]

    def node_state(self, grants: Sequence[HoldsGrant] | None = None, only: Sequence[str] = ()) -> NodeState:
        """The node as placement sees it: all devices (or ``only`` these UUIDs: a card, or one MIG
        instance; a card's UUID covers its instances) with the slices granted on them."""
        grants = self.grants() if grants is None else grants
        slices = [s for g in grants for s in g.slices]
        held = [s.device_uuid for g in grants if g.exclusive for s in g.slices]
        node = NodeState.from_devices(self.node_name, self.devices, slices, exclusive=held)
        if not only:
            return node
        return replace(node, devices=tuple(d for d in node.devices if d.uuid in only or d.parent_uuid in only))

    # -------------------------------------------------------------------------------------- changes
    def acquire(self, ask: Ask, *, wait: bool = False, ticket: int | None = None) -> GrantRecord | Queued:
        """Grant ``ask`` now, or (``wait``) queue it and say where it stands.

        Raises :class:`SpecError` (naming the field) for a request that cannot fit even on an empty node,
        and :class:`NoFit` when it does not fit now and ``wait`` is false. A compute-only request is granted
        the same fraction of each device's memory (:meth:`Request.with_default_memory`), and recorded so. An
        ask whose engine was left to gpuslice (``Ask.engine_auto``) and placed spatial whose MPS daemon cannot
        start is granted time-sliced instead (the failure is logged): the default never fails where the
        time-sliced engine would serve."""
        try:
            return self._acquire(ask, wait=wait, ticket=ticket)
        except SpatialUnavailable as exc:
            if not ask.engine_auto:
                raise
            log.warning("engine auto: %s; granting the time-sliced engine instead", exc)
            why = f"{exc}, so the time-sliced engine was tried"  # the cause is on the node, not in the ask
            try:
                got = self._acquire(_timesliced(ask), wait=wait, ticket=ticket)
            except NoFit as refused:
                raise NoFit(f"{refused.reason}\nalso: {why}", refused.per_node) from None
            return replace(got, reason=f"{got.reason}; {why}") if isinstance(got, Queued) else got

    def _acquire(self, ask: Ask, *, wait: bool, ticket: int | None) -> GrantRecord | Queued:
        ask = replace(ask, request=ask.request.with_default_memory())
        policy = parse_policy(ask.policy)
        if ask.engine_auto and not self.mps.available():  # no MPS here: the time-sliced engine, no other
            ask = _timesliced(ask)
        elif ask.request.engine is Engine.SPATIAL and not self.mps.available():
            raise SpecError("engine", "spatial", "timeslice on this node: it has no nvidia-cuda-mps-control (the "
                            "driver's MPS binaries; GPUSLICE_MPS_CONTROL names another path)")
        empty = self.empty_node(ask.devices)
        refusal = never_fits(ask.request, empty, restricted=bool(ask.devices))
        if refusal is not None:
            raise refusal
        mine = candidate_devices(ask.request, empty)
        with self._tx() as db:
            self._reclaim(db)
            if self._live_lost:
                raise LedgerError(lost_refusal(str(self.state.ledger), self._live_lost))
            if ticket is not None:
                self._check_ticket(db, ticket, ask)
            owner_uid = _owner_uid(ask)  # the queue's, the room's, the record's and its daemons' user: one answer
            if wait and ticket is None:
                ticket = self._enqueue(db, ask, owner_uid)
            ahead = self._competing(db, ask, owner_uid, ticket if wait else None, mine)
            reserved = frozenset().union(*ahead.values()) if ahead else frozenset()
            granted = self._grants(db)
            node = self.node_state([*granted, *(b.grant for b in self._bad if b.grant is not None)], ask.devices)
            room = spatial_room(granted, owner_uid)
            try:
                placed, ask = place_ask(ask, restrict(node, drop=reserved), policy, room)
            except NoFit as exc:
                reason, plain = self._why_waiting(ask, node, policy, len(ahead), room)
                if not wait:
                    if plain is None:  # it fits, but only on devices that waiters ahead of it want
                        raise NoFit(reason + "; use --wait to queue behind them", exc.per_node) from None
                    # sizes that fit now: not on devices the waiters ahead hold back (they would be refused
                    # again, "use --wait to queue behind them")
                    text = nofit.refusal(plain, node, self.devices, ask.request, wait=False,
                                         usable=usable_devices(ask, restrict(node, drop=reserved), room))
                    names = device_names(self.devices)
                    held = ", ".join(sorted(names.get(u, u) for u in reserved))
                    also = (f"\nalso: {len(ahead)} request(s) ahead in the queue hold {held} back for themselves"
                            if ahead else "")
                    raise NoFit(text + also, exc.per_node) from None
                return Queued(ticket=ticket or 0, position=len(ahead) + 1, reason=reason)
            grant_id = new_grant_id()
            keys = daemon_keys(placed.slices, owner_uid)
            record = GrantRecord(
                grant=Grant(grant_id, placed.slices, placed.exclusive), owner=ask.owner, request=ask.request,
                created=time.time(), holder_pid=ask.holder_pid, holder_start=ask.holder_start, uid=owner_uid,
                command=ask.command, slice_file=str(self.state.slice_file(grant_id)),
                region_file=str(self.state.region_file(grant_id)),
                mps_pipe_dir=str(self.mps.pipe_dir(keys[0])) if keys else "", oom=ask.oom)
            db.execute("INSERT INTO grants (id, record) VALUES (?, ?)",
                       (record.grant_id, json.dumps(record.to_json())))
            if ticket is not None:
                db.execute("DELETE FROM waiters WHERE ticket = ?", (ticket,))
            try:  # inside the transaction: a failure rolls the grant back, nothing half-applied
                write_grant_files(record, self.state)
                self._start_daemons(keys)
            except BaseException:
                remove_grant_files(record.grant_id, self.state)
                raise
            return record

    def _start_daemons(self, keys: Sequence[DaemonKey]) -> None:
        """First use of a device's daemon starts it. A daemon that cannot start (MpsError, or OSError: its
        folders could not be made) is :class:`SpatialUnavailable`; the grant's own files failing is not, and
        is raised as it is (an auto ask must not retry time-sliced on a full disk)."""
        for key in keys:
            try:
                self.mps.ensure(key)
            except (MpsError, OSError) as exc:
                raise SpatialUnavailable(f"engine spatial: {exc}") from None

    @staticmethod
    def _check_ticket(db: sqlite3.Connection, ticket: int, ask: Ask) -> None:
        """A queue ticket belongs to the request that queued it: the same holder process (pid + start time),
        which the agent has checked is the caller's own. Anyone else's ticket is refused, and nothing changes
        (issue 15: a ticket taken over took the grant and the owner's place in the queue)."""
        row = db.execute("SELECT pid, pid_start FROM waiters WHERE ticket = ?", (ticket,)).fetchone()
        if row is None:
            raise SpecError("ticket", ticket, "a queue ticket this request holds; it is not in the queue (granted, "
                                              "cancelled, or its process ended): ask again without a ticket")
        if tuple(row) != (ask.holder_pid, ask.holder_start):
            raise Forbidden(f"queue ticket {ticket} belongs to another request (holder process {row[0]}), "
                            f"not to holder process {ask.holder_pid}")

    def empty_node(self, only: Sequence[str] = ()) -> NodeState:
        """The node with nothing granted (restricted to ``only`` when given): what could ever fit."""
        node = NodeState.from_devices(self.node_name, self.devices)
        return restrict(node, only) if only else node

    def _why_waiting(self, ask: Ask, node: NodeState, policy: PlacementPolicy, ahead: int,
                     room: SpatialRoom = SpatialRoom()) -> tuple[str, str | None]:
        """Why a request is not placed now, in one line (the queue shows it), devices named by index; and
        placement's own reason when it does not fit even ignoring the queue (None: only waiters ahead of it
        hold it back)."""
        try:
            place_ask(ask, node, policy, room)
        except NoFit as plain:  # it does not fit even ignoring the queue: say what is free
            text = (f"{local_words(plain.reason, node, self.devices)}; "
                    f"free now: {describe_free(node, device_names(self.devices))}")
            return text + (f"; and {ahead} request(s) ahead in the queue want these devices" if ahead else ""), \
                plain.reason
        return (f"{ahead} request(s) wait ahead in the queue for the devices this one could use "
                f"(it fits now only on devices they wait for)"), None

    def resize(self, grant_id: str, change: Resize) -> Resized:
        """Give a granted slice new sizes where it is (live resize), or refuse with :class:`NoFit`.

        In one transaction (the ledger's write lock: no other resize or grant sees the same free memory):
        placement's rules decide whether the new sizes fit beside every other slice; a memory limit below
        what the slice's live processes hold now is refused saying how much is in use, unless
        ``change.evict``; then the record and the slice file (generation + 1, renamed into place) change
        together, and running enforcers follow within a second. Evicted processes get SIGTERM once the
        change is recorded (the grant stays; ``run`` ends when its command does)."""
        with self._tx() as db:
            record = self._get(db, grant_id)
            if record.ending_since:
                raise GpusliceError(f"grant {grant_id} is ending (its holder is gone): nothing to resize")
            new = resized_slices(record.grant, change, {d.uuid: d.memory_total for d in self.empty_node().devices})
            names = device_names(self.devices)
            resize(self.node_state(self._grants(db)), record.slices, new, exclusive=record.exclusive,
                   names=names)
            limits = {s.device_uuid: s.memory_limit for s in new}
            over = below_usage(record.watched(), limits, names)
            if over and not change.evict:
                raise NoFit(f"memory: {over}; free memory in the program first, or resize with --evict to end "
                            "the slice's processes that hold it")
            record = replace(record, grant=replace(record.grant, slices=new), generation=record.generation + 1,
                             request=resized_request(record.request, change))
            db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record.to_json()), grant_id))
            write_grant_files(record, self.state)  # inside the transaction: a failure records nothing
        evicted = evict(record, limits) if over else ()
        live = share_live(record) if (change.compute, change.mode, change.priority) != (None, None, None) else ()
        return Resized(record, evicted, live)

    def cancel(self, ticket: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM waiters WHERE ticket = ?", (ticket,))

    def set_child(self, grant_id: str, child_pid: int, child_start: int) -> GrantRecord:
        """Record the launched process (its process group holds the grant too)."""
        with self._tx() as db:
            record = replace(self._get(db, grant_id), child_pid=child_pid, child_start=child_start)
            db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record.to_json()), grant_id))
            return record

    def release(self, grant_id: str) -> bool:
        """End a grant (and the MPS daemon its spatial slice was the last of); False if it was already gone."""
        with self._tx() as db:  # the folder goes before the row is committed: a folder never outlives its row
            gone = db.execute("DELETE FROM grants WHERE id = ?", (grant_id,)).rowcount
            self._reconcile_mps(db)
            remove_grant_files(grant_id, self.state)
        return bool(gone)

    def reconcile_rosters(self, older_than: float = ROSTER_GRACE) -> RosterChanges:
        """Make the devices' policy rosters say what the ledger says (:func:`reconcile_policies`): a grant from
        before the roster existed, or whose file went missing, would count for nothing in its neighbours'
        allocation. In one transaction with the search for lost grants, so that nothing granted or released
        meanwhile is undone: grants whose row was lost but whose processes still run keep their entries, and so
        do rows that no longer decode (written again where their slices still read)."""
        with self._tx() as db:
            grants, keep = self._books(db)
            wanted = {g.grant_id: g.slices for g in grants}
            wanted.update({b.grant_id: b.grant.slices for b in self._bad if b.grant is not None})
            daemons = {g.grant_id: g.mps_pipe_dir for g in grants if g.mps_pipe_dir}
            return reconcile_policies(self.state.device_state, wanted, older_than=older_than, keep=keep, daemons=daemons)

    def reconcile_records(self, older_than: float = ROSTER_GRACE) -> RecordChanges:
        """Make the slice record files follow the ledger (:func:`reconcile_grant_records`): each grant's made where
        missing, those of grants the ledger no longer holds removed; lost grants whose processes still run and rows
        that no longer decode keep theirs. In one transaction with the search for lost grants, as the rosters'."""
        with self._tx() as db:
            grants, keep = self._books(db)
            return reconcile_grant_records(self.state, grants, keep, older_than)

    def _books(self, db: sqlite3.Connection) -> tuple[list[GrantRecord], list[str]]:
        """The grants that decode, and the ids whose files stay whatever the books say (lost grants still carried
        by processes, rows that no longer decode)."""
        grants = self._grants(db)
        self._find_lost(db)
        return grants, [g.grant_id for g in self._live_lost] + [b.grant_id for b in self._bad]

    def reclaim(self) -> list[str]:
        """Release grants (and forget waiters) whose processes are all gone; the ids released."""
        with self._tx() as db:
            return self._reclaim(db)

    # -------------------------------------------------------------------------------------- helpers
    def _grants(self, db: sqlite3.Connection) -> list[GrantRecord]:
        """The records that decode; the others are reported by grant id and skipped (:mod:`ledgercheck`)."""
        good, self._bad = decode_rows(db.execute("SELECT id, record FROM grants ORDER BY rowid").fetchall())
        self._problems = [b.describe(str(self.state.ledger)) for b in self._bad]
        return good

    def _get(self, db: sqlite3.Connection, grant_id: str) -> GrantRecord:
        row = db.execute("SELECT id, record FROM grants WHERE id = ?", (grant_id,)).fetchone()
        if row is None:
            raise UnknownGrant(grant_id)
        good, bad = decode_rows([row])
        if bad:
            raise LedgerError(bad[0].describe(str(self.state.ledger)))
        return good[0]

    def _find_lost(self, db: sqlite3.Connection) -> None:
        """Grant folders the ledger has no row for: remove those no process carries any more; remember those
        still carried (no grant is given while any is: :mod:`gpuslice.local.ledgercheck`)."""
        recorded = {r[0] for r in db.execute("SELECT id FROM grants").fetchall()}
        lost = lost_grants(self.state, recorded)
        for gone in (g for g in lost if not g.pids):
            remove_grant_files(gone.grant_id, self.state)
        self._live_lost = [g for g in lost if g.pids]

    def _enqueue(self, db: sqlite3.Connection, ask: Ask, me: int) -> int:
        """Queue ``ask`` of user ``me`` (:func:`_owner_uid`); its ticket."""
        check_queue_room(me, sum(1 for w in self._waiters(db) if queued_by(w) == me))
        cur = db.execute(
            "INSERT INTO waiters (priority, enqueued, pid, pid_start, owner, request, devices, uid) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (int(ask.request.priority), time.time(), ask.holder_pid, ask.holder_start, ask.owner,
             json.dumps(request_to_json(ask.request)), json.dumps(list(ask.devices)), me))
        return int(cur.lastrowid or 0)

    def _competing(self, db: sqlite3.Connection, ask: Ask, me: int, ticket: int | None,
                   mine: frozenset[str]) -> dict[int, frozenset[str]]:
        """Live waiters ahead of this request of user ``me`` (a queued ticket, or a newcomer) that could use a
        device it could use: ticket -> the devices that waiter could use (reserved for the queue). Who is ahead
        of whom: :func:`gpuslice.local.admission.holds_back`."""
        prio = int(ask.request.priority)
        found: dict[int, frozenset[str]] = {}
        for w in self._waiters(db):
            if not holds_back(queued_by(w), w.priority, w.ticket, me, prio, ticket):
                continue
            theirs = self._candidates(w)
            if theirs & mine:
                found[w.ticket] = theirs
        return found

    def _candidates(self, waiter: Waiter) -> frozenset[str]:
        key = (json.dumps(request_to_json(waiter.request), sort_keys=True), waiter.devices)
        cached = self._candidate_cache.get(key)
        if cached is None:
            if len(self._candidate_cache) > 256:
                self._candidate_cache.clear()
            cached = self._candidate_cache[key] = candidate_devices(waiter.request, self.empty_node(waiter.devices))
        return cached

    def _reclaim(self, db: sqlite3.Connection) -> list[str]:
        stats = procs.all_stats()
        live = {(s.pid, s.start) for s in stats}
        released = []
        for grant in self._grants(db):
            if (grant.holder_pid, grant.holder_start) in live:
                continue
            if self._end_processes(db, grant, stats):
                db.execute("DELETE FROM grants WHERE id = ?", (grant.grant_id,))
                remove_grant_files(grant.grant_id, self.state)
                released.append(grant.grant_id)
        for ticket, pid, start in db.execute("SELECT ticket, pid, pid_start FROM waiters").fetchall():
            if (pid, start) not in live:
                db.execute("DELETE FROM waiters WHERE ticket = ?", (ticket,))
        self._find_lost(db)
        self._reconcile_mps(db)
        return released

    def _reconcile_mps(self, db: sqlite3.Connection) -> Reconciled | None:
        """Run exactly the MPS daemons the recorded spatial grants need (under the ledger's write lock, so
        no other process grants or releases meanwhile). Problems are kept for ``ps``, never raised: a
        release or reclaim pass must not fail because a daemon would not stop."""
        grants = self._grants(db)
        owners: dict[DaemonKey, list[GrantRecord]] = {}
        for g in grants:
            for key in daemon_keys(g.slices, g.uid):
                owners.setdefault(key, []).append(g)
        if not owners and not self.mps.known():
            self.mps_problems = {}
            return None

        def busy(key: DaemonKey) -> bool:  # a live process of a slice served by the daemon: a client
            return any(self.region_pids(g) for g in owners.get(key, ()))

        try:
            done = self.mps.reconcile(owners, busy)
        except Exception as exc:  # noqa: BLE001 - see the docstring: whatever a tenant left in its daemon's
            # folders (helper 41: a tree too deep to remove) must not fail every grant, release and reclaim
            logging.getLogger("gpuslice.mps").warning("reconciling the MPS daemons failed: %r", exc)
            self.mps_problems = {key: f"reconciling the MPS daemons: {exc!r}" for key in owners}
            return None
        self.mps_problems = dict(done.problems)
        return done

    def _end_processes(self, db: sqlite3.Connection, grant: GrantRecord, stats: list[procs.ProcStat]) -> bool:
        """The holder of ``grant`` is gone: signal what is left of its processes; True when none is left."""
        found = slice_processes(grant, stats)
        if found.empty:
            return True
        now = time.time()
        since = grant.ending_since or now
        if now - since >= self.kill_grace:
            signals: tuple[int, ...] = (signal.SIGKILL,)
        else:  # SIGCONT: a stopped job (Ctrl-Z, then the launcher was killed) must run to see the SIGTERM
            signals = (signal.SIGTERM, signal.SIGCONT)
        for s in found.ours:
            for signum in signals:
                procs.signal_exact(s.pid, s.start, signum)
        if not grant.ending_since:
            record = replace(grant, ending_since=now)
            db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record.to_json()), grant.grant_id))
        if found.unsure or not _settled(found.ours):
            return False
        # They are gone; one of them may have forked just before: look once more.
        return slice_processes(grant, procs.all_stats()).empty


@dataclass(frozen=True)
class SliceProcesses:
    """The live processes of a grant whose holder is gone."""

    ours: tuple[procs.ProcStat, ...] = ()  # provably the grant's: the reclaimer ends them
    unsure: int = 0  # group members whose environment cannot be read: they keep the grant, unsignalled

    @property
    def empty(self) -> bool:
        return not self.ours and not self.unsure


def slice_processes(grant: GrantRecord, stats: list[procs.ProcStat]) -> SliceProcesses:
    """Which live processes are ``grant``'s, proven so that no stranger is ever signalled:

    * **lineage**: the launched process group (``child_pid``, members started at or after ``child_start``)
      while its leader is still the launched process (same start time: the pgid cannot have been reused;
      only the launcher's child could create that group, and only its session can join it);
    * once the leader is gone, the members carrying the grant's marker (``GPUSLICE_SLICE=<its slice
      file>``) in their environment; a member whose environment cannot be read (or is still being laid out by
      an ``exec``) is ``unsure``;
    * if the leader's pid now names another process, none of the group: a pid is reused only after its
      group has emptied;
    * **marker**: processes started since the holder that carry the marker (they left the group with
      ``setsid``, or the launcher died before it recorded ``child_pid``) and whose real uid is the grant's
      owner's: anyone can put the marker in their own environment, so it proves only processes the owner
      could signal anyway. A process of another user that carries it is neither signalled nor counted (it
      cannot keep someone's grant alive);
    * of a user's grant (``uid`` > 0) a group member of another user is never signalled (``unsure``: it keeps
      the grant).

    Nothing read from the slice's region counts: a region is written by the slice's own processes, so the
    pids it lists prove nothing (issue 15: a pid planted in a root grant's region made root kill it).
    """
    by_pid = {s.pid: s for s in stats}
    ours: dict[int, procs.ProcStat] = {}
    unsure = 0
    if grant.child_pid > 0:
        members = [s for s in stats if s.pgrp == grant.child_pid and s.start >= grant.child_start]
        leader = by_pid.get(grant.child_pid)
        if leader is not None and leader.start == grant.child_start:
            ours.update((s.pid, s) for s in members)
        elif leader is None:
            envs = procs.marked((s.pid for s in members), [grant.marker]) if grant.marker else {}
            for s in members:
                env = envs.get(s.pid)
                if env is None:
                    unsure += 1
                elif grant.marker in env:
                    ours[s.pid] = s
    if grant.marker:
        me = os.getpid()
        later = [s for s in stats if s.pid not in ours and s.pid != me and s.start >= grant.holder_start]
        envs = procs.marked((s.pid for s in later), [grant.marker])  # one wait for all (procs.marked)
        for s in later:
            env = envs[s.pid]
            if env is not None and grant.marker in env and _owners(grant, s.pid):
                ours[s.pid] = s
    if grant.uid > 0:  # a user's grant: never signal another user's process
        strangers = [pid for pid in ours if procs.uid_of(pid) not in (grant.uid, None)]
        for pid in strangers:
            del ours[pid]
        unsure += len(strangers)
    return SliceProcesses(tuple(ours.values()), unsure)


def spatial_room(grants: Sequence[GrantRecord], uid: int) -> SpatialRoom:
    """Where an ask of user ``uid`` (its grant's owner, :func:`_owner_uid`), were its engine left to gpuslice, may
    be spatial beside ``grants`` (:class:`SpatialRoom`)."""
    spatial = [(g.uid, s) for g in grants for s in g.slices if s.engine is Engine.SPATIAL]
    own = [s for owner, s in spatial if owner == uid]
    high = frozenset(s.device_uuid for s in own if s.priority is Priority.HIGH and s.colocation is Colocation.PREEMPTIVE)
    low = frozenset(s.device_uuid for s in own if yields(s))
    return SpatialRoom(foreign=frozenset(s.device_uuid for owner, s in spatial if owner != uid), own_high=high,
                       own_low_alone=low - high)


def _owner_uid(ask: Ask) -> int:
    """The grant's owner: the ask's uid, else (a root caller that gave none) its holder's real uid, so that
    every new grant names one (a grant of no owner proves nothing by its marker: :func:`_owners`). A holder
    that is gone (its pid, with its start time) is :class:`SpecError` on ``holder_pid``."""
    if ask.uid >= 0:
        return ask.uid
    uid = procs.real_uid(ask.holder_pid)
    # the pid read again with its start time: a holder that ended before the read, its pid taken by another
    # user's process, would make the grant (files, MPS daemon) that user's; a grant for a gone holder would
    # only be reclaimed, so it is refused as the agent refuses one (agent._checked_ask)
    if uid is None or not procs.alive(ask.holder_pid, ask.holder_start):
        raise SpecError("holder_pid", ask.holder_pid, LIVE_HOLDER)
    return uid


def queued_by(waiter: Waiter) -> int | None:
    """The user a queue ticket is of, while its holder lives (None once it is gone: it holds nobody back). The
    uid recorded when it was queued; for a row from before schema 3, the holder's real uid (the user who may
    signal it), never the owner of /proc/<pid>, which a setuid program makes root's."""
    if not procs.alive(waiter.pid, waiter.pid_start):
        return None
    return waiter.uid if waiter.uid >= 0 else procs.real_uid(waiter.pid)


def _owners(grant: GrantRecord, pid: int) -> bool:
    """Whether ``pid`` runs as the grant's owner (its real uid). A grant of unknown owner (uid -1) is reclaimed
    once its holder is gone, so no owner can be learnt from it: its marker proves nobody (issue 15: it proved
    anybody, and the backstop's same rule let a tenant's process count against a root grant)."""
    return grant.uid >= 0 and procs.real_uid(pid) == grant.uid


def _settled(signalled: Sequence[procs.ProcStat], wait: float = SETTLE_S) -> bool:
    """Whether the signalled processes are gone (zombies count as gone), waiting up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while any(procs.alive(s.pid, s.start) for s in signalled):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def daemon_keys(slices: Sequence, uid: int) -> list[DaemonKey]:
    """The MPS daemons the spatial ``slices`` of a grant of user ``uid`` are clients of: one per device, run as
    that user when the node side is root (MPS serves one user per server at a time), else as the node side's
    own user."""
    return [DaemonKey.for_client(s.device_uuid, uid) for s in slices if s.engine is Engine.SPATIAL]


def parse_policy(text: str) -> PlacementPolicy:
    """``binpack`` or ``node=spread,gpu=binpack``; a bad one is refused naming the field ``policy``."""
    from gpuslice.placement import POLICIES

    try:
        return PlacementPolicy.parse(text)
    except SpecError:
        raise SpecError("policy", text, "one of " + ", ".join(POLICIES) + ", or node=<policy>,gpu=<policy>") from None


def new_grant_id() -> str:
    return "g-" + secrets.token_hex(4)
