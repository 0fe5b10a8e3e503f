"""Two tenants racing for one device never over-commit it, and nothing is leaked when runs, waiters or the agent
are SIGKILLed (issue 15 found these held; they are pinned here so they keep holding).
"""

from __future__ import annotations

import json
import signal
import subprocess

from tenantkit import Node, wait_for

GiB = 1 << 30
RACERS = 10  # per tenant
SLICE_GIB = 3  # 5 fit on the double's 16 GiB device


def _ps(node: Node) -> dict:
    done = node.cli(None, "ps", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _race(node: Node, who: list) -> list[subprocess.Popen]:
    runs = [node.gpuslice(t, "run", "--device", "0", "--memory", f"{SLICE_GIB}GiB", "--", "sleep", "600")
            for t in who]
    settled = lambda: sum(r.poll() is not None for r in runs) + len(_ps(node)["slices"]) >= len(runs)  # noqa: E731
    wait_for(settled, "every racer to be granted or refused", timeout=240, every=0.5)
    return runs


def _check_no_over_commit(node: Node, runs: list[subprocess.Popen]) -> None:
    slices = _ps(node)["slices"]
    assert sum(s["memory_limit"] for s in slices) <= 16 * GiB
    assert len(slices) == 16 // SLICE_GIB, [s["grant_id"] for s in slices]  # exactly what fits, no more
    refused = [r for r in runs if r.poll() is not None]
    assert len(refused) == len(runs) - len(slices)
    for r in refused:
        out, err = r.communicate()
        assert r.returncode == 1 and "Traceback" not in err, err


def test_two_tenants_racing_through_the_agent_never_over_commit(node: Node, tenants):
    a, b = tenants
    runs = _race(node, [a, b] * RACERS)
    _check_no_over_commit(node, runs)
    for r in runs:
        r.kill()
    wait_for(lambda: not _ps(node)["slices"], "every grant to be released", timeout=120, every=0.5)


def test_root_runs_racing_on_the_ledger_file_never_over_commit(bare_node: Node):
    runs = _race(bare_node, [None] * RACERS)
    _check_no_over_commit(bare_node, runs)


def test_sigkilled_runs_waiters_and_agent_leak_nothing(node: Node, tenants):
    from nodekit import AgentProcess

    a, b = tenants
    held = node.gpuslice(a, "run", "--device", "0", "--memory", "10GiB", "--", "sleep", "600")
    wait_for(lambda: _ps(node)["slices"], "a's grant")
    waiter = node.gpuslice(b, "run", "--device", "0", "--memory", "10GiB", "--wait", "--", "sleep", "600")
    wait_for(lambda: _ps(node)["waiters"], "b waiting")
    other = node.gpuslice(b, "run", "--device", "1", "--memory", "4GiB", "--", "sleep", "600")
    wait_for(lambda: len(_ps(node)["slices"]) == 2, "b's grant on device 1")
    node.agent.proc.send_signal(signal.SIGKILL)  # the agent dies with grants and a waiter in its ledger
    node.agent.proc.wait()
    node.agent = AgentProcess(node.env, interval=0.2, reclaim_interval=0.3)
    assert len(_ps(node)["slices"]) == 2  # nothing forgotten: the ledger is the truth, not the agent
    waiter.send_signal(signal.SIGKILL)  # a waiter dies: it leaves the queue
    wait_for(lambda: not _ps(node)["waiters"], "the dead waiter to leave the queue", timeout=60)
    held.send_signal(signal.SIGKILL)  # a run dies: its command is ended and its grant freed
    other.send_signal(signal.SIGKILL)
    wait_for(lambda: not _ps(node)["slices"], "both grants to be reclaimed", timeout=120, every=0.5)
    leftovers = [p for p in _sleeps_of(a.uid) + _sleeps_of(b.uid)]
    assert not leftovers, f"processes of the killed runs are still alive: {leftovers}"


def _sleeps_of(uid: int) -> list[int]:
    import os

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X") and "(sleep)" in stat:
            found.append(int(entry))
    return found
