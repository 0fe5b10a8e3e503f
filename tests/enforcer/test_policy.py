"""The device's policy roster as root writes it (``gpuslice.enforcer.policy``; the native reader's rules are pinned in
``native/tests/test_policy.c``): one slice file per grant in a folder only its owner writes, the same syntax the
enforcer parses, taken off at release or, for the device plugin, when its pod is gone from the ledger, and brought in
line with the grant keeper's books at start and periodically."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslice.enforcer.policy import (PolicyError, check_grant_id, folder_name, prune_policies, read_policies,
                                      reconcile_policies, remove_policies, write_policies)
from gpuslice.spec import ComputeMode, Priority
from gpuslice.spec.model import Colocation, Slice

GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
GPU1 = "GPU-00000000-1111-2222-3333-555555555555"
MIG = "MIG-00000000-1111-2222-3333-666666666666"


def slices(*uuids: str, compute: int = 30, **kw) -> tuple[Slice, ...]:
    return tuple(Slice(device_uuid=u, memory_limit=2**30, compute=compute, **kw) for u in uuids)


def test_one_file_per_device_in_a_folder_only_its_owner_writes(tmp_path: Path) -> None:
    done = write_policies(tmp_path, "g-1", slices(GPU0, GPU1, compute=40, priority=Priority.HIGH,
                                                   mode=ComputeMode.SOFT, weight=3, colocation=Colocation.SHARED))
    assert done == (f"{GPU0}.policy", f"{GPU1}.policy")
    for uuid in (GPU0, GPU1):
        folder = tmp_path / folder_name(uuid)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        assert stat.S_IMODE((folder / "g-1").stat().st_mode) == 0o644
        p = read_policies(tmp_path, uuid)["g-1"]
        assert (p.grant, p.compute, p.mode, p.priority, p.weight, p.colocation) == ("g-1", 40, "soft", 0, 3, "shared")


def test_a_mig_instance_has_its_roster_beside_its_pacing_file(tmp_path: Path) -> None:
    """The pacer names a MIG instance's files GPU-<hex> (``device_stem``); the roster follows it."""
    write_policies(tmp_path, "g-1", slices(MIG))
    assert (tmp_path / "GPU-00000000-1111-2222-3333-666666666666.policy" / "g-1").is_file()


def test_the_native_parser_reads_what_is_written(tmp_path: Path, native_build: Path) -> None:
    """The roster's files are slice files: the enforcer's own parser (the config-check tool) accepts them."""
    write_policies(tmp_path, "k-pod-main", slices(GPU0, compute=25, priority=Priority.HIGH))
    out = subprocess.run([str(native_build / "gpuslice-config-check"), str(tmp_path / folder_name(GPU0) / "k-pod-main")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "compute" in out.stdout and "25" in out.stdout


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "x" * 128, "sp ace", 7])
def test_a_grant_id_that_cannot_name_a_file_is_refused_naming_the_field(tmp_path: Path, bad) -> None:
    with pytest.raises(PolicyError, match="grant_id"):
        check_grant_id(bad)
    with pytest.raises(PolicyError, match="grant_id"):
        write_policies(tmp_path, bad, slices(GPU0))
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_release_takes_the_grant_off_every_roster_and_leaves_the_others(tmp_path: Path) -> None:
    write_policies(tmp_path, "g-1", slices(GPU0, GPU1))
    write_policies(tmp_path, "g-2", slices(GPU0))
    remove_policies(tmp_path, "g-1")
    remove_policies(tmp_path, "g-1")  # again: nothing to do
    assert list(read_policies(tmp_path, GPU0)) == ["g-2"] and read_policies(tmp_path, GPU1) == {}


def test_files_others_could_have_written_are_not_read(tmp_path: Path) -> None:
    write_policies(tmp_path, "g-1", slices(GPU0))
    folder = tmp_path / folder_name(GPU0)
    (folder / "g-2").write_text("version=1\ngrant=g-2\ncompute=90\npriority=0\n")
    os.chmod(folder / "g-2", 0o666)
    (folder / "g-3").write_text("version=1\ngrant=g-1\ncompute=90\npriority=0\n")  # speaks for another grant
    os.chmod(folder / "g-3", 0o644)
    (folder / "g-4").symlink_to(folder / "g-1")
    assert list(read_policies(tmp_path, GPU0)) == ["g-1"]


def test_prune_takes_off_only_old_files_of_its_prefix_not_kept(tmp_path: Path) -> None:
    """The device plugin learns a pod ended only from the ledger: it prunes its own grants (``k-``) the ledger no
    longer lists, but not one written moments ago (the ledger it read may predate it), nor the DRA driver's."""
    for grant in ("k-old-gone", "k-old-kept", "k-new-gone", "dra-claim"):
        write_policies(tmp_path, grant, slices(GPU0))
    old = (tmp_path / folder_name(GPU0) / "k-old-gone").stat().st_mtime - 600
    for grant in ("k-old-gone", "k-old-kept", "dra-claim"):
        os.utime(tmp_path / folder_name(GPU0) / grant, (old, old))
    gone = prune_policies(tmp_path, {"k-old-kept"}, prefix="k-", older_than=120)
    assert gone == ("k-old-gone",)
    assert sorted(read_policies(tmp_path, GPU0)) == ["dra-claim", "k-new-gone", "k-old-kept"]
    assert prune_policies(tmp_path / "missing", set(), prefix="k-") == ()


def test_reconcile_writes_what_the_books_hold_and_leaves_a_fresh_resize_alone(tmp_path: Path) -> None:
    """A grant missing from the roster counts for nothing in its neighbours' allocation (the pacers give unlisted
    slices no share), so the grant keeper reconciles: a missing file (a grant from before the roster, one removed by
    hand) and an old file that differs from the books are written; a differing file newer than the grace may be a
    resize the books read here predate, and stays; ended grants of the prefix go."""
    folder = tmp_path / folder_name(GPU0)
    write_policies(tmp_path, "k-stale", slices(GPU0, compute=10))
    write_policies(tmp_path, "k-fresh", slices(GPU0, compute=70))
    write_policies(tmp_path, "k-ended", slices(GPU0))
    old = time.time() - 600
    for grant in ("k-stale", "k-ended"):
        os.utime(folder / grant, (old, old))
    books = {"k-missing": slices(GPU0, GPU1, compute=25), "k-stale": slices(GPU0, compute=35),
             "k-fresh": slices(GPU0, compute=50)}
    done = reconcile_policies(tmp_path, books, prefix="k-", older_than=120)
    assert done.written == ("k-missing", "k-stale") and done.gone == ("k-ended",) and not done.problems
    got = read_policies(tmp_path, GPU0)
    assert {g: c.compute for g, c in got.items()} == {"k-missing": 25, "k-stale": 35, "k-fresh": 70}
    assert read_policies(tmp_path, GPU1)["k-missing"].compute == 25
    again = reconcile_policies(tmp_path, books, prefix="k-", older_than=120)
    assert again.written == () and again.gone == ()  # in line: nothing rewritten (no mtime churn for the pacers)


def test_reconcile_replaces_an_entry_that_is_not_ours_and_reports_a_bad_grant(tmp_path: Path) -> None:
    folder = tmp_path / folder_name(GPU0)
    write_policies(tmp_path, "g-1", slices(GPU0, compute=30))
    os.chmod(folder / "g-1", 0o666)  # writable by others: the pacers leave it out
    done = reconcile_policies(tmp_path, {"g-1": slices(GPU0, compute=30), "../x": slices(GPU0)})
    assert done.written == ("g-1",) and stat.S_IMODE((folder / "g-1").stat().st_mode) == 0o644
    assert list(done.problems) == ["../x"] and "grant_id" in done.problems["../x"]
    assert list(read_policies(tmp_path, GPU0)) == ["g-1"]


def test_a_name_a_tenant_took_first_is_moved_aside_never_written_into(tmp_path: Path) -> None:
    """The device-state folder is sticky and world-writable: a tenant may make ``<uuid>.policy`` before root does, as
    a folder of its own or a link. Root moves it aside and makes its own; it never writes into theirs."""
    from gpuslice.enforcer.policy import ensure_folder

    theirs = tmp_path / "elsewhere"
    theirs.mkdir()
    (tmp_path / folder_name(GPU0)).symlink_to(theirs)
    (tmp_path / folder_name(GPU1)).mkdir(mode=0o777)
    os.chmod(tmp_path / folder_name(GPU1), 0o777)  # writable by others: not ours
    for uuid in (GPU0, GPU1):
        folder = ensure_folder(tmp_path, uuid)
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.geteuid()
    assert list(theirs.iterdir()) == []
    assert len([p for p in tmp_path.iterdir() if ".refused-" in p.name]) == 2


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="mounting needs root (CI runs as root)")
def test_a_mount_at_the_roster_name_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    """A tenant's FUSE file system mounted at the name can claim root as its owner; root never takes a mount point for
    its folder (it cannot move it aside either: the grant on that device fails, naming the cause)."""
    folder = tmp_path / folder_name(GPU0)
    folder.mkdir(mode=0o755)
    code = ("import sys; from gpuslice.enforcer.policy import ensure_folder\n"
            "try:\n    ensure_folder(sys.argv[1], sys.argv[2])\nexcept OSError as e:\n    print(e); sys.exit(3)\n")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f'mount -t tmpfs -o mode=0755 none "{folder}" && exec "{sys.executable}" -c \'{code}\' '
                           f'"{tmp_path}" {GPU0}'], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 3 and "something is mounted at the device's roster folder" in done.stdout, done


def test_no_node_side_may_put_more_grants_on_a_device_than_a_pacer_lists() -> None:
    """A pacer lists at most GS_POL_MAX grants of a device; one past it reads as unlisted to its neighbours (no
    share, low priority: attacker's review, stop 28). Python's bound is the header's, and the Kubernetes split
    count (device plugin and DRA) is refused above it, naming the field."""
    import re

    import pytest

    from gpuslice.enforcer.policy import MAX_GRANTS_PER_DEVICE
    from gpuslice.kube.allocator import PluginConfig
    from gpuslice.kube.dra.resourceslice import Sharing
    from gpuslice.spec import SpecError

    header = (Path(__file__).resolve().parents[2] / "native/include/gpuslice/policy.h").read_text()
    assert int(re.search(r"#define GS_POL_MAX (\d+)", header).group(1)) == MAX_GRANTS_PER_DEVICE
    assert PluginConfig(node="n", split_count=MAX_GRANTS_PER_DEVICE).split_count == MAX_GRANTS_PER_DEVICE
    for make in (lambda n: PluginConfig(node="n", split_count=n), lambda n: Sharing(split_count=n)):
        with pytest.raises(SpecError) as err:
            make(MAX_GRANTS_PER_DEVICE + 1)
        assert err.value.field == "split_count"
