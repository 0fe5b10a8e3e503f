"""The slice file: Python writer/reader round trip, and agreement with the enforcer's C parser
(native/build/gpuslice-config-check prints what the enforcer would run with)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.enforcer.slicefile import (SliceConfig, SliceFileError, parse_bytes, parse_slice_text, read_slice_file,
                                     write_slice_file)

GiB = 1 << 30
A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def c_parse(native_build: Path, path: Path) -> tuple[int, dict[str, str], str]:
    r = subprocess.run([str(native_build / "gpuslice-config-check"), str(path)], capture_output=True, text=True)
    fields = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return r.returncode, fields, r.stderr


def assert_same_as_c(cfg: SliceConfig, c: dict[str, str]) -> None:
    assert c["source"] == "slice_file"
    assert c["devices"] == ",".join(cfg.devices)
    assert c["memory_limit"] == ("unlimited" if cfg.memory_limit is None else str(cfg.memory_limit))
    for u in cfg.devices:
        lim = cfg.limit_for(u)
        assert c[f"memory_limit.{u}"] == ("unlimited" if lim is None else str(lim))
    for key in ("compute", "weight", "priority"):
        assert c[key] == str(getattr(cfg, key))
    for key in ("grant", "mode", "region", "device_state_dir", "oom_policy", "log_level"):
        assert c[key] == getattr(cfg, key), key
    assert c["fail_open"] == str(int(cfg.fail_open))
    assert c["context_overhead"] == ("default" if cfg.context_overhead is None else str(cfg.context_overhead))
    assert c["engine"] == cfg.engine and c["mps_pipe_dir"] == cfg.mps_pipe_dir
    assert c["generation"] == str(cfg.generation)
    assert c["oom_wait_ms"] == str(30000 if cfg.oom_wait_ms is None else cfg.oom_wait_ms)
    assert c["colocation"] == cfg.colocation and c["tidal_schedule"] == cfg.tidal_schedule


def test_round_trip_and_c_agrees(tmp_path: Path, native_build: Path) -> None:
    cfg = SliceConfig(devices=(A, B), memory_limit=4 * GiB, memory_limits={B: 3000 << 20}, grant="g-1", compute=30,
                      mode="soft", weight=4, priority=0, region="/run/gpuslice/g-1.region",
                      device_state_dir="/run/gpuslice/dev", oom_policy="kill", log_level="debug", fail_open=True,
                      context_overhead=512 << 20)
    p = tmp_path / "slice.conf"
    write_slice_file(p, cfg)
    assert read_slice_file(p) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


def test_keyword_form_and_limits(tmp_path: Path) -> None:
    cfg = write_slice_file(tmp_path / "s", devices=(A,), memory_limit=GiB)
    assert cfg.limit_for(A) == GiB
    assert read_slice_file(tmp_path / "s").limit_for(A) == GiB
    assert SliceConfig(devices=(A,)).limit_for(A) is None


@pytest.mark.parametrize("text", ["4294967296", "4g", "4G", "4Gi", "4GiB", "4096Mi", "4096m", "4194304k", "4Ti"])
def test_byte_units(text: str) -> None:
    assert parse_bytes(text) in (4 * GiB, 4 << 40)


def test_human_written_file(tmp_path: Path, native_build: Path) -> None:
    p = tmp_path / "s"
    p.write_text(f"# written by hand\n  version = 1   # trailing comment\n\ndevices={A} , {B}\nmemory_limit=3000m\n"
                 f"memory_limit.{A}=1Gi\npriority=high\nmode=force\n")
    cfg = read_slice_file(p)
    assert cfg.memory_limit == 3000 << 20 and cfg.limit_for(A) == GiB and cfg.priority == 0 and cfg.mode == "hard"
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


BAD = [
    ("version=2\n", "version"),
    ("memory_limit=1g\n", "version"),
    ("version=1\nmemory_limt=1g\n", "memory_limt"),
    ("version=1\nmemory_limit=lots\n", "memory_limit"),
    ("version=1\nmemory_limit=1g\nmemory_limit=2g\n", "memory_limit"),
    ("version=1\ncompute=101\n", "compute"),
    ("version=1\nweight=0\n", "weight"),
    ("version=1\npriority=2\n", "priority"),
    ("version=1\nmode=fast\n", "mode"),
    ("version=1\nregion=relative/path\n", "region"),
    ("version=1\noom_policy=panic\n", "oom_policy"),
    ("version=1\nlog_level=loud\n", "log_level"),
    ("version=1\nfail_open=yes\n", "fail_open"),
    (f"version=1\ndevices={A}\nmemory_limit.{B}=1g\n", "memory_limit." + B),
    ("version=1\ndevices=not-a-uuid\n", "devices"),
    (f"version=1\ndevices={A},{A}\n", "devices"),
    ("version=1\njust some words\n", "line"),
    ("version=1\nmemory_limit=99999999999999999999\n", "memory_limit"),
    ("version=1\nengine=mps\n", "engine"),
    ("version=1\nengine=spatial\nmps_pipe_dir=relative\n", "mps_pipe_dir"),
    ("version=1\nmps_pipe_dir=/run/mps\n", "mps_pipe_dir"),
    (f"version=1\ndevices={A},{B}\nengine=spatial\n", "engine"),
    ("version=1\ngeneration=-1\n", "generation"),
    ("version=1\ngeneration=4294967296\n", "generation"),
    ("version=1\ngeneration=1g\n", "generation"),
    ("version=1\noom_policy=sleep\n", "oom_policy"),
    ("version=1\noom_wait_ms=86400001\n", "oom_wait_ms"),
    ("version=1\noom_wait_ms=1s\n", "oom_wait_ms"),
    ("version=1\ncolocation=polite\n", "colocation"),
    ("version=1\ncolocation=tidal\npriority=0\n", "colocation"),
    ("version=1\ncolocation=tidal\nmode=soft\n", "colocation"),
    ("version=1\ncolocation=tidal\nengine=spatial\n", "colocation"),
    ("version=1\ntidal_schedule=0-8:50\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=8-20\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=8-25:30\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=8-8:30\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=8-20:0\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=8-20:101\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=22-6:50,5-7:20\n", "tidal_schedule"),
    ("version=1\ncolocation=tidal\ntidal_schedule=1-2:5;3-4:5\n", "tidal_schedule"),
]


@pytest.mark.parametrize("text,key", BAD)
def test_bad_files_refused_by_both_naming_the_key(tmp_path: Path, native_build: Path, text: str, key: str) -> None:
    p = tmp_path / "s"
    p.write_text(text)
    with pytest.raises(SliceFileError) as e:
        read_slice_file(p)
    assert e.value.key == key
    rc, _, err = c_parse(native_build, p)
    assert rc == 2 and err.startswith("error: ")
    if key != "line":
        assert key.split(".")[0] in err, err


def test_spatial_slice_round_trip_and_c_agrees(tmp_path: Path, native_build: Path) -> None:
    cfg = SliceConfig(devices=(A,), memory_limit=4 * GiB, compute=25, engine="spatial",
                      mps_pipe_dir="/var/run/gpuslice/mps", region="/run/r")
    p = tmp_path / "s"
    write_slice_file(p, cfg)
    assert "engine=spatial\nmps_pipe_dir=/var/run/gpuslice/mps\n" in p.read_text()
    assert read_slice_file(p) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


@pytest.mark.parametrize("colocation,schedule,text", [
    ("shared", "", "colocation=shared\n"),
    ("tidal", "", "colocation=tidal\n"),
    ("tidal", "0-8:100,22-24:60", "colocation=tidal\ntidal_schedule=0-8:100,22-24:60\n"),
    ("tidal", "20-8:100", "colocation=tidal\ntidal_schedule=20-8:100\n"),  # wraps past midnight
])
def test_colocation_round_trip_and_c_agrees(tmp_path: Path, native_build: Path, colocation: str, schedule: str,
                                            text: str) -> None:
    """colocation / tidal_schedule are written as given, read back equal, and the enforcer reads the same."""
    cfg = SliceConfig(devices=(A,), memory_limit=GiB, priority=1, colocation=colocation, tidal_schedule=schedule)
    p = tmp_path / "s"
    write_slice_file(p, cfg)
    assert p.read_text().endswith(text)
    assert read_slice_file(p) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


def test_hand_written_schedule_is_read_canonical(tmp_path: Path, native_build: Path) -> None:
    p = tmp_path / "s"
    p.write_text("version=1\ncolocation=tidal\ntidal_schedule= 0-8:30 , 8-20:60,\n")
    assert read_slice_file(p).tidal_schedule == "0-8:30,8-20:60"
    rc, c, err = c_parse(native_build, p)
    assert rc == 0 and c["tidal_schedule"] == "0-8:30,8-20:60", err


def test_time_sliced_files_are_written_as_before() -> None:
    """No engine key for the default: slice files of time-sliced slices are unchanged."""
    from gpuslice.enforcer.slicefile import format_slice

    text = format_slice(SliceConfig(devices=(A,), memory_limit=GiB))
    assert "engine" not in text and "colocation" not in text and "tidal" not in text


def test_overrides_equal_to_the_default_are_dropped() -> None:
    cfg = SliceConfig(devices=(A, B), memory_limit=GiB, memory_limits={A: GiB, B: 2 * GiB})
    assert cfg.memory_limits == {B: 2 * GiB}
    assert SliceConfig(devices=(A,), memory_limits={A: None}).limit_for(A) is None
    with pytest.raises(SliceFileError, match="memory_limit"):
        SliceConfig(devices=(A,), memory_limit=GiB, memory_limits={A: None})


def test_writer_refuses_what_the_parser_would(tmp_path: Path) -> None:
    with pytest.raises(SliceFileError, match="memory_limit"):
        SliceConfig(devices=(A,), memory_limits={B: GiB})
    with pytest.raises(SliceFileError, match="compute"):
        SliceConfig(compute=150)
    with pytest.raises(SliceFileError, match="region"):
        SliceConfig(region="/tmp/has#hash")
    with pytest.raises(SliceFileError, match="grant"):
        write_slice_file(tmp_path / "s", grant="a\nb")
    assert not (tmp_path / "s").exists()


uuids = st.from_regex(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", fullmatch=True)
sizes = st.integers(min_value=0, max_value=2**64 - 2)


@st.composite
def configs(draw: st.DrawFn) -> SliceConfig:
    devs = tuple(draw(st.lists(uuids, max_size=4, unique=True)))
    over = {u: draw(sizes) for u in devs if draw(st.booleans())}
    return SliceConfig(devices=devs, memory_limit=draw(st.none() | sizes), memory_limits=over,
                       grant=draw(st.from_regex(r"[a-z0-9-]{0,20}", fullmatch=True)),
                       compute=draw(st.integers(0, 100)), mode=draw(st.sampled_from(["hard", "soft", "off"])),
                       weight=draw(st.integers(1, 16)), priority=draw(st.integers(0, 1)),
                       region=draw(st.sampled_from(["", "/run/g.region"])),
                       oom_policy=draw(st.sampled_from(["return", "kill"])),
                       log_level=draw(st.sampled_from(["error", "warn", "info", "debug"])),
                       fail_open=draw(st.booleans()), context_overhead=draw(st.none() | st.integers(0, 2**40)),
                       **_engine(draw, devs))


@st.composite
def coloc_configs(draw: st.DrawFn) -> SliceConfig:
    """A config with any allowed co-location: tidal only for priority 1, mode hard, time-sliced."""
    cfg = draw(configs())
    colocation = draw(st.sampled_from(["preemptive", "shared", "tidal"]))
    if colocation != "tidal":
        return SliceConfig(**{**cfg.__dict__, "colocation": colocation})
    hours = sorted(draw(st.lists(st.integers(0, 24), min_size=2, max_size=8, unique=True)))
    spans = [f"{a}-{b}:{draw(st.integers(1, 100))}" for a, b in zip(hours[::2], hours[1::2])]
    return SliceConfig(**{**cfg.__dict__, "engine": "timeslice", "mps_pipe_dir": "", "priority": 1, "mode": "hard",
                          "colocation": "tidal", "tidal_schedule": draw(st.sampled_from(["", ",".join(spans)]))})


def _engine(draw: st.DrawFn, devs: tuple[str, ...]) -> dict[str, str]:
    if len(devs) > 1 or not draw(st.booleans()):
        return {}
    return {"engine": "spatial", "mps_pipe_dir": draw(st.sampled_from(["", "/run/mps"]))}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=coloc_configs())
def test_random_configs_agree_with_c(tmp_path: Path, native_build: Path, cfg: SliceConfig) -> None:
    p = tmp_path / "s"
    write_slice_file(p, cfg)
    assert parse_slice_text(p.read_text()) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


def test_resized_slice_carries_its_generation_and_c_agrees(tmp_path: Path, native_build: Path) -> None:
    """A live resize rewrites the slice file with a higher generation=; both parsers read it, and a
    file never resized is written without the key (as before live resize)."""
    p = tmp_path / "slice.conf"
    write_slice_file(p, SliceConfig(devices=(A,), memory_limit=GiB))
    assert "generation" not in p.read_text()
    cfg = write_slice_file(p, SliceConfig(devices=(A,), memory_limit=2 * GiB, generation=4294967295))
    assert "generation=4294967295\n" in p.read_text()
    assert read_slice_file(p) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)


def test_oom_policy_wait_with_its_timeout_and_c_agrees(tmp_path: Path, native_build: Path) -> None:
    """oom_policy=wait and its oom_wait_ms are read the same by both parsers; without the key the enforcer
    waits 30 s."""
    p = tmp_path / "slice.conf"
    cfg = write_slice_file(p, SliceConfig(devices=(A,), memory_limit=GiB, oom_policy="wait", oom_wait_ms=1500))
    assert "oom_policy=wait\n" in p.read_text() and "oom_wait_ms=1500\n" in p.read_text()
    assert read_slice_file(p) == cfg
    rc, c, err = c_parse(native_build, p)
    assert rc == 0, err
    assert_same_as_c(cfg, c)
    cfg = write_slice_file(p, SliceConfig(devices=(A,), oom_policy="wait"))
    rc, c, err = c_parse(native_build, p)
    assert rc == 0 and c["oom_wait_ms"] == "30000", err
