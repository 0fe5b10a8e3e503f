"""The agent: socket API, runs through the agent, metrics exposition from region data, history."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodekit import gpuslice
from regionfile import DeviceRecord, ProcRecord, write_region

from gpuslice.host import procs
from gpuslice.spec import GiB, MiB


def uds(agent) -> httpx.Client:
    return agent.client()


def ask_body(memory="4GiB", compute=30, wait=False) -> dict:
    return {"request": {"memory": memory, "compute": compute}, "owner": "alice", "holder_pid": os.getpid(),
            "holder_start": procs.start_time(os.getpid()), "wait": wait}


def metrics(agent) -> dict[str, list]:
    text = httpx.get(agent.url + "metrics", timeout=10).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_socket_api_grant_patch_release(agent):
    with uds(agent) as http:
        assert http.get("/v1/ping").json()["ok"] is True
        reply = http.post("/v1/grants", json=ask_body())
        assert reply.status_code == 201, reply.text
        grant = reply.json()
        assert Path(grant["slice_file"]).exists()
        patched = http.patch(f"/v1/grants/{grant['grant']}", json={"child_pid": os.getpid(), "child_start": 1})
        assert patched.json()["child_pid"] == os.getpid()
        listed = http.get("/v1/grants").json()
        assert [g["grant"] for g in listed["grants"]] == [grant["grant"]]
        on_same = {**ask_body(memory="79GiB"), "devices": [grant["slices"][0]["uuid"]]}
        nofit = http.post("/v1/grants", json=on_same)
        assert nofit.status_code == 409 and nofit.json()["error"] == "nofit"
        never = http.post("/v1/grants", json=ask_body(memory="500GiB", wait=True))  # refused, not queued
        assert never.status_code == 400 and never.json()["field"] == "memory", never.text
        assert never.json()["value"] == "500GiB" and "79.6 GiB" in never.json()["allowed"]
        assert http.get("/v1/grants").json()["waiters"] == []
        bad = http.post("/v1/grants", json=ask_body(memory="lots"))
        assert bad.status_code == 400 and bad.json()["field"] == "memory"
        assert http.delete(f"/v1/grants/{grant['grant']}").json() == {"released": True}
        missing = http.patch(f"/v1/grants/{grant['grant']}", json={"child_pid": 1})
        assert missing.status_code == 404 and missing.json()["error"] == "unknown_grant"


def test_http_face_is_read_only(agent):
    assert httpx.post(agent.url + "v1/grants", json=ask_body(), timeout=10).status_code == 405
    assert httpx.get(agent.url + "v1/status", timeout=10).status_code == 200


def test_run_goes_through_the_agent(agent, state_env, enforcer_lib):
    env = {**state_env, "GPUSLICE_ENFORCER_LIB": str(enforcer_lib)}
    proc = gpuslice("run", "--memory", "3GiB", "--", "sh", "-c", "sleep 1; exit 4", env=env)
    seen = None
    deadline = time.monotonic() + 30
    while seen is None and time.monotonic() < deadline:
        slices = httpx.get(agent.url + "v1/status", timeout=10).json()["slices"]
        seen = slices[0] if slices else None
        time.sleep(0.1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert seen is not None and seen["memory_limit"] == 3 * GiB
    with uds(agent) as http:
        assert http.get("/v1/grants").json()["grants"] == []
    too_many = gpuslice("run", "--gpus", "9", "--", "true", env=env)  # named as the option, through the agent too
    out, err = too_many.communicate(timeout=30)
    assert too_many.returncode == 1 and "gpus: 9 is not allowed; expected at most 8" in err, err


def test_metrics_from_region_data(agent):
    with uds(agent) as http:
        grant = http.post("/v1/grants", json=ask_body(memory="8GiB", compute=40)).json()
    uuid = grant["slices"][0]["uuid"]
    me = ProcRecord(pid=os.getpid(), start_time=procs.start_time(os.getpid()), used={0: 1536 * MiB},
                    busy_ns={0: 0}, throttled_ns={0: 2_500_000_000})
    region = Path(grant["region_file"])
    write_region(region, [DeviceRecord(uuid, 8 * GiB, used=1536 * MiB, peak=2 * GiB, oom_refusals=3, compute=40)],
                 [me])
    t0 = time.time()
    time.sleep(0.5)
    me.busy_ns[0] = int((time.time() - t0) * 0.4e9) * 3  # ~40 % busy over the coming samples
    write_region(region, [DeviceRecord(uuid, 8 * GiB, used=1536 * MiB, peak=2 * GiB, oom_refusals=3, compute=40)],
                 [me])
    time.sleep(0.6)
    fams = metrics(agent)
    labels = {"grant": grant["grant"], "device": uuid}

    def value(name: str) -> float:
        found = [s.value for s in fams[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (name, fams.get(name))
        return found[0]

    assert value("gpuslice_slice_memory_used_bytes") == 1536 * MiB
    assert value("gpuslice_slice_memory_limit_bytes") == 8 * GiB
    assert value("gpuslice_slice_memory_peak_bytes") == 2 * GiB
    assert value("gpuslice_slice_compute_share_percent") == 40
    assert value("gpuslice_slice_oom_refusals") == 3  # counter family (samples end in _total)
    assert value("gpuslice_slice_throttled_seconds") == 2.5
    assert value("gpuslice_slice_processes") == 1
    sample = [s for s in fams["gpuslice_slice_memory_used_bytes"] if s.labels["grant"] == grant["grant"]][0]
    assert {sample.labels[k] for k in ("namespace", "pod", "container")} == {""}
    device = [s for s in fams["gpuslice_device_memory_used_bytes"] if s.labels["device"] == uuid][0]
    assert device.value == 1536 * MiB
    granted = [s for s in fams["gpuslice_device_memory_granted_bytes"] if s.labels["device"] == uuid][0]
    assert granted.value == 8 * GiB
    history = httpx.get(agent.url + "v1/history", timeout=10).json()
    ring = history["slices"][f"{grant['grant']}/0"]
    assert ring["memory"][-1] == 1536 * MiB and len(ring["t"]) >= 3


def test_compute_achieved_is_busy_time_over_wall_time(agent):
    with uds(agent) as http:
        grant = http.post("/v1/grants", json=ask_body(memory="1GiB", compute=50)).json()
    uuid = grant["slices"][0]["uuid"]
    me = ProcRecord(pid=os.getpid(), start_time=procs.start_time(os.getpid()), used={0: MiB}, busy_ns={0: 0})
    start = time.monotonic()
    end = start + 2.0
    while time.monotonic() < end:  # the slice is busy 30 % of wall time
        me.busy_ns[0] = int((time.monotonic() - start) * 0.3e9)
        write_region(Path(grant["region_file"]), [DeviceRecord(uuid, GiB, used=MiB, compute=50)], [me])
        time.sleep(0.05)
    history = httpx.get(agent.url + "v1/history", timeout=10).json()["slices"][f"{grant['grant']}/0"]
    rates = [c for c in history["compute"][-5:] if c is not None]
    assert rates and all(20 <= c <= 40 for c in rates), history["compute"]


PEER_SCRIPT = """
import json, os, sys, httpx
from gpuslice.host import procs
sock, victim = sys.argv[1], sys.argv[2]
http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://agent", timeout=30)
mine = http.post("/v1/grants", json={"request": {"memory": "1GiB"}, "owner": "root", "uid": 0,
                                     "holder_pid": os.getpid(), "holder_start": procs.start_time(os.getpid())})
theirs = http.post("/v1/grants", json={"request": {"memory": "1GiB"}, "owner": "x", "holder_pid": 1, "holder_start": 0})
print(json.dumps({"mine": mine.json(), "theirs": theirs.status_code,
                  "patch_foreign_child": http.patch(f"/v1/grants/{mine.json()['grant']}",
                                                    json={"child_pid": 1, "child_start": 0}).status_code,
                  "delete_other": http.delete(f"/v1/grants/{victim}").status_code,
                  "delete_mine": http.delete(f"/v1/grants/{mine.json()['grant']}").json()}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a caller as another user")
def test_socket_callers_are_identified_by_kernel_credentials(tmp_path_factory):
    import json
    import subprocess
    import sys
    import tempfile

    from nodekit import AgentProcess

    root = Path(tempfile.mkdtemp(prefix="gpuslice-peer-"))
    os.chmod(root, 0o755)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GPUSLICE_STATE_DIR": str(root / "state"), "GPUSLICE_DEVICE_SNAPSHOT": "h100-80gb",
           "PYTHONPATH": str(repo / "src")}
    agent = AgentProcess(env)
    try:
        with uds(agent) as http:
            victim = http.post("/v1/grants", json=ask_body()).json()["grant"]
        # The caller runs as user nobody, with the system interpreter (this venv's may sit under /root) and our
        # site-packages (same Python minor version).
        system_python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
        if not Path(system_python).exists():
            pytest.skip(f"{system_python} is missing: cannot run a caller as another user")
        site = next(p for p in sys.path if p.endswith("site-packages"))
        caller_env = {**env, "PYTHONPATH": f"{repo / 'src'}{os.pathsep}{site}"}
        nobody = subprocess.run([system_python, "-c", PEER_SCRIPT, str(agent.socket), victim], env=caller_env,
                                capture_output=True, text=True, timeout=60, user=65534, group=65534, cwd="/")
        assert nobody.returncode == 0, nobody.stderr
        seen = json.loads(nobody.stdout)
        assert seen["mine"]["uid"] == 65534 and seen["mine"]["owner"] != "root"  # the kernel's word, not the body's
        assert seen["theirs"] == 403  # holder pid 1 is not nobody's process
        assert seen["patch_foreign_child"] == 403  # the reclaimer would end that group: it must be the caller's
        assert seen["delete_other"] == 403
        assert seen["delete_mine"] == {"released": True}
        with uds(agent) as http:
            assert [g["grant"] for g in http.get("/v1/grants").json()["grants"]] == [victim]
    finally:
        agent.stop()
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_second_agent_and_busy_port_are_clear_errors(agent, state_env, tmp_path):
    import subprocess
    import sys

    cli = [sys.executable, "-m", "gpuslice.cli", "agent"]
    same = subprocess.run([*cli, "--port", "-1"], env=state_env, capture_output=True, text=True, timeout=60)
    assert same.returncode == 1 and "already serves" in same.stderr
    port = agent.url.rsplit(":", 1)[1].strip("/")
    other = {**state_env, "GPUSLICE_STATE_DIR": str(tmp_path / "other")}
    busy = subprocess.run([*cli, "--port", port], env=other, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and "cannot listen" in busy.stderr and "--port" in busy.stderr
    assert httpx.get(agent.url + "v1/ping", timeout=10).json()["ok"] is True  # the first agent is untouched


def test_agent_reclaims_grants_of_dead_processes(agent):
    import subprocess

    holder = subprocess.Popen(["sleep", "60"])
    body = {**ask_body(), "holder_pid": holder.pid, "holder_start": procs.start_time(holder.pid)}
    with uds(agent) as http:
        grant = http.post("/v1/grants", json=body).json()
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 10
        while http.get("/v1/grants").json()["grants"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http.get("/v1/grants").json()["grants"] == []  # nobody asked: the agent's own reclaim did it
    assert not Path(grant["slice_file"]).exists()


@pytest.mark.parametrize("method, url, body, field", [
    ("POST", "/v1/grants", {**ask_body(), "ticket": "abc"}, "ticket"),
    ("POST", "/v1/grants", {**ask_body(), "ticket": 0}, "ticket"),
    ("POST", "/v1/grants", {**ask_body(), "wait": "false"}, "wait"),
    ("POST", "/v1/grants", [1, 2], "body"),
    ("PATCH", "/v1/grants/{id}", {"child_pid": "x"}, "child_pid"),
    ("PATCH", "/v1/grants/{id}", {"child_pid": 12, "child_start": -1}, "child_start"),
    ("PATCH", "/v1/grants/{id}", {"child_start": 5}, "child_pid"),
    ("PATCH", "/v1/grants/{id}", [1, 2], "body"),
    ("GET", "/v1/history?since=abc", None, "since"),
    ("GET", "/v1/history?since=nan", None, "since"),
])
def test_bad_input_is_a_400_naming_the_field(agent, method, url, body, field):
    with uds(agent) as http:
        grant = http.post("/v1/grants", json=ask_body(memory="1GiB")).json()
        reply = http.request(method, url.format(id=grant["grant"]), json=body)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == "spec" and reply.json()["field"] == field, reply.json()
        http.delete(f"/v1/grants/{grant['grant']}")
    assert httpx.get(agent.url + "v1/history?since=abc", timeout=10).json()["field"] == "since"  # the HTTP face too


def test_a_failing_sample_pass_does_not_end_the_sampler():
    """One exception (EMFILE from /proc under a connection flood) used to end the sampler task for good:
    no reclaim, no monitor, no backstop, while the agent kept granting."""
    import asyncio
    from types import SimpleNamespace

    from gpuslice.local.agent import Agent

    passes = []

    def sample_once():
        passes.append(1)
        if len(passes) == 1:
            raise OSError(24, "Too many open files")

    async def call(fn, *args):
        return fn(*args)

    fake = SimpleNamespace(config=SimpleNamespace(reclaim_every=0.0, interval=0.001), call=call,
                           ledger=SimpleNamespace(reclaim=lambda: []), sample_once=sample_once,
                           reconcile_rosters=lambda: None)

    async def run():
        task = asyncio.create_task(Agent.run_sampler(fake))
        while len(passes) < 3 and not task.done():
            await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()

    asyncio.run(run())
    assert len(passes) >= 3
