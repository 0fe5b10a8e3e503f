"""The backstop's rules (gpuslice.host.backstop) over a stand-in for NVML, a fake clock and a recording kill:
NVML's count of a slice's processes, over the limit beyond the tolerance for longer than the grace, is killed;
shorter bursts and the report policy only report; processes of no slice are reported, never killed."""

from __future__ import annotations

import signal
import subprocess

import pytest

from gpuslice.host import procs
from gpuslice.host.backstop import Backstop, GpuProcess, Policy, Tracked, kill_exact
from gpuslice.host.monitor import NodeView, SliceView, with_backstop
from gpuslice.spec import SpecError

MiB, GiB = 1 << 20, 1 << 30
U0, U1 = "GPU-0", "GPU-1"


class World:
    def __init__(self):
        self.procs: list[GpuProcess] = []
        self.now = 100.0
        self.killed: list[int] = []
        self.members: dict[int, str] = {}

    def source(self):
        return list(self.procs)

    def kill(self, pid: int, start: int) -> bool:
        assert start == self.start_of(pid)
        self.killed.append(pid)
        return True

    def start_of(self, pid: int) -> int:
        return 1000 + pid

    def attribute(self, pids):
        return {p: self.members[p] for p in pids if p in self.members}


def backstop(world: World, **policy) -> Backstop:
    return Backstop(world.source, Policy(**policy), kill=world.kill, clock=lambda: world.now, start_of=world.start_of)


SLICES = [Tracked("g-a", U0, 4 * GiB, "alice"), Tracked("g-b", U0, 4 * GiB, "bob")]


def test_colluding_processes_over_the_limit_are_killed_after_the_grace():
    w = World()
    w.members = {10: "g-a", 11: "g-a", 12: "g-a", 20: "g-b"}
    w.procs = [GpuProcess(U0, 10, 3 * GiB), GpuProcess(U0, 11, 3 * GiB), GpuProcess(U0, 12, 3 * GiB),
               GpuProcess(U0, 20, 1 * GiB)]
    b = backstop(w, grace=5.0)
    first = b.check(SLICES, w.attribute)
    (over,) = first.overruns
    assert (over.grant_id, over.used, over.action, over.pids) == ("g-a", 9 * GiB, "reported", (10, 11, 12))
    assert w.killed == []  # reported at once, not killed yet
    w.now += 4.9
    assert b.check(SLICES, w.attribute).overruns[0].action == "reported"
    w.now += 0.2
    report = b.check(SLICES, w.attribute)
    assert report.overruns[0].action == "killed" and sorted(w.killed) == [10, 11, 12]  # g-b untouched
    assert report.kills == 3 and report.kills_total == {("g-a", U0): 3}
    assert report.seen == {("g-a", U0): 9 * GiB, ("g-b", U0): 1 * GiB}


def test_within_the_tolerance_nothing_happens():
    w = World()
    w.members = {10: "g-a"}
    w.procs = [GpuProcess(U0, 10, 4 * GiB + 200 * MiB)]  # 200 MiB over: within max(256 MiB, 2 %)
    b = backstop(w, grace=0.0)
    assert b.check(SLICES, w.attribute).overruns == () and w.killed == []
    w.procs = [GpuProcess(U0, 10, 4 * GiB + 300 * MiB)]
    assert b.check(SLICES, w.attribute).overruns[0].action == "killed"


def test_a_burst_shorter_than_the_grace_is_reported_only_and_forgotten():
    w = World()
    w.members = {10: "g-a"}
    b = backstop(w, grace=5.0)
    w.procs = [GpuProcess(U0, 10, 6 * GiB)]
    assert b.check(SLICES, w.attribute).overruns
    w.now += 3
    w.procs = [GpuProcess(U0, 10, 2 * GiB)]
    assert b.check(SLICES, w.attribute).overruns == ()
    w.now += 1
    w.procs = [GpuProcess(U0, 10, 6 * GiB)]  # over again: the grace starts afresh
    w.now += 4
    assert b.check(SLICES, w.attribute).overruns[0].action == "reported" and w.killed == []


def test_the_report_policy_never_kills():
    w = World()
    w.members = {10: "g-a"}
    w.procs = [GpuProcess(U0, 10, 8 * GiB)]
    b = backstop(w, action="report", grace=0.0)
    for _ in range(3):
        w.now += 10
        assert b.check(SLICES, w.attribute).overruns[0].action == "reported"
    assert w.killed == []


def test_processes_of_no_slice_are_reported_never_killed_nor_counted():
    w = World()
    w.members = {10: "g-a", 30: "g-a"}
    w.procs = [GpuProcess(U0, 10, 1 * GiB), GpuProcess(U0, 99, 70 * GiB),
               GpuProcess(U1, 30, 8 * GiB)]  # g-a's process on a device g-a does not hold
    report = backstop(w, grace=0.0).check(SLICES, w.attribute)
    assert report.overruns == () and w.killed == []
    assert sorted((s.device_uuid, s.pid) for s in report.unattributed) == [(U0, 99), (U1, 30)]


def test_nvml_failing_acts_on_nothing_and_says_why():
    def broken():
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    b = Backstop(broken, Policy(grace=0), kill=lambda pid, start: pytest.fail("killed on a failed read"))
    report = b.check(SLICES, lambda pids: {})
    assert "GPU_IS_LOST" in report.error and report.overruns == ()


def test_a_pid_reused_after_its_membership_was_proven_is_not_killed():
    """The backstop reads each GPU process's start time before proving whom it belongs to and kills only that
    process: a pid freed and taken by a newcomer after the proof (another start time) is not signalled. Before,
    the kill read the start time anew and would have killed the newcomer (issue 15's review)."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = procs.start_time(child.pid)
        assert start and not kill_exact(child.pid, start + 1) and child.poll() is None
        over = [Tracked("g-a", U0, GiB)]
        nvml = lambda: [GpuProcess(U0, child.pid, 9 * GiB)]  # noqa: E731
        proven = lambda pids: {child.pid: "g-a"}  # noqa: E731
        as_if_reused = Backstop(nvml, Policy(grace=0), start_of=lambda pid: start + 1)
        assert as_if_reused.check(over, proven).overruns[0].action == "kill failed" and child.poll() is None
        assert Backstop(nvml, Policy(grace=0)).check(over, proven).overruns[0].action == "killed"
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_off_and_no_source_are_said():
    assert Backstop(None, Policy()).check(SLICES, lambda pids: {}).policy.startswith("off")
    assert Backstop(lambda: [], Policy(action="off")).check(SLICES, lambda pids: {}).policy == "off"


@pytest.mark.parametrize("kwargs", [{"action": "nuke"}, {"grace": -1}, {"tolerance_bytes": -5}])
def test_a_bad_policy_is_refused_naming_it(kwargs):
    with pytest.raises(SpecError):
        Policy(**kwargs)


def test_the_node_view_carries_what_the_backstop_saw():
    w = World()
    w.members = {10: "g-a"}
    w.procs = [GpuProcess(U0, 10, 5 * GiB), GpuProcess(U0, 77, GiB)]
    report = backstop(w).check(SLICES, w.attribute)
    view = NodeView(time=1.0, node="n", devices=(), slices=(
        SliceView("g-a", "alice", U0, 0, 4 * GiB, 0, 0, 0, None, 0.0, 0, "low", "hard", (), 1.0, "x"),))
    seen = with_backstop(view, report)
    assert seen.slices[0].memory_seen == 5 * GiB
    assert seen.backstop["overruns"][0]["grant_id"] == "g-a"
    assert seen.backstop["unattributed"][0]["pid"] == 77
    from gpuslice.host.metrics import exposition

    text = exposition(lambda: seen).decode()
    assert 'gpuslice_backstop_over_limit_bytes{device="GPU-0",grant="g-a",node="n"} 1.073741824e+09' in text
    assert 'gpuslice_unattributed_memory_bytes{device="GPU-0",node="n",pid="77"}' in text
    assert 'gpuslice_slice_memory_seen_bytes{' in text


def test_the_gpu_benchmark_runs_end_to_end_without_a_gpu(tmp_path):
    """bench/backstop_detection.sh --dry-run: the same agent, runs and measurements, NVML stood in for."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(repo / "src")}
    done = subprocess.run([sys.executable, str(repo / "bench" / "gpu" / "backstop_detection.py"), "--dry-run",
                           "--repeats", "1", "--grace", "1", "--interval", "0.2"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {r["scenario"]: r for r in map(json.loads, (tmp_path / "backstop.jsonl").read_text().splitlines())}
    assert rows["bypass"]["killed"] and rows["collude"]["killed"] and not rows["honest"]["killed"]
    assert rows["bypass"]["ended_s"] >= 1.0
    assert "collude" in (tmp_path / "summary.txt").read_text()


def test_the_gpu_benchmarks_colluding_workers_get_their_source_intact(tmp_path, monkeypatch):
    """The GPU run's collude scenario starts its three workers from one shell line: each must get the real worker's
    source byte for byte (an apostrophe in a comment of it once ended the shell quoting, and no worker started)."""
    import importlib.util
    import subprocess
    from pathlib import Path

    monkeypatch.setenv("OUT", str(tmp_path))
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "backstop_detection.py"
    spec = importlib.util.spec_from_file_location("backstop_detection", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fake_python = tmp_path / "py"  # keeps the source it is given with -c, one file per worker
    fake_python.write_text('#!/bin/sh\nprintf %s "$2" > "$0.$$"\n')
    fake_python.chmod(0o755)
    awkward = mod.WORKER + "# it's \"quoted\", $HOME, `date`, \\ and a newline\n"
    for source in (mod.WORKER, awkward):
        for old in tmp_path.glob("py.*"):
            old.unlink()
        subprocess.run(["sh", "-c", mod.collude_script(str(fake_python), source)], check=True, timeout=30)
        got = sorted(tmp_path.glob("py.*"))
        assert len(got) == 3 and all(p.read_text() == source for p in got)
