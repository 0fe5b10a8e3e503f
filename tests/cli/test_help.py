"""Help that reads like a manual, for every verb: metavars instead of Python types, a usage line as people
write the command, paragraphs that reflow with the terminal, -h, --version and the help verb."""

from __future__ import annotations

import re

import pytest

from clitext import plain

from gpuslice.cli import command, main

VERBS = sorted(command().commands)


def _help(capsys: pytest.CaptureFixture, *argv: str, columns: int = 100) -> str:
    import os

    os.environ["COLUMNS"] = str(columns)
    try:
        assert main(list(argv)) == 0
    finally:
        del os.environ["COLUMNS"]
    return capsys.readouterr().out


@pytest.mark.parametrize("verb", VERBS)
def test_help_shows_no_python_types(verb: str, capsys: pytest.CaptureFixture) -> None:
    """No `<int>`, `<bool>`, `<list[str]>` or `<Path>`: every value has a metavar (SIZE, PCT, CSV, N…) and
    flags show none."""
    text = _help(capsys, verb, "-h")
    assert not re.search(r"<(bool|int|float|str|Path|list\[[^\]]*\])>", text), text
    assert f"Usage: gpuslice {verb}" in text


def test_metavars_say_what_a_value_is(capsys: pytest.CaptureFixture) -> None:
    run = plain(_help(capsys, "run", "-h", columns=200))
    for option, metavar in (("--memory", "SIZE"), ("--compute", "PCT"), ("--gpus", "N"), ("--device", "LIST"),
                            ("--priority", "high|low"), ("--mode", "hard|soft|off")):
        assert re.search(rf"{re.escape(option)} {re.escape(metavar)} ", run), (option, run)
    sim = plain(_help(capsys, "simulate", "-h", columns=200))
    assert "--trace CSV" in sim and "--nodes CSV" in sim and "--out DIR" in sim


def test_run_usage_line_reads_as_typed(capsys: pytest.CaptureFixture) -> None:
    text = _help(capsys, "run", "--help")
    assert "Usage: gpuslice run [OPTIONS] -- CMD..." in text and "{" not in text


def test_paragraphs_reflow_with_the_terminal(capsys: pytest.CaptureFixture) -> None:
    """A docstring's hard line breaks do not survive: at 200 columns, run's exit-code paragraph is one line."""
    text = _help(capsys, "run", "-h", columns=200)
    line = next(x for x in text.splitlines() if "Exit codes" in x)
    assert "gpuslice itself fails" in line


def test_version_flag_help_verb_and_short_help(capsys: pytest.CaptureFixture) -> None:
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == "gpuslice 0.1.0"
    assert main(["-V"]) == 0 and capsys.readouterr().out.strip() == "gpuslice 0.1.0"
    top = _help(capsys, "-h")
    assert "--version" in top and all(v in top for v in VERBS)
    assert _help(capsys, "help", "ps") == _help(capsys, "ps", "-h")
    assert _help(capsys, "help") == top
