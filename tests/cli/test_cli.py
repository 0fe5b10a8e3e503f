"""cli.py: the exit-code contract (0 ok, 2 usage, 1 runtime) and the devices verb."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuslice.cli import main


def _gpuslice(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuslice.cli", *args], capture_output=True, text=True, env=env)


def test_version_exits_zero(capsys: pytest.CaptureFixture) -> None:
    assert main(["version"]) == 0
    assert "gpuslice 0.1.0" in capsys.readouterr().out


def test_usage_error_exits_two() -> None:
    result = _gpuslice("devices", "--bogus")
    assert result.returncode == 2 and "No such option" in result.stderr


def test_runtime_error_exits_one_with_one_clear_line(tmp_path) -> None:
    (tmp_path / "bad.json").write_text("{")
    result = _gpuslice("devices", "--snapshot", str(tmp_path / "bad.json"))
    assert result.returncode == 1
    assert result.stderr.startswith("error:") and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_devices_json_is_a_loadable_snapshot(capsys: pytest.CaptureFixture) -> None:
    assert main(["devices", "--snapshot", "l4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "gpuslice.devices/v1" and len(doc["devices"]) == 4


def test_devices_table_shows_every_uuid(capsys: pytest.CaptureFixture) -> None:
    assert main(["devices", "--snapshot", "t4"]) == 0
    out = capsys.readouterr().out
    assert out.count("GPU-") == 4 and "Tesla T4" in out


def test_every_verb_has_help() -> None:
    import typer

    from gpuslice.cli import app

    assert _gpuslice("--help").returncode == 0
    verbs = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"devices", "version", "demo"} <= set(verbs)
    for verb in verbs:
        assert _gpuslice(verb, "--help").returncode == 0, verb


def test_no_driver_points_at_the_snapshots_a_broken_driver_does_not(monkeypatch, capsys) -> None:
    """Without a driver `devices` (and every verb that needs GPUs) says how to explore anyway: the
    bundled snapshots and GPUSLICE_DEVICE_SNAPSHOT; a driver that runs but fails gets no such hint."""
    from gpuslice.host import devices as discovery
    from gpuslice.host.errors import NoGpuError

    def no_driver():
        raise NoGpuError("no NVIDIA driver found (NVML could not start: NVML Shared Library Not Found)")

    monkeypatch.delenv("GPUSLICE_DEVICE_SNAPSHOT", raising=False)
    monkeypatch.setattr(discovery, "discover_report", no_driver)
    assert main(["devices"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no NVIDIA driver found")
    assert "gpuslice devices --snapshot h100-80gb" in err and "GPUSLICE_DEVICE_SNAPSHOT=h100-80gb" in err
    assert "nothing is enforced" in err

    def broken():
        raise discovery.NvmlError("NVML started but could not count the GPUs (nvmlDeviceGetCount: Unknown Error)")

    monkeypatch.setattr(discovery, "discover_report", broken)
    assert main(["devices"]) == 1
    assert "--snapshot" not in capsys.readouterr().err
