"""Rich consoles shared by the CLI verbs: wide enough for UUIDs when output goes to a file or pipe."""

from __future__ import annotations

import sys

from rich.console import Console


def stdout_console() -> Console:
    """A console that does not squeeze tables to 80 columns when stdout is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=200)
