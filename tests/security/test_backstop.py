"""The backstop holds a slice's memory limit against processes that step around the enforcer, in the real root
agent, with tenants' processes; NVML's per-process count is stood in for by ``$GPUSLICE_GPU_PROCESSES`` (the
GPU run of the same check: tests/host/test_gpu_backstop.py, bench/backstop_detection.sh).

Issue 15: processes of one slice that rewrite their shared region (or that clear LD_PRELOAD, or are statically
linked) could together hold N times the limit; GPU processes of no slice were invisible.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tenantkit import Node, double_uuid, wait_for

MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture
def watched_node(bare_node: Node) -> Node:
    """A root agent whose backstop reads per-process device memory from a file the test writes (kill policy,
    grace 1 s)."""
    from nodekit import AgentProcess

    procs_file = bare_node.base / "gpu-processes.json"
    bare_node.report = lambda entries: _write(procs_file, entries)  # type: ignore[attr-defined]
    bare_node.report([])
    bare_node.env["GPUSLICE_GPU_PROCESSES"] = str(procs_file)
    bare_node.agent = AgentProcess(bare_node.env, interval=0.2, reclaim_interval=0.3,
                                   extra=("--backstop", "kill", "--backstop-grace", "1"))
    return bare_node


def _write(path, entries) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"uuid": u, "pid": p, "used": b} for u, p, b in entries]))
    os.replace(tmp, path)


def _status(node: Node) -> dict:
    """The agent's node view, straight from its socket (a `ps` process takes a second to start here)."""
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(node.state / "agent.sock")), timeout=30) as http:
        return http.get("http://agent/v1/status").json()


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_colluding_processes_of_a_slice_over_its_limit_are_reported_then_killed(watched_node: Node, tenants):
    node, (a, _) = watched_node, tenants
    run = node.gpuslice(a, "run", "--device", "0", "--memory", "1GiB", "--", "sh", "-c",
                        "sleep 600 & sleep 600 & sleep 600 & wait")
    sleepers = wait_for(lambda: [c for sh in _children_of_run(run.pid) for c in _children(sh)]
                        if len(_grandchildren(run.pid)) == 3 else None, "the slice's three processes")
    # Each process holds 600 MiB in NVML's count: 1.8 GiB together, on a 1 GiB slice (each alone is under it).
    # `started` is taken before the count is written: the agent can see it no earlier, so its grace starts no
    # earlier. Taken after, a test descheduled between the write and the clock read (a loaded 2-core machine)
    # let the agent's grace start first, and `killed >= 1.0` failed though the agent waited the full grace.
    started = time.monotonic()
    node.report([(double_uuid(0), p, 600 * MiB) for p in sleepers])
    reported = killed = None
    while time.monotonic() - started < 60 and killed is None:
        status = _status(node)
        over = status["backstop"].get("overruns")
        if over and reported is None:
            reported = time.monotonic() - started
            assert over[0]["used"] == 1800 * MiB and over[0]["limit"] == GiB
            assert sorted(over[0]["pids"]) == sorted(sleepers)
        if not any(_alive(p) for p in sleepers):
            killed = time.monotonic() - started
        time.sleep(0.02)
    assert reported is not None and killed is not None, (reported, killed, status["backstop"])
    # The status of the last pass was read before the processes were seen dead: the agent may have killed
    # them after serving it and before publishing the pass that killed (kills_total still []). Read it again
    # until that pass is published.
    status = wait_for(lambda: (s := _status(node))["backstop"].get("kills_total") and s, "the kills to be published")
    assert [k["kills"] for k in status["backstop"]["kills_total"]] == [3]
    assert killed >= 1.0, (reported, killed)  # not before the grace (counted from when NVML showed it)
    run.wait(timeout=60)  # the run's command ends with them (sh's `wait` returns), and its grant goes
    node.report([])
    wait_for(lambda: not _status(node)["slices"], "the grant to be released")
    print(f"reported after {reported:.2f} s, killed after {killed:.2f} s (grace 1 s, sampling 0.2 s)")


def _children_of_run(pid: int) -> list[int]:
    return _children(pid)


def _grandchildren(pid: int) -> list[int]:
    return [g for c in _children(pid) for g in _children(c)]


def test_a_gpu_process_of_no_slice_is_reported_not_killed(watched_node: Node):
    node = watched_node
    stranger = node.popen(None, ["sleep", "600"])
    node.report([(double_uuid(1), stranger.pid, 3 * GiB)])
    found = wait_for(lambda: _status(node)["backstop"].get("unattributed"), "the stranger to be reported")
    assert [(p["pid"], p["used"], p["device_uuid"]) for p in found] == [(stranger.pid, 3 * GiB, double_uuid(1))]
    metrics = node.cli(None, "ps").stdout
    assert "no slice" in metrics and str(stranger.pid) in metrics
    _sampled_past_the_grace(node, lambda s: [p["pid"] for p in s["backstop"]["unattributed"]] == [stranger.pid])
    assert stranger.poll() is None


def test_a_tenant_cannot_make_anothers_slice_look_over_its_limit(watched_node: Node, tenants):
    """b's process carries a's marker (GPUSLICE_SLICE of a's grant): it is not a's, so a is not over its limit
    and nobody is killed; b's process shows as belonging to no slice."""
    node, (a, b) = watched_node, tenants
    run = node.gpuslice(a, "run", "--device", "0", "--memory", "1GiB", "--", "sleep", "600")
    slice_file = wait_for(lambda: next((str(p / "slice") for p in (node.state / "grants").iterdir()), None)
                          if (node.state / "grants").is_dir() else None, "a's grant")
    forger = node.popen(b, ["sleep", "600"], env=node.env_for(b, GPUSLICE_SLICE=slice_file))
    node.report([(double_uuid(0), forger.pid, 4 * GiB)])
    found = wait_for(lambda: _status(node)["backstop"].get("unattributed"), "the forger to be seen")
    assert [p["pid"] for p in found] == [forger.pid]
    assert not _status(node)["backstop"].get("overruns")
    _sampled_past_the_grace(node, lambda s: [p["pid"] for p in s["backstop"]["unattributed"]] == [forger.pid]
                            and not s["backstop"]["overruns"])
    assert forger.poll() is None and run.poll() is None


GRACE = 1.0  # watched_node's --backstop-grace
SAMPLE = 0.2  # and --interval


def _sampled_past_the_grace(node: Node, holds) -> None:
    """Wait until the agent has sampled (and so run the backstop) past the grace since it first saw what the
    test set up, with ``holds(status)`` true in every sample on the way; then one sample more, so that a kill
    made in the pass that crossed the grace has been delivered. "Not killed" then means the agent looked and
    let it be, not that it had not looked yet (a fixed sleep passed on a loaded machine whose agent had not
    sampled at all)."""
    first = _status(node)
    assert holds(first), first["backstop"]
    seen = [first["time"]]

    def past() -> bool:
        status = _status(node)
        assert holds(status), status["backstop"]
        if status["time"] != seen[-1]:
            seen.append(status["time"])
        return status["time"] >= first["time"] + GRACE and len(seen) >= 3

    wait_for(past, f"the agent to sample {GRACE:g} s past the first sample", every=0.05)
    last = seen[-1]
    wait_for(lambda: _status(node)["time"] > last, "one more sample", every=0.05)
