"""The README documents every option of every verb (in the verb's table row or its own section), and the
exit-code contract once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuslice.cli import command

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
VERBS = sorted(command().commands)


def _documentation_of(verb: str) -> str:
    """The README's table rows that start with the verb, and the section whose heading names
    `gpuslice VERB`."""
    lines = README.splitlines()
    chunk = [line for line in lines if re.match(rf"\| `{re.escape(verb)}`", line)]
    for i, line in enumerate(lines):
        if line.startswith("#") and f"`gpuslice {verb}" in line:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("#")), len(lines))
            chunk += lines[i:end]
    return "\n".join(chunk)


def _options(verb: str) -> list[str]:
    cmd = command().commands[verb]
    names = []
    for param in cmd.params:
        names += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
    return names


@pytest.mark.parametrize("verb", VERBS)
def test_every_option_is_documented(verb: str) -> None:
    text = _documentation_of(verb)
    assert text, f"the README has no row or section for `{verb}`"
    missing = [o for o in _options(verb) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not missing, f"{verb}: {missing}"


def test_exit_codes_are_documented_once() -> None:
    section = README[README.index("### Exit codes"):]
    section = section[:section.index("\n### ", 5)]
    for code in ("`0`", "`1`", "`2`", "`130`"):
        assert code in section
    assert README.count("### Exit codes") == 1
