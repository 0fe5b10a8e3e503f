"""Rich consoles shared by the CLI verbs: wide enough for UUIDs when output goes to a file or pipe."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

from rich.console import Console


def stdout_console() -> Console:
    """A console that does not squeeze tables to 80 columns when stdout is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=200)


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
