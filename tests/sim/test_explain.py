"""The replay in words: the table fits 80/100/200 columns, the takeaway names the winner with this run's
numbers, a timeline without queueing says so, and the HTML report opens with both and a glossary."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from gpuslice.cli import main
from gpuslice.sim.engine import InflationResult, SimConfig, TimelineResult
from gpuslice.sim.explain import INFLATION_COLUMNS, TIMELINE_COLUMNS, glossary, rich_table, takeaways
from gpuslice.sim.report import summarise, write_html
from gpuslice.sim.runner import Job, Outcome

ALLOC = {"fgd": 95.36, "bestfit": 92.96, "binpack": 94.51, "spread": 88.61, "random": 86.01}


def _outcome(trace: str, policy: str, seed: int, alloc100: float) -> Outcome:
    curve = np.linspace(0, alloc100, 131)
    curve[100] = alloc100
    result = InflationResult(policy, seed, 6212.0, 8152, 2500, 2400, curve, np.full(131, 4.6), 130.0, alloc100, 8.5)
    job = Job(Path(f"/x/{trace}.csv"), Path("/x/nodes.csv"), policy, "inflation", SimConfig(seed=seed))
    return Outcome(job, result)


def _rows(traces=("openb_pod_list_default",), seeds=(42,)):
    return summarise([_outcome(t, p, s, a + 0.01 * s) for t in traces for p, a in ALLOC.items() for s in seeds])


def _text(table, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 200])
def test_table_fits_and_cuts_no_number(width: int) -> None:
    rows = _rows(traces=("openb_pod_list_default", "openb_pod_list_gpushare40"), seeds=(42, 43))
    text = _text(rich_table(rows, "inflation", width), width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert not re.search(r"\d…|\w…", text.split("not shown")[0])  # no cell cut
    assert all(p in text for p in ALLOC)  # policy names whole
    assert "gpushare40" in text and "means over 2 seeds per policy" in text.replace("\n", " ")
    if width < 200:
        assert "openb_pod_list_gpushare40" not in text.split("not shown")[0]  # the shared prefix goes
    for kept in ("@100%", "(points)"):
        assert kept in text  # allocation at 100 % and the gain over best-fit stay at every width


def test_one_trace_goes_in_the_title() -> None:
    text = _text(rich_table(_rows(), "inflation", 100), 100)
    assert text.lstrip().startswith("openb_pod_list_default:") and "│ openb" not in text


def test_takeaway_names_winner_baseline_and_idle_share_from_the_numbers() -> None:
    (line,) = takeaways(_rows())
    idle_fgd, idle_bf = 100 - 95.78, 100 - 93.38  # alloc + 0.01 × seed 42
    less = round((1 - idle_fgd / idle_bf) * 100)
    assert "Winner: fgd" in line and "95.8 %" in line and "bestfit 93.4 %" in line
    assert f"fgd leaves {less} % less of the GPU capacity idle than bestfit" in line
    assert "6,212 GPUs" in line and "one seed per policy" in line


def test_a_tie_names_no_winner() -> None:
    rows = summarise([_outcome("t", p, 42, 90.0) for p in ("fgd", "bestfit")])
    (line,) = takeaways(rows)
    assert "No winner: fgd and bestfit both had 90.0 %" in line and "less" not in line


def test_timeline_that_never_queued_says_so_and_how_to_fix_it() -> None:
    quiet = TimelineResult("fgd", 100.0, 10, 10, 0, np.zeros(10), np.arange(20.0), np.full(20, 30.0), np.zeros(20),
                           np.zeros(0), extra={"window": 10.0})
    job = Job(Path("/x/t.csv"), Path("/x/n.csv"), "fgd", "timeline", SimConfig())
    (line,) = takeaways(summarise([Outcome(job, quiet)]))
    assert "no task had to wait" in line and "--speedup" in line and "30 % busy" in line


def test_every_column_has_a_glossary_line() -> None:
    for mode, columns in (("inflation", INFLATION_COLUMNS), ("timeline", TIMELINE_COLUMNS)):
        assert all(c.meaning for c in columns)
    names = [name for name, _ in glossary("inflation", _rows())]
    assert "alloc @100%" in names and "FGD paper (points)" in names  # the trace has published numbers


def test_report_opens_with_summary_glossary_and_ties_to_gpuslice(tmp_path: Path) -> None:
    rows = _rows(seeds=(42, 43))
    write_html(rows, tmp_path / "r.html", {"traces": "openb_pod_list_default.csv"})
    page = (tmp_path / "r.html").read_text()
    assert "<title>gpuslice — which placement policy keeps the GPUs busy</title>" in page
    assert page.index("What this run found") < page.index("<table")
    assert "Winner: fgd" in page and "gpuslice run --policy" in page
    assert "What the columns mean" in page and "means over 2 seeds per policy" in page


@pytest.mark.parametrize("width", [80, 100, 200])
def test_simulate_verb_prints_takeaway_table_and_glossary_within_the_width(small_trace, tmp_path, capsys,
                                                                          monkeypatch, width) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    pods, nodes = small_trace
    assert main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "fgd,bestfit",
                 "--workers", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines if not line.startswith("report: ")) <= width  # a path is a path
    table_start = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    assert any("pods:" in line for line in lines[:table_start])  # the takeaway comes first
    assert "alloc @100%" in out and not re.search(r"\d…", out)


def test_simulate_json_is_every_value_and_the_takeaway_on_stdout(small_trace, tmp_path, capsys) -> None:
    import json

    pods, nodes = small_trace
    assert main(["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "fgd,bestfit", "--workers", "1",
                 "--out", str(tmp_path / "o"), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # the progress bar went to stderr: stdout is one JSON document
    assert {r["policy"] for r in doc["rows"]} == {"fgd", "bestfit"} and doc["takeaways"]
    assert all(v is None or isinstance(v, (int, float)) for r in doc["rows"] for v in r["values"].values())
    assert doc["report"].endswith("report.html") and (tmp_path / "o" / "summary.csv").exists()
