"""Who may be placed now: requests that can never fit, and which waiters hold a request back.

Pure functions over placement's plain data (no ledger, no clock), used by :class:`~gpuslice.local.ledger.Ledger`.

*Never fits*: a request that does not fit even on this node with nothing granted (more devices than the
node has, or than its ``--device`` restriction allows; more memory than any device holds) is refused at
once with a :class:`~gpuslice.spec.SpecError` naming the field, instead of waiting forever.

*Who may use a device*: a request's *candidate devices* are the devices (within its restriction) that could
hold one of its parts if they were empty. The queue rule (see local/README.md): a request is placed only on
devices that no waiter ahead of it could use. Devices a waiter ahead of it could use are *reserved* for the
queue; a newcomer for other devices (another GPU, or a card too small for the waiter) goes ahead at once.

*Whose waiters hold whom back* (:func:`holds_back`; issue 15, attacker's review: one user's waiting ticket, at a
priority any caller may ask for, held every other user's fitting request back): a user orders their own queue
(priority, then arrival); root's waiting tickets hold back everyone's requests that came later or ask for a
lower priority (root grants policy); a user's waiting ticket holds back no other user's request. A user may
have at most :data:`MAX_WAITING_PER_USER` requests waiting (:func:`check_queue_room`); root is not limited.
Users are told apart by their holder process's owner (which the agent checked is the caller's own).
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from gpuslice.placement import NodeState, fits
from gpuslice.placement.model import DeviceState, TaskShape
from gpuslice.spec import Request, SpecError, human_bytes

ROOT_UID = 0
# Waiting requests per user: a job array of a few runs queues at once; a user who wants more waits in a loop
# of their own. Bounds the work every acquire does over the queue (candidate devices per waiter).
MAX_WAITING_PER_USER = 16


def holds_back(waiter_uid: int | None, waiter_priority: int, waiter_ticket: int, uid: int | None, priority: int,
               ticket: int | None) -> bool:
    """Whether a waiter (its user, priority 0 high / 1 low, ticket) is ahead of a request of user ``uid`` with
    ``priority``, queued as ``ticket`` (None: a newcomer, behind every waiter by arrival). See the module doc."""
    if waiter_uid is None or waiter_ticket == ticket:
        return False
    earlier = ticket is None or waiter_ticket < ticket
    if waiter_uid == uid:
        return waiter_priority < priority or (waiter_priority == priority and earlier)
    if waiter_uid == ROOT_UID:
        return waiter_priority < priority or earlier
    return False


def check_queue_room(uid: int | None, waiting: int) -> None:
    """:class:`SpecError` (field ``wait``) when user ``uid`` already has :data:`MAX_WAITING_PER_USER` waiting."""
    if uid != ROOT_UID and waiting >= MAX_WAITING_PER_USER:
        raise SpecError("wait", True, f"at most {MAX_WAITING_PER_USER} waiting requests per user; user {uid} has "
                                      f"{waiting} (gpuslice ps lists them): cancel one, or ask again once one is placed")


def restrict(node: NodeState, keep: Iterable[str] | None = None, drop: Iterable[str] = ()) -> NodeState:
    """``node`` with only the devices in ``keep`` (a card's UUID keeps its MIG instances; None = all) and
    none of ``drop`` (placeable device UUIDs)."""
    keep = None if keep is None else set(keep)
    drop = set(drop)
    devices = tuple(d for d in node.devices
                    if (keep is None or d.uuid in keep or (d.parent_uuid and d.parent_uuid in keep))
                    and d.uuid not in drop)
    return replace(node, devices=devices)


def _part(request: Request) -> Request:
    """One device's part of ``request``: a whole-device request stays whole (exclusive)."""
    whole = TaskShape.of(request).whole
    return replace(request, count=1, exclusive=whole)


def candidate_devices(request: Request, empty: NodeState) -> frozenset[str]:
    """The devices of ``empty`` (a node with nothing granted, already restricted to the request's
    ``--device`` list) that could hold one device's part of ``request``."""
    part = _part(request)
    return frozenset(d.uuid for d in empty.devices if fits(part, replace(empty, devices=(d,))))


def _share_below_one_byte(request: Request, empty: NodeState) -> SpecError | None:
    """A memory share so small that it gives 0 bytes of some device (``0.0000000001%``): refused as the
    ``memory`` field, not left for the slice to fail on a limit of 0 (a percent rounds down to bytes)."""
    memory = request.memory
    if memory is None or memory.percent is None or not empty.devices:
        return None
    smallest = min(d.memory_total for d in empty.devices)
    if memory.resolve(smallest) >= 1:
        return None
    return SpecError("memory", str(memory), f"a share that gives at least 1 byte of every device (the smallest "
                     f"here holds {smallest} bytes), or a size like 4GiB")


def _cards(devices: Sequence[DeviceState]) -> int:
    """Devices a multi-device request can count: one MIG instance per card."""
    return len({d.parent_uuid or d.uuid for d in devices})


def never_fits(request: Request, empty: NodeState, *, restricted: bool = False) -> SpecError | None:
    """Why ``request`` cannot fit on ``empty`` (the node with nothing granted, restricted to the request's
    devices when ``restricted``), as a SpecError naming the field; None when it could fit."""
    tiny = _share_below_one_byte(request, empty)
    if tiny is not None:
        return tiny
    if fits(request, empty):
        return None
    has = "--device allows" if restricted else "this node has"
    total = _cards(empty.devices)
    if request.count > total:
        return SpecError("count", request.count, f"at most {total} ({has} {total} device(s))")
    matching = [d for d in empty.devices if d.matches(request.models)]
    if request.models and not matching:
        present = ", ".join(sorted({d.model for d in empty.devices})) or "none"
        return SpecError("models", "|".join(request.models), f"a model that {has}: {present}")
    if request.count > _cards(matching):
        return SpecError("count", request.count, f"at most {_cards(matching)} ({has} {_cards(matching)} "
                         f"device(s) of model {'|'.join(request.models)})")
    whole = TaskShape.of(request).whole
    if request.memory is not None and request.memory.bytes is not None:
        caps = sorted(((d.whole_capacity if whole else d.memory_capacity) for d in matching), reverse=True)
        cap = caps[min(request.count, len(caps)) - 1]
        if request.memory.bytes > cap:
            per = "on one device" if request.count == 1 else f"on each of {request.count} devices"
            where = " allowed by --device" if restricted else " of this node"
            return SpecError("memory", str(request.memory),
                             f"at most {human_bytes(cap)} {per} (the largest device{where} holds "
                             f"{human_bytes(caps[0])})")
    where = "the devices allowed by --device" if restricted else "this node"
    return SpecError("request", TaskShape.of(request).describe(), f"a request {where} can hold when nothing runs")


# ------------------------------------------------------------------------------------ high priority
@dataclass(frozen=True)
class HighPriorityPolicy:
    """Who may ask a root agent for high priority (``gpuslice agent --high-priority``; issue 15).

    A high-priority slice makes the low-priority slices on its devices wait while its work is queued (bounded:
    native/README-compute.md, "Co-location"), so asking for it is asking to slow other users down. Root may
    always; ``anyone`` keeps the single-user default; otherwise only the listed uids and members of the listed
    gids (primary or supplementary group) may. Plain data: the agent resolves names when it starts."""

    anyone: bool = True
    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str, field_name: str = "high_priority") -> "HighPriorityPolicy":
        """``*`` (anyone), or a comma list of user names, uids and ``@group`` names or gids; ``root`` alone means
        root only. An unknown user or group is a :class:`SpecError` naming the field."""
        allowed = "'*' (anyone), or a comma list of users, uids and @groups (e.g. root,alice,1001,@gpu-online)"
        items = [x.strip() for x in text.split(",")]
        if text.strip() == "*":
            return cls()
        if not text.strip() or any(not x or x == "*" for x in items):
            raise SpecError(field_name, text, allowed)
        uids, gids = set(), set()
        for item in items:
            group = item.startswith("@")
            name = item[1:] if group else item
            try:
                if name.isdigit():
                    (gids if group else uids).add(int(name))
                elif group:
                    gids.add(grp.getgrnam(name).gr_gid)
                else:
                    uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                raise SpecError(field_name, item, f"a {'group' if group else 'user'} of this machine; {allowed}") from None
        return cls(anyone=False, uids=frozenset(uids), gids=frozenset(gids))

    def allows(self, uid: int, gids: Iterable[int] = ()) -> bool:
        """Whether user ``uid`` (in groups ``gids``) may ask for high priority."""
        return self.anyone or uid == ROOT_UID or uid in self.uids or not self.gids.isdisjoint(gids)

    def describe(self) -> str:
        if self.anyone:
            return "anyone"
        names = ["root", *(user_name(u) for u in sorted(self.uids - {ROOT_UID})),
                 *("@" + _group_name(g) for g in sorted(self.gids))]
        return ", ".join(names)


def user_name(uid: int) -> str:
    """The user's name, or the uid as text when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
