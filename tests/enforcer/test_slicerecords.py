"""The per-slice record files as the grant keeper makes them (``gpuslice.enforcer.slicerecords``): one empty file per
grant and device, made ``O_EXCL`` in a folder only the keeper writes, handed to its owner, kept while it exists
(running processes map it), removed at release or when the books no longer hold the grant. Owner changes to
another user are pinned as root in tests/security/test_devstate_files.py."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from squatter import KINDS, take_name

from gpuslice.enforcer.devstate import records_folder_name
from gpuslice.enforcer.policy import PolicyError
from gpuslice.enforcer.slicerecords import (SHARED_MODE, ensure_records_folder, prune_records, reconcile_records,
                                            remove_records, write_records)

GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
GPU1 = "GPU-00000000-1111-2222-3333-555555555555"
MIG = "MIG-00000000-1111-2222-3333-666666666666"


def test_one_empty_file_per_device_in_a_folder_only_its_maker_writes(tmp_path: Path) -> None:
    """Each device gets ``<stem>.slices/<grant>``: empty (the first process sizes it), 0644 and the maker's when no
    user is named, in a 0755 folder of the maker's; a MIG instance's folder is named as the pacer names it."""
    assert write_records(tmp_path, "g-1", (GPU0, MIG, GPU0)) == (f"{GPU0}.slices", "GPU-00000000-1111-2222-3333-"
                                                                                   "666666666666.slices")
    for uuid in (GPU0, MIG):
        folder = tmp_path / records_folder_name(uuid)
        st, fst = os.lstat(folder), os.lstat(folder / "g-1")
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.geteuid()
        assert stat.S_ISREG(fst.st_mode) and stat.S_IMODE(fst.st_mode) == 0o644
        assert (fst.st_uid, fst.st_size) == (os.geteuid(), 0)


def test_an_existing_file_is_kept_never_truncated_and_its_mode_put_back(tmp_path: Path) -> None:
    """A resize or reconcile makes the files again: a running slice's file (mapped by its processes) keeps its
    bytes and inode; a mode its owner widened goes back to the one asked for."""
    write_records(tmp_path, "g-1", (GPU0,))
    path = tmp_path / records_folder_name(GPU0) / "g-1"
    path.write_bytes(b"x" * 100)
    os.chmod(path, 0o666)
    before = os.stat(path).st_ino
    assert write_records(tmp_path, "g-1", (GPU0,)) == ()
    assert (path.read_bytes(), os.stat(path).st_ino, stat.S_IMODE(os.stat(path).st_mode)) == (b"x" * 100, before, 0o644)


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_anything_else_at_the_grants_name_is_replaced_never_followed(tmp_path: Path, planted: str) -> None:
    """Only the maker writes the folder, so what is there that is not a regular file of the owner is the maker's
    to replace: a link is removed (its target untouched), a FIFO never opened for long."""
    folder = ensure_records_folder(tmp_path, GPU0)
    target = tmp_path / "secret"
    target.write_bytes(b"secret")
    os.chmod(target, 0o600)
    if planted == "link":
        (folder / "g-1").symlink_to(target)
    else:
        os.mkfifo(folder / "g-1")
    assert write_records(tmp_path, "g-1", (GPU0,)) == (folder.name,)
    st = os.lstat(folder / "g-1")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == (b"secret", 0o600)


def test_kubernetes_files_are_the_makers_0666(tmp_path: Path) -> None:
    """The device plugin's files: root's, 0666 (a container's processes may run as any uid; only that container
    mounts the file read-write)."""
    write_records(tmp_path, "k-pod-main", (GPU0,), mode=SHARED_MODE)
    assert stat.S_IMODE(os.stat(tmp_path / records_folder_name(GPU0) / "k-pod-main").st_mode) == 0o666


@pytest.mark.parametrize("taken", KINDS)
def test_a_name_a_tenant_took_first_is_moved_aside_never_written_into(tmp_path: Path, taken: str) -> None:
    """In the sticky device-state folder a tenant may make ``<stem>.slices`` before root: a link, a folder others
    may write, a file. It is moved aside to ``.<name>.refused-<ns>`` and the folder made anew; nothing is written
    into theirs."""
    theirs = tmp_path / "elsewhere"
    theirs.mkdir()
    name = tmp_path / records_folder_name(GPU0)
    take_name(name, theirs, taken)
    write_records(tmp_path, "g-1", (GPU0,))
    st = os.lstat(name)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and (name / "g-1").is_file()
    assert list(theirs.iterdir()) == []
    assert [p for p in tmp_path.iterdir() if p.name.startswith(f".{name.name}.refused-")]


def test_release_removes_the_file_from_every_device(tmp_path: Path) -> None:
    """At release the grant's files go from every folder of ours; another grant's stay; a second release, a
    grant id that cannot name a file and a tenant's folder at the name are all left as they are."""
    write_records(tmp_path, "g-1", (GPU0, GPU1))
    write_records(tmp_path, "g-2", (GPU0,))
    remove_records(tmp_path, "g-1")
    remove_records(tmp_path, "g-1")
    remove_records(tmp_path, "../g-2")
    assert sorted(p.name for p in (tmp_path / records_folder_name(GPU0)).iterdir()) == ["g-2"]
    assert list((tmp_path / records_folder_name(GPU1)).iterdir()) == []


def test_a_grant_id_that_cannot_name_a_file_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """A grant id that is no valid file name (``..``, a slash) is refused naming the field, and no folder is made."""
    with pytest.raises(PolicyError, match="grant_id"):
        write_records(tmp_path, "../x", (GPU0,))
    assert list(tmp_path.iterdir()) == []


def test_reconcile_makes_missing_files_and_removes_ended_grants_after_the_grace(tmp_path: Path) -> None:
    """The books win: a grant they hold gets its missing file; a file of a grant they do not hold goes once older
    than the grace (a newer one may be of a grant the books read here predate); ``keep`` and other prefixes stay."""
    write_records(tmp_path, "k-ended", (GPU0,))
    write_records(tmp_path, "k-new", (GPU0,))
    write_records(tmp_path, "k-kept", (GPU0,))
    write_records(tmp_path, "g-local", (GPU0,))
    folder = tmp_path / records_folder_name(GPU0)
    old = time.time() - 600
    for grant in ("k-ended", "k-kept", "g-local"):
        os.utime(folder / grant, (old, old))
    done = reconcile_records(tmp_path, {"k-live": ((GPU0, GPU1), -1)}, prefix="k-", keep=["k-kept"], older_than=120)
    assert (done.made, done.gone, done.problems) == (("k-live",), ("k-ended",), {})
    assert sorted(p.name for p in folder.iterdir()) == ["g-local", "k-kept", "k-live", "k-new"]
    assert (tmp_path / records_folder_name(GPU1) / "k-live").is_file()
    again = reconcile_records(tmp_path, {"k-live": ((GPU0, GPU1), -1)}, prefix="k-", keep=["k-kept"], older_than=120)
    assert (again.made, again.gone) == ((), ())


def test_reconcile_reports_a_grant_it_cannot_make_and_goes_on(tmp_path: Path) -> None:
    """One grant whose file cannot be made is reported by its id (and why); the others are still made."""
    done = reconcile_records(tmp_path, {"../x": ((GPU0,), -1), "g-1": ((GPU0,), -1)})
    assert done.made == ("g-1",) and list(done.problems) == ["../x"] and "grant_id" in done.problems["../x"]


def test_prune_removes_only_what_it_is_told_and_never_through_a_tenants_folder(tmp_path: Path) -> None:
    """Pruning lists folders of ours only: a tenant's folder at another device's name is not touched."""
    write_records(tmp_path, "k-a", (GPU0,))
    theirs = tmp_path / records_folder_name(GPU1)
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    (theirs / "k-a").write_text("theirs")
    assert prune_records(tmp_path, lambda g: g == "k-a") == ("k-a",)
    assert (theirs / "k-a").read_text() == "theirs"


def test_a_lease_its_owner_holds_on_the_file_stalls_neither_the_maker_nor_the_reader(tmp_path: Path) -> None:
    """A file's owner may take a write lease on it: any other open then waits for the lease's break (45 s by
    default). Root's grant keeper (under the ledger's lock) and its monitor open it non-blocking: the maker keeps the
    file as it is, the reader names it among its problems; neither waits."""
    import subprocess
    import sys

    from gpuslice.enforcer.devstate import read_device_state

    write_records(tmp_path, "g-1", (GPU0,))
    path = tmp_path / records_folder_name(GPU0) / "g-1"
    hold = ("import fcntl, os, signal, sys, time\nsignal.signal(signal.SIGIO, signal.SIG_IGN)\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY)\nfcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n"
            "print('held', flush=True)\ntime.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert write_records(tmp_path, "g-1", (GPU0,)) == () and path.is_file()
        dev = read_device_state(path.parent)
        assert dev.slices == () and "g-1" in dev.problems[0]
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
