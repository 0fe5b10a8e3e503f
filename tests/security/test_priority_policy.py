"""Who may ask for high priority (issue 15): a high-priority slice makes the low-priority slices on its devices
wait while its work is queued, so on a shared machine asking for it is asking to slow other users down. A root
agent started with ``--high-priority`` grants it only to root and the users and groups it names; everyone else
gets a 403 naming the field and who may, for a new grant and for a resize alike. The default (``*``) keeps the
single-user behaviour: anyone may."""

from __future__ import annotations

import os

import pytest
from nodekit import AgentProcess
from tenantkit import Node, wait_for

from gpuslice.local.admission import HighPriorityPolicy
from gpuslice.spec import SpecError

REFUSED = "priority high is not allowed for user"


@pytest.fixture
def guarded(bare_node: Node, tenants) -> Node:
    """A root agent that allows high priority to root and the first tenant only."""
    a, _ = tenants
    bare_node.agent = AgentProcess(bare_node.env, interval=0.2, reclaim_interval=0.3,
                                   extra=("--high-priority", f"root,{a.name}"))
    return bare_node


def test_only_the_named_users_and_root_get_high_priority(guarded: Node, tenants):
    a, b = tenants
    refused = guarded.cli(b, "run", "--memory", "64MiB", "--priority", "high", "--", "true")
    assert refused.returncode != 0 and REFUSED in refused.stderr and b.name in refused.stderr, refused.stderr
    assert f"root, {a.name}" in refused.stderr and "--high-priority" in refused.stderr, refused.stderr
    assert guarded.grants() == []  # nothing granted, nothing half applied
    for who in (b, a, None):  # low priority for anyone; high for the named user and root
        priority = "low" if who is b else "high"
        done = guarded.cli(who, "run", "--memory", "64MiB", "--priority", priority, "--", "true")
        assert done.returncode == 0, (who, done.stderr)


def test_a_tenant_cannot_resize_itself_to_high_priority(guarded: Node, tenants):
    _, b = tenants
    holder = guarded.gpuslice(b, "run", "--memory", "64MiB", "--priority", "low", "--", "sleep", "600")
    (grant,) = wait_for(guarded.grants, "the tenant's grant")
    done = guarded.cli(b, "resize", grant["grant_id"], "--priority", "high")
    assert done.returncode != 0 and REFUSED in done.stderr, done.stderr
    (still,) = guarded.grants()
    assert still["priority"] == "low", still  # unchanged
    holder.kill()


def test_the_policy_reads_users_uids_and_groups_and_refuses_unknown_names():
    me = os.getuid()
    p = HighPriorityPolicy.parse(f"root,{me},@0")
    assert not p.anyone and p.allows(0) and p.allows(me) and p.allows(54321, [0]) and not p.allows(54321, [54321])
    assert HighPriorityPolicy.parse("*").allows(54321)  # the default: anyone
    assert HighPriorityPolicy.parse("root").describe() == "root"
    for bad in ("", "no-such-user-here", "root,,x", "@no-such-group-here", "*,root"):
        with pytest.raises(SpecError) as err:
            HighPriorityPolicy.parse(bad)
        assert err.value.field == "high_priority", bad
