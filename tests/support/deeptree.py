"""Folders nested deeper than Python's recursion limit: what a tenant can make in a folder it writes in a second
(made level by level through directory descriptors, as an attacker's loop would: the path would pass PATH_MAX
long before). Python 3.11's ``shutil.rmtree`` raises RecursionError on them, through ``ignore_errors`` too, and so
does pytest's own clean-up of old temporary folders: a test that makes one removes it with ``remove_any_depth``
in a ``finally``, or every later session fails at its end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def make_deep_tree(top: Path, levels: int = 1200) -> None:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def remove_any_depth(path: Path) -> None:
    """``path`` and everything under it, however deep (GNU rm walks any depth)."""
    subprocess.run(["rm", "-rf", "--", str(path)], check=True, timeout=120)
