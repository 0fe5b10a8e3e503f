"""The ``GPUSLICE_SLICE`` marker proves a process is a grant's only for the grant owner's processes: anyone may
put it in their own environment. A grant whose record names no owner (``uid`` -1: a root caller that gave none,
or an old ledger) counted every user's marked process before (issue 15, attacker's review): tenant b could make
a root grant's usage look over its limit, and the backstop would then kill the grant's processes. Now such a
grant is owned by its live holder's user (backstop), and once the holder is gone (reclaim) its marker proves
nobody."""

from __future__ import annotations

import time

from tenantkit import Node, wait_for

from gpuslice.host import procs
from gpuslice.local.ledger import slice_processes
from gpuslice.local.membership import attribute
from gpuslice.local.records import GrantRecord
from gpuslice.spec import GiB, Grant, Request, Slice, parse_memory


def _grant(slice_file: str, holder: int, uid: int = -1) -> GrantRecord:
    return GrantRecord(grant=Grant("g-root", (Slice("GPU-x", 4 * GiB),)), owner="root", request=Request(memory=parse_memory("4GiB")),
                       created=time.time(), holder_pid=holder, holder_start=procs.start_time(holder), uid=uid,
                       slice_file=slice_file)


def _marked(node: Node, tenant, slice_file: str):
    proc = node.popen(tenant, ["sleep", "300"], env=node.env_for(tenant, GPUSLICE_SLICE=slice_file))
    wait_for(lambda: procs.environ_has(proc.pid, f"GPUSLICE_SLICE={slice_file}"), "the marked process")
    return proc


def test_a_tenants_marked_process_does_not_count_against_a_grant_of_no_recorded_owner(bare_node: Node, tenants):
    _, b = tenants
    slice_file = str(bare_node.state / "grants" / "g-root" / "slice")
    holder = bare_node.popen(None, ["sleep", "300"])  # a root holder (none of the processes below descends from it)
    grant = _grant(slice_file, holder.pid)
    theirs = _marked(bare_node, b, slice_file)
    mine = _marked(bare_node, None, slice_file)
    assert attribute([grant], [theirs.pid, mine.pid]) == {mine.pid: "g-root"}  # the holder's user's only
    assert attribute([_grant(slice_file, holder.pid, uid=b.uid)], [theirs.pid]) == {theirs.pid: "g-root"}
    for proc in (theirs, mine, holder):
        proc.kill()


def test_once_its_holder_is_gone_the_marker_of_such_a_grant_proves_nobody(bare_node: Node, tenants):
    _, b = tenants
    slice_file = str(bare_node.state / "grants" / "g-root" / "slice")
    holder = bare_node.popen(None, ["sleep", "300"])
    grant = _grant(slice_file, holder.pid)
    holder.kill()
    holder.wait()
    theirs = _marked(bare_node, b, slice_file)
    found = slice_processes(grant, procs.all_stats())
    assert theirs.pid not in {s.pid for s in found.ours}  # root would have signalled b's process
    theirs.kill()
