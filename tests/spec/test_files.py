"""write_atomic: readers see the old file or the new one, never a part, and a failed write leaves the old
file and no temporary behind. remove_tree: a tenant's folder leaves its place in one step, or stays whole."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuslice.spec.files import write_atomic


def test_writes_the_text_with_the_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "agent.json"
    write_atomic(target, '{"pid": 1}', 0o600)
    assert target.read_text() == '{"pid": 1}'
    assert target.stat().st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["agent.json"]


def test_a_reader_polling_meanwhile_never_sees_half_a_file(tmp_path: Path) -> None:
    target = tmp_path / "info"
    texts = ["a" * 200_000, "b" * 300_000]
    write_atomic(target, texts[0])
    stop = threading.Event()
    seen: set[str] = set()

    def read() -> None:
        while not stop.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for k in range(200):
        write_atomic(target, texts[k % 2])
    stop.set()
    reader.join()
    assert seen <= set(texts)


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "slice"
    write_atomic(target, "old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(target, "naïve", encoding="ascii")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["slice"]


def test_remove_tree_moves_the_folder_aside_at_once_and_keeps_it_when_it_cannot(tmp_path: Path) -> None:
    """remove_tree takes a tenant's folder out of its place in one rename (never a walk under the caller's lock) and
    deletes it in the background; where it cannot move it (here the aside folder cannot be made) it says so with
    False and leaves it whole, so a caller can report it and try again."""
    from gpuslice.spec.files import LEFT, remove_tree

    tree = tmp_path / "grants" / "g1"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("x")
    (tree / "link").symlink_to(tmp_path / "grants")  # removed, never followed
    assert remove_tree(tree, tmp_path / LEFT) is True
    assert not tree.exists() and (tmp_path / "grants").is_dir()
    assert all(n.startswith("grants-g1-") for n in os.listdir(tmp_path / LEFT))
    assert remove_tree(tree, tmp_path / LEFT) is True  # nothing there: nothing to do
    (tmp_path / "file").write_text("")
    (tree / "sub").mkdir(parents=True)
    assert remove_tree(tree, tmp_path / "file" / LEFT) is False
    assert (tree / "sub").is_dir()
