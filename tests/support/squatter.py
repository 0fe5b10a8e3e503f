"""A tenant's thing at a name root is about to make (the device folders sit in a sticky, world-writable folder):
what the tests of "moved aside, never followed" plant there first."""

from __future__ import annotations

import os
from pathlib import Path

KINDS = ("link", "open folder", "file")


def take_name(name: Path, elsewhere: Path, kind: str) -> None:
    """Put at ``name`` a link to ``elsewhere``, a folder anyone may write, or a plain file (``kind``: one of KINDS)."""
    if kind == "link":
        name.symlink_to(elsewhere)
    elif kind == "open folder":
        name.mkdir()
        os.chmod(name, 0o777)
    elif kind == "file":
        name.write_text("not a folder")
    else:
        raise ValueError(f"kind: {kind!r} is not one of {KINDS}")
