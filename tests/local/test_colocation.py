"""Co-location modes in local mode (issue 13): ``gpuslice run --colocation/--tidal-schedule`` and the agent's
socket API carry them into the slice file the enforcer reads; bad values are refused at the edge, naming the
option (exit 2) or the field (400), with the allowed values, and nothing is granted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.host import procs
from nodekit import AgentProcess, gpuslice

SHOW = 'cat "$GPUSLICE_SLICE"'


@pytest.fixture
def env(tmp_path: Path, enforcer_lib: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPUSLICE_STATE_DIR=str(tmp_path / "s"), GPUSLICE_DEVICE_SNAPSHOT="h100-80gb", GPUSLICE_KILL_GRACE="2",
               GPUSLICE_ENFORCER_LIB=str(enforcer_lib), COLUMNS="200",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


@pytest.mark.parametrize("args,lines", [
    (["--priority", "low", "--colocation", "tidal", "--tidal-schedule", "8-20:30, 20-8:100"],
     ["colocation=tidal", "tidal_schedule=8-20:30,20-8:100"]),
    (["--priority", "high", "--colocation", "shared", "--compute", "40", "--mode", "soft"], ["colocation=shared"]),
    (["--priority", "low"], []),  # preemptive: the default, not written (files as before issue 13)
])
def test_run_writes_the_colocation_into_the_slice_file(env: dict[str, str], args: list[str], lines: list[str]) -> None:
    proc = gpuslice("run", "--memory", "1GiB", *args, "--", "sh", "-c", SHOW, env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    written = out.splitlines()
    for line in lines:
        assert line in written
    if not lines:
        assert not [w for w in written if w.startswith(("colocation", "tidal"))]


@pytest.mark.parametrize("args,option,allowed", [
    (["--colocation", "polite"], "--colocation", "preemptive, shared or tidal"),
    (["--priority", "high", "--colocation", "tidal"], "--colocation", "tidal is for a low-priority slice"),
    (["--colocation", "tidal", "--mode", "soft"], "--colocation", "mode hard"),
    (["--tidal-schedule", "8-20:30"], "--tidal-schedule", "none unless colocation is tidal"),
    (["--colocation", "tidal", "--tidal-schedule", "8-25:30"], "--tidal-schedule", "whole UTC hours"),
    (["--colocation", "tidal", "--tidal-schedule", "22-6:10,5-7:3"], "--tidal-schedule", "do not overlap"),
])
def test_run_refuses_bad_colocation_naming_the_option(env: dict[str, str], args: list[str], option: str,
                                                      allowed: str) -> None:
    proc = gpuslice("run", "--memory", "1GiB", *args, "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    flat = " ".join(err.split())
    assert proc.returncode == 2, err
    assert f"'{option}'" in flat and allowed in flat, err


def test_socket_api_carries_colocation_and_refuses_bad_values(env: dict[str, str]) -> None:
    import httpx

    agent = AgentProcess(env)
    try:
        body = {"request": {"memory": "1GiB", "colocation": "tidal", "tidal_schedule": "0-8:50"}, "owner": "alice",
                "holder_pid": os.getpid(), "holder_start": procs.start_time(os.getpid())}
        with agent.client() as http:
            reply = http.post("/v1/grants", json=body)
            assert reply.status_code == 201, reply.text
            grant = reply.json()
            assert grant["slices"][0]["colocation"] == "tidal" and grant["slices"][0]["tidal_schedule"] == "0-8:50"
            text = Path(grant["slice_file"]).read_text()
            assert "colocation=tidal\ntidal_schedule=0-8:50\n" in text
            # the node view (ps --json, the dashboard) and the metrics show the mode
            view = http.get("/v1/status").json()
            assert [v["colocation"] for v in view["slices"]] == ["tidal"]
            metrics = httpx.get(agent.url + "metrics", timeout=30).text
            assert 'colocation="tidal"' in metrics
            for request, field in (({"colocation": "sometimes"}, "colocation"),
                                   ({"colocation": "tidal", "priority": 0}, "colocation"),
                                   ({"colocation": "tidal", "tidal_schedule": "9-9:10"}, "tidal_schedule")):
                bad = http.post("/v1/grants", json={**body, "request": {"memory": "1GiB", **request}})
                assert bad.status_code == 400 and bad.json()["field"].endswith(field), bad.text
            assert http.delete(f"/v1/grants/{grant['grant']}").json()["released"]
            assert http.get("/v1/grants").json()["grants"] == []  # the refusals granted nothing
    finally:
        agent.stop()
