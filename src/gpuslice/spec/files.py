"""Write a whole file so that readers see the old text or the new one, never a part (temporary file in
the same directory, then rename). Shared by the slice files the enforcer reads, the agent's
``agent.json`` that clients and tests poll for, and the device plugin's ``ld.so.preload``."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644, encoding: str = "utf-8") -> None:
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
