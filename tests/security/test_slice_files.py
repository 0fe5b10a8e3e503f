"""The slice file a tenant's processes obey is one that tenant cannot replace, and no file in its place can
hang the enforcer.

Issue 15: with a root agent the grant folder was chowned to the user, who replaced the root-written slice file
with a larger ``memory_limit``; the enforcer then allowed 30 GiB on a 20 GiB grant. A FIFO as slice file hung
the enforcer and ``gpuslice-config-check``.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from gpuslice.enforcer.slicefile import SliceFileError, read_slice_file, write_slice_file
from tenantkit import BUILD, Node, Probe, wait_for

MiB, GiB = 1 << 20, 1 << 30
NOT_INITIALIZED = 3

REPLACE_THEN_ALLOCATE = r"""
import os, subprocess, sys
slice_file = os.environ["GPUSLICE_SLICE"]
text = open(slice_file).read().replace("memory_limit=1073741824", "memory_limit=8589934592")
outcome = []
try:  # replace it, as an editor or a rename would
    tmp = os.path.join(os.path.dirname(slice_file), ".mine")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, slice_file)
    outcome.append("replaced")
except PermissionError:
    outcome.append("replace-denied")
try:  # or write into it
    with open(slice_file, "w") as f:
        f.write(text)
    outcome.append("written")
except PermissionError:
    outcome.append("write-denied")
probe = subprocess.run([sys.argv[1]], input="init\nalloc 4294967296\n", capture_output=True, text=True)
print(" ".join(outcome), probe.stdout.split("\n")[1])
"""


def test_a_tenant_cannot_raise_its_own_limit_by_replacing_its_slice_file(node: Node, tenants):
    a, _ = tenants
    done = node.cli(a, "run", "--memory", "1GiB", "--", node.python, "-c", REPLACE_THEN_ALLOCATE,
                    str(BUILD / "helpers" / "slice_probe"))
    assert done.returncode == 0, done.stderr
    outcome = done.stdout.split()
    assert outcome[:2] == ["replace-denied", "write-denied"], done.stdout
    assert outcome[2:] == ["alloc", "2"], done.stdout  # 4 GiB on a 1 GiB slice: CUDA_ERROR_OUT_OF_MEMORY


def _slice_in(folder: str, mode: int = 0o644) -> str:
    path = os.path.join(folder, "slice")
    write_slice_file(path, grant="g-trust", memory_limit=GiB)
    os.chmod(path, mode)
    return path


def _init_as(node: Node, tenant, slice_file: str) -> tuple[int, str]:
    p = Probe(node.popen(tenant, [str(BUILD / "helpers" / "slice_probe")], stdin=subprocess.PIPE, bufsize=1,
                         env=node.env_for(tenant, LD_PRELOAD=str(BUILD / "libgpuslice.so"), GPUSLICE_SLICE=slice_file)))
    code = p.code("init")
    return code, p.close()


@pytest.mark.parametrize("folder_mode,file_mode,refused", [
    (0o755, 0o644, False),   # root's folder, root's file: obeyed
    (0o1777, 0o644, False),  # a sticky folder: nobody can replace root's file there
    (0o777, 0o644, True),    # anyone may replace it
    (0o755, 0o666, True),    # anyone may rewrite it
    (0o775, 0o644, True),    # the folder's group may replace it
])
def test_the_enforcer_refuses_a_root_slice_file_its_user_could_replace(bare_node: Node, tenants, folder_mode,
                                                                        file_mode, refused):
    import tempfile

    a, _ = tenants
    folder = tempfile.mkdtemp(dir=bare_node.base)
    os.chmod(folder, folder_mode)
    slice_file = _slice_in(folder, file_mode)
    code, err = _init_as(bare_node, a, slice_file)
    if refused:
        assert code == NOT_INITIALIZED and ("lets others replace it" in err or "writable by others" in err), (code, err)
    else:
        assert code == 0, err


def test_a_tenants_own_slice_file_is_its_own_business(bare_node: Node, tenants):
    """A slice file the tenant wrote itself (its own ledger, its own folder) is obeyed: nobody else's limit
    depends on it."""
    import tempfile

    a, _ = tenants
    folder = tempfile.mkdtemp(dir=bare_node.base)
    os.chown(folder, a.uid, a.gid)
    slice_file = _slice_in(folder, 0o666)
    os.chown(slice_file, a.uid, a.gid)
    code, err = _init_as(bare_node, a, slice_file)
    assert code == 0, err


def test_a_fifo_as_slice_file_is_refused_at_once(bare_node: Node, tenants, tmp_path):
    a, _ = tenants
    fifo = bare_node.base / "slice.fifo"
    os.mkfifo(fifo, 0o666)
    started = time.monotonic()
    code, err = _init_as(bare_node, a, str(fifo))
    assert code == NOT_INITIALIZED and "not a regular file" in err, err
    check = subprocess.run([str(BUILD / "gpuslice-config-check"), str(fifo)], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 2 and "not a regular file" in check.stderr, check.stderr
    with pytest.raises(OSError):
        read_slice_file(fifo)
    assert time.monotonic() - started < 20


def test_the_grant_folder_and_slice_file_stay_roots(node: Node, tenants):
    a, _ = tenants
    run = node.gpuslice(a, "run", "--memory", "1GiB", "--", "sleep", "600")
    grant = wait_for(node.grants, "the grant")[0]["grant_id"]
    folder = node.state / "grants" / grant
    for path, mode in ((folder, 0o755), (folder / "slice", 0o644)):
        st = os.stat(path)
        assert (st.st_uid, st.st_mode & 0o777) == (0, mode), (path, st.st_uid, oct(st.st_mode))
    run.kill()


def test_slice_file_error_type_is_still_raised_for_bad_text(tmp_path):
    bad = tmp_path / "slice"
    bad.write_text("version=1\nmemory_limit=lots\n")
    with pytest.raises(SliceFileError, match="memory_limit"):
        read_slice_file(bad)
