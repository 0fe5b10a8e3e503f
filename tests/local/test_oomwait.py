"""oom_policy=wait from the local side: the run options reach the slice file (and are refused naming the
option when wrong), the ledger and the socket API carry them, and a slice's waiting allocations (the
region's per-process counters) show in ps and in the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodekit import gpuslice
from regionfile import DeviceRecord, ProcRecord, write_region

from gpuslice.enforcer.slicefile import read_slice_file
from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.local.ledger import Ledger
from gpuslice.local.paths import StateDir
from gpuslice.local.records import Ask, GrantRecord, OomPolicy
from gpuslice.spec import GiB, MiB, Request, SpecError, parse_memory

DEVICES = load_snapshot("h100-80gb")


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = gpuslice(*args, env=env)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_policy_reaches_the_slice_file_and_round_trips(tmp_path):
    ledger = Ledger(StateDir(tmp_path / "state"), DEVICES, node_name="n1")
    ask = Ask(request=Request(memory=parse_memory("4GiB")), owner="t", holder_pid=os.getpid(),
              holder_start=procs.start_time(os.getpid()), oom=OomPolicy("wait", 1500))
    assert Ask.from_json(json.loads(json.dumps(ask.to_json()))) == ask
    g = ledger.acquire(ask)
    assert isinstance(g, GrantRecord) and g.oom == OomPolicy("wait", 1500)
    cfg = read_slice_file(g.slice_file)
    assert (cfg.oom_policy, cfg.oom_wait_ms) == ("wait", 1500)
    assert GrantRecord.from_json(json.loads(json.dumps(g.to_json()))) == g
    for bad, field in (({"oom_policy": "sleep"}, "oom_policy"), ({"oom_policy": "wait", "oom_wait_ms": -1}, "oom_wait_ms"),
                       ({"oom_wait_ms": 10}, "oom_wait_ms")):
        with pytest.raises(SpecError) as err:
            OomPolicy.from_json(bad)
        assert err.value.field == field


def test_run_options(state_env, enforcer_lib):
    env = {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib)}
    done = cli("run", "--memory", "1GiB", "--oom-policy", "wait", "--oom-wait", "2.5", "--", "sh", "-c",
               'cat "$GPUSLICE_SLICE"', env=env)
    assert done.returncode == 0, done.stderr
    assert "oom_policy=wait\n" in done.stdout and "oom_wait_ms=2500\n" in done.stdout
    bad = cli("run", "--oom-policy", "sleep", "--", "true", env=env)
    assert bad.returncode == 2 and "'--oom-policy'" in bad.stderr, bad.stderr
    bad = cli("run", "--oom-wait", "3", "--", "true", env=env)  # a wait without the wait policy
    assert bad.returncode == 2 and "'--oom-wait'" in bad.stderr, bad.stderr


def test_waiting_allocations_show_in_ps_and_metrics(agent, state_env):
    with agent.client() as http:
        body = {"request": {"memory": "8GiB"}, "owner": "t", "holder_pid": os.getpid(),
                "holder_start": procs.start_time(os.getpid()), "oom_policy": "wait", "oom_wait_ms": 5000}
        g = http.post("/v1/grants", json=body).json()
    uuid = g["slices"][0]["uuid"]
    me = ProcRecord(pid=os.getpid(), start_time=procs.start_time(os.getpid()), used={0: 2 * GiB},
                    oom_waits=(1, 3, 1, 512 * MiB))
    write_region(Path(g["region_file"]), [DeviceRecord(uuid, 8 * GiB, used=2 * GiB)], [me])
    deadline, seen = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        slices = httpx.get(agent.url + "v1/status", timeout=10).json()["slices"]
        seen = next((s for s in slices if s["grant_id"] == g["grant"] and s["oom_waits"]), None)
        if seen:
            break
        time.sleep(0.1)
    assert seen and (seen["oom_waiting"], seen["oom_waits"], seen["oom_wait_timeouts"]) == (1, 3, 1), seen
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(agent.url + "metrics", timeout=10).text)}
    assert fams["gpuslice_slice_oom_waiting"].samples[0].value == 1
    assert fams["gpuslice_slice_oom_waits"].samples[0].value == 3
    assert fams["gpuslice_slice_oom_wait_timeouts"].samples[0].value == 1
    table = cli("ps", "--wide", env={**state_env, "COLUMNS": "250"})
    assert "OOM" in table.stdout and "1 (1/3 timed out)" in table.stdout, table.stdout
