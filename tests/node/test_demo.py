"""The GPU demo's plumbing on CPU: two slices on GPU 0 of a snapshot, a stand-in workload, the live table."""

from __future__ import annotations

import sys

from gpuslice.node.demo import run_gpu_demo

FAKE = ("import json, sys, time; name, secs = sys.argv[1], float(sys.argv[2]); time.sleep(secs); "
        "print(json.dumps({'matmul_per_s': 10.0 if name == 'slice-a' else 20.0, 'cuda_total': 0}))")


def test_demo_runs_two_slices_and_reports(state_env, enforcer_lib, monkeypatch, capsys):
    monkeypatch.setenv("GPUSLICE_ENFORCER_LIB", str(enforcer_lib))
    results = run_gpu_demo(seconds=2.5, refresh=0.3, workload=(sys.executable, "-c", FAKE))
    out = capsys.readouterr().out
    assert [r["exit"] for r in results] == [0, 0]
    assert [r["matmul_per_s"] for r in results] == [10.0, 20.0]
    assert "throughput ratio slice-b / slice-a = 2.00" in out
    assert "4.0 GiB" in out and "8.0 GiB" in out  # the live table showed both slices' limits
