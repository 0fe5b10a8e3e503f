"""Rich consoles and tables shared by the CLI verbs: every table fits the terminal it is printed on.

A table is built from :class:`Column` specs. :func:`fit_table` keeps each value whole — numbers, ids and
names are never cut to ``90.…`` — and makes the table fit the width in three steps: columns that
have a shorter spelling (a UUID's first eight hex digits, a trace name without its common prefix) use
it; free text (commands, requests) wraps; then the columns of least value are left out, lowest
``keep`` first, and the caption says which and that ``--wide`` shows them. ``wide=True`` keeps every
column and full values whatever the width (:func:`print_table` then prints past the terminal's edge).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 200  # a pipe or a file has no width: wide enough for UUIDs, narrow enough for a log viewer
WRAP_MIN = 12  # free text wraps, but not into a ribbon narrower than this


def stdout_console() -> Console:
    """A console as wide as the terminal; in a pipe or file ``$COLUMNS`` if set, else :data:`PIPE_WIDTH`."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH)


@contextlib.contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt, whatever this process inherited.

    A program started with SIGINT ignored (``nohup``, a non-interactive shell's background job, some CI
    runners) keeps it ignored, and Python then installs no handler: Ctrl-C on a terminal would never reach an
    interactive verb (issue 15: the demo could not be stopped). Verbs that promise "Ctrl-C stops it" set the
    disposition they rely on themselves; the previous one is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Column:
    """One column: its header (``\\n`` splits it over two lines to keep it narrow), its values, and how it
    may give way. ``keep`` ranks what stays when the width is short: 0 is never left out, higher is left
    out sooner. ``short`` holds shorter spellings of the values (used, in full, before anything is left
    out). ``wrap`` lets free text wrap at spaces; other values always print whole, on one line."""

    header: str
    values: list[str] = field(default_factory=list)
    keep: int = 0
    justify: str = "left"
    wrap: bool = False
    short: list[str] | None = None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def literal(text: str) -> str:
    """A cell of text someone else wrote (a command line, an owner, a daemon's log line) shown as written and
    nothing more: control characters as escapes (``\\x1b``, not an instruction to the reader's terminal) and
    square brackets escaped (not rich markup). Unescaped, a command with ``[/x]`` made ``ps`` and ``top`` fail for
    every user, and one with ESC sequences rewrote the screen of whoever ran them (helper 41, stop 38)."""
    return escape(visible(text))


def visible(text: str) -> str:
    """``text`` with its control characters as escapes, for plain (non-markup) output of what others wrote."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _cell_width(text: str, wrap: bool) -> int:
    """Columns a value needs: its longest line, or for wrapping text its longest word (at least WRAP_MIN
    or the whole value when shorter)."""
    plain = Text.from_markup(text).plain if "[" in text else text
    lines = plain.splitlines() or [""]
    full = max(Text(line).cell_len for line in lines)
    if not wrap:
        return full
    longest_word = max((Text(w).cell_len for w in re.split(r"\s+", plain) if w), default=0)
    return max(longest_word, min(full, WRAP_MIN))


def _width(columns: Sequence[Column], short: bool) -> int:
    """The narrowest this table prints without cutting a value (rich's default box: a border between and
    around the columns, one space of padding on each side of a cell)."""
    total = 1
    for c in columns:
        values = c.short if (short and c.short is not None) else c.values
        total += max(_cell_width(v, c.wrap) for v in [c.header, *values]) + 3
    return total


def choose(columns: Sequence[Column], width: int, wide: bool = False) -> tuple[list[Column], bool]:
    """The columns to show and whether to use their short values, for ``width``."""
    kept = list(columns)
    if wide or _width(kept, short=False) <= width:
        return kept, False
    while _width(kept, short=True) > width:
        droppable = [c for c in kept if c.keep > 0]
        if not droppable:
            break
        kept.remove(max(droppable, key=lambda c: (c.keep, kept.index(c))))
    return kept, True


def fit_table(columns: Sequence[Column], width: int, *, wide: bool = False, title: str | None = None,
              caption: str | None = None, **table_options: object) -> Table:
    """A rich table of ``columns`` that fits ``width`` (see the module's docstring)."""
    kept, short = choose(columns, width, wide)
    left_out = [c.header.replace("\n", " ") for c in columns if c not in kept]
    if left_out:
        note = f"not shown at this width: {', '.join(left_out)} (--wide shows all)"
        caption = f"{caption} · {note}" if caption else note
    table_options.setdefault("caption_justify", "left")
    table = Table(title=title, caption=caption, **table_options)  # type: ignore[arg-type]
    for c in kept:
        table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap,  # type: ignore[arg-type]
                         overflow="fold" if c.wrap else "ellipsis")
    rows = max((len(c.values) for c in kept), default=0)
    for i in range(rows):
        table.add_row(*[(c.short if short and c.short is not None else c.values)[i] for c in kept])
    return table


def needed_width(renderable: RenderableType, console: Console) -> int:
    """The width at which ``renderable`` prints without squeezing (for ``--wide`` past the terminal)."""
    return console.measure(renderable, options=console.options.update_width(10_000)).maximum


def print_table(console: Console, renderable: RenderableType, wide: bool = False) -> None:
    """Print a fitted table; with ``wide`` at its full width even past the terminal's edge (rich crops
    output to the console's width, so the console is made that wide while it prints)."""
    width = needed_width(renderable, console) if wide else 0
    if width <= console.width:
        console.print(renderable)
        return
    before = console.width
    console.width = width
    try:
        console.print(renderable)
    finally:
        console.width = before


def short_uuid(uuid: str) -> str:
    """``GPU-e30e7c75-7e6c-…`` → ``GPU-e30e7c75…``: eight hex digits tell a node's devices apart."""
    head, _, rest = uuid.partition("-")
    return f"{head}-{rest[:8]}…" if rest and len(rest) > 9 else uuid


def short_names(names: Sequence[str]) -> list[str]:
    """Names without the prefix they all share up to a ``_``/``-``: ``openb_pod_list_gpushare40`` and
    ``openb_pod_list_default`` → ``gpushare40``, ``default``. A single name is kept as it is."""
    distinct = list(dict.fromkeys(names))
    if len(distinct) < 2:
        return list(names)
    prefix = os.path.commonprefix(distinct)
    cut = max(prefix.rfind("_"), prefix.rfind("-")) + 1
    return [n[cut:] or n for n in names]


__all__ = ["Column", "PIPE_WIDTH", "choose", "ctrl_c_interrupts", "fit_table", "needed_width", "print_table",
           "short_names", "short_uuid", "stdout_console"]
