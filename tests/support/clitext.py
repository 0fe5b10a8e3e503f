"""Reading what the CLI printed: rich draws usage errors in a box whose borders cut sentences apart."""

from __future__ import annotations

import re

_BOX = re.compile(r"[│╭╮╰╯─┃━┏┓┗┛]")


def plain(text: str) -> str:
    """``text`` without box-drawing characters, whitespace runs made one space: sentences read whole."""
    return " ".join(_BOX.sub(" ", text).split())
