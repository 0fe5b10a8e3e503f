"""`gpuslice simulate` end to end on a small trace, the report files, refusals, and the demo entry."""

from __future__ import annotations

import base64
import csv

import pytest

from gpuslice.cli import main
from gpuslice.sim import demo
from gpuslice.sim.engine import SimConfig
from gpuslice.sim.report import summarise
from gpuslice.sim.runner import parse_policies, plan, run_jobs
from gpuslice.spec import SpecError

from clitext import plain

from .conftest import write_nodes, write_pods


def test_simulate_writes_table_csv_and_html_with_embedded_pngs(small_trace, tmp_path, capsys):
    pods, nodes = small_trace
    out = tmp_path / "out"
    code = main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "fgd,bestfit,random",
                 "--repeats", "2", "--workers", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "alloc@100%" in printed and "fgd" in printed and "bestfit" in printed
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {r["policy"] for r in rows} == {"fgd", "bestfit", "random"} and all(r["seeds"] == "2" for r in rows)
    assert all(0 <= float(r["alloc_100"]) <= 100 for r in rows)
    curves = list(csv.DictReader((out / "curves.csv").open()))
    assert len(curves) == 3 * 131
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 1
    png = page.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_mode_reports_delays_and_plots(small_trace, tmp_path):
    pods, nodes = small_trace
    out = tmp_path / "t"
    assert main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "binpack",
                 "--mode", "timeline", "--workers", "1", "--out", str(out)]) == 0
    row = next(csv.DictReader((out / "summary.csv").open()))
    assert row["mode"] == "timeline" and float(row["tasks"]) == 60
    assert "time-ordered replay" in (out / "report.html").read_text()


def test_same_seed_same_report_numbers(small_trace, tmp_path):
    pods, nodes = small_trace
    jobs = plan([pods], nodes, ["fgd", "spread"], "inflation", SimConfig(seed=11))
    a = [r.values["alloc_100"] for r in summarise(run_jobs(jobs, 1))]
    b = [r.values["alloc_100"] for r in summarise(run_jobs(jobs, 2))]  # in processes: same numbers
    assert a == b


@pytest.mark.parametrize("argv, message", [
    (["--policy", "tetris"], "binpack, spread, bestfit, fgd, random"),
    (["--mode", "fast"], "inflation or timeline"),
    (["--repeats", "0"], "1 to 100"),
    (["--ratio", "0"], "above 0"),
    (["--cpu-tasks", "some"], "include or skip"),
    (["--fgd-workload", "future"], "learnt or trace"),
    (["--seed", "-1"], "0 or more"),
    (["--split-count", "0"], "1 or more"),
    (["--workers", "-2"], "0 or more"),
])
def test_bad_options_are_usage_errors_naming_option_and_allowed_values(small_trace, tmp_path, capsys, argv, message):
    """A value the option does not take is a usage error (exit 2, the contract of every verb), and the
    message names the option as typed and what it accepts; nothing is written."""
    pods, nodes = small_trace
    code = main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--out", str(tmp_path / "o"), *argv])
    assert code == 2
    err = plain(capsys.readouterr().err)
    assert message in err and f"'{argv[0]}'" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("which", ["--trace", "--nodes"])
def test_missing_csv_is_not_found_usage_error(small_trace, tmp_path, capsys, which):
    pods, nodes = small_trace
    paths = {"--trace": str(pods), "--nodes": str(nodes), which: str(tmp_path / "nope.csv")}
    code = main(["simulate", "--trace", paths["--trace"], "--nodes", paths["--nodes"], "--out", str(tmp_path / "o")])
    err = plain(capsys.readouterr().err)
    assert code == 2 and "nope.csv' not found" in err and f"'{which}'" in err and "not allowed" not in err


def test_missing_trace_file_is_refused(tmp_path):
    nodes = write_nodes(tmp_path / "n.csv", [("a", 1000, 1000, 1, "T4")])
    with pytest.raises(SpecError, match="an existing CSV file"):
        plan([tmp_path / "missing.csv"], nodes, ["fgd"], "inflation", SimConfig())


def test_policy_pairs_select_levels_independently(small_trace):
    assert parse_policies("node=spread+gpu=fgd, bestfit") == ["node=spread+gpu=fgd", "bestfit"]
    pods, nodes = small_trace
    (outcome,) = run_jobs(plan([pods], nodes, ["node=spread+gpu=fgd"], "inflation", SimConfig()), 1)
    assert outcome.result.policy == "node=spread,gpu=fgd"


def test_demo_run_default_uses_trace_dir(tmp_path, monkeypatch):
    """run_default reads the openb file names from $GPUSLICE_TRACE_DIR and returns the report path."""
    data = tmp_path / "data"
    data.mkdir()
    write_nodes(data / "openb_node_list_gpu_node.csv", [("a", 16000, 65536, 2, "T4"), ("b", 16000, 65536, 2, "T4")])
    write_pods(data / "openb_pod_list_default.csv", [(1000, 100, 1, 300, "", 0, 5), (2000, 100, 1, 1000, "", 0, 5)])
    monkeypatch.setenv("GPUSLICE_TRACE_DIR", str(data))
    report = demo.run_default(tmp_path / "out", workers=1)
    assert report == tmp_path / "out" / "report.html" and report.is_file()


def test_demo_data_dir_refuses_an_empty_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSLICE_TRACE_DIR", str(tmp_path))
    monkeypatch.setattr(demo, "__file__", str(tmp_path / "a" / "b" / "c" / "demo.py"))
    with pytest.raises(SpecError, match="GPUSLICE_TRACE_DIR"):
        demo.data_dir()


def test_bundled_data_is_found_by_default(monkeypatch):
    monkeypatch.delenv("GPUSLICE_TRACE_DIR", raising=False)
    assert (demo.data_dir() / "openb_node_list_gpu_node.csv").is_file()


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_every_task_of_every_replay(small_trace, workers):
    """The bar moves per task (every 256 tasks and at the end of each replay), in processes too, and
    adds up to what job_size promised, so it ends full."""
    from gpuslice.sim.runner import job_size

    pods, nodes = small_trace
    jobs = plan([pods], nodes, ["fgd", "bestfit"], "inflation", SimConfig(ratio=3.0), repeats=2)
    jobs += plan([pods], nodes, ["binpack"], "timeline", SimConfig())
    ticks: list[int] = []
    done: list = []
    run_jobs(jobs, workers, done.append, ticks.append)
    assert len(done) == len(jobs)
    assert sum(ticks) == sum(job_size(j) for j in jobs) > 0
    assert all(n > 0 for n in ticks)


def test_memory_scaling_option_reaches_the_replay(small_trace, tmp_path):
    """--memory-scaling 0.5 leaves half of each GPU's memory to shares: less is allocated than at 1.0."""
    pods, nodes = small_trace
    allocated = {}
    for scaling in ("1.0", "0.5"):
        out = tmp_path / scaling
        assert main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "bestfit",
                     "--ratio", "3", "--memory-scaling", scaling, "--workers", "1", "--out", str(out)]) == 0
        allocated[scaling] = float(next(csv.DictReader((out / "summary.csv").open()))["alloc_end"])
        assert f"memory scaling</b>: {float(scaling):g}" in (out / "report.html").read_text()
    assert allocated["0.5"] < allocated["1.0"]


def test_memory_scaling_out_of_range_is_refused(small_trace, tmp_path, capsys):
    pods, nodes = small_trace
    assert main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--memory-scaling", "0",
                 "--out", str(tmp_path)]) == 2
    assert "'--memory-scaling': 0.0 is not allowed" in plain(capsys.readouterr().err)
