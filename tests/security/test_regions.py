"""Regions: no tenant can write (or read) another slice's region, and nothing listed in a region makes root
signal a process.

Issue 15's findings: regions were created mode 0666, so a user planted another process's pid in a root
grant's region and root's reclaimer killed it when the grant's ``run`` died; any user could zero another's
region and block its allocations.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from tenantkit import BUILD, Node, Probe, wait_for

PROCS_AT, PROC_SIZE = 128 + 16 * 192, 800  # native/include/gpuslice/region.h
MiB = 1 << 20


def _start_time(pid: int) -> int:
    text = open(f"/proc/{pid}/stat").read()
    return int(text[text.rfind(")") + 2:].split()[19])


def _alive(pid: int) -> bool:
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return text[text.rfind(")") + 2:].split()[0] not in ("Z", "X")


def _plant(region: str, slot: int, pid: int, start: int) -> bytes:
    """A process record (pid, state 1 = active, start time) for slot ``slot`` of a region."""
    return struct.pack("<iIQ", pid, 1, start), PROCS_AT + slot * PROC_SIZE


def _only_grant(node: Node) -> dict:
    slices = wait_for(node.grants, "the grant to show in ps")
    assert len(slices) == 1, slices
    return slices[0]


def _run_probe(node: Node, tenant, memory: str = "1GiB") -> Probe:
    """``gpuslice run --memory … -- slice_probe`` as ``tenant``, its probe initialised (region in use)."""
    run = node.gpuslice(tenant, "run", "--memory", memory, "--", str(BUILD / "helpers" / "slice_probe"),
                        stdin=subprocess.PIPE, bufsize=1)
    p = Probe(run)
    assert p.code("init") == 0
    return p


PLANT = """
import os, struct, sys
region, pid, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    fd = os.open(region, os.O_RDWR)
except PermissionError:
    print("denied"); raise SystemExit(0)
os.pwrite(fd, struct.pack("<iIQ", pid, 1, start), %d + 100 * %d)
print("planted")
""" % (PROCS_AT, PROC_SIZE)


def test_a_tenant_cannot_write_a_root_grants_region(node: Node, tenants):
    a, _ = tenants
    run = _run_probe(node, None)
    region = node.state / "grants" / _only_grant(node)["grant_id"] / "region"
    wait_for(region.exists, "the root grant's region")
    victim = node.popen(None, ["sleep", "600"], start_new_session=True)
    done = node.python_as(a, PLANT, str(region), str(victim.pid), str(_start_time(victim.pid)))
    assert done.stdout.strip() == "denied", (done.stdout, done.stderr, oct(region.stat().st_mode))
    assert not region.stat().st_mode & 0o022, oct(region.stat().st_mode)
    run.close()


def test_the_reclaimer_never_signals_a_pid_because_a_region_lists_it(node: Node):
    """Even a region that lists a live stranger (written here as root, past any file mode) gets no signal
    sent to it: the reclaimer ends only processes it can prove are the slice's."""
    holder = node.gpuslice(None, "run", "--memory", "1GiB", "--", "sh", "-c",
                           f"echo init | {BUILD / 'helpers' / 'slice_probe'}; exec sleep 600")
    grant = _only_grant(node)["grant_id"]
    region = node.state / "grants" / grant / "region"
    wait_for(lambda: region.exists() and region.stat().st_size > 0, "the region")
    victim = node.popen(None, ["sleep", "600"], start_new_session=True)
    record, offset = _plant(str(region), 100, victim.pid, _start_time(victim.pid))
    fd = os.open(region, os.O_RDWR)
    os.pwrite(fd, record, offset)
    os.close(fd)
    holder.send_signal(signal.SIGKILL)  # the launcher dies: the reclaimer takes the slice over
    wait_for(lambda: not node.grants(), "the reclaimer to free the grant", timeout=90, every=0.3)
    assert _alive(victim.pid), "the reclaimer signalled a process only because the region listed it"


def test_a_tenant_cannot_zero_or_read_another_tenants_region(node: Node, tenants):
    a, b = tenants
    run = _run_probe(node, a)
    assert run.code(f"alloc {100 * MiB}") == 0
    region = node.state / "grants" / _only_grant(node)["grant_id"] / "region"
    zero = ("import sys\ntry:\n    f = open(sys.argv[1], 'r+b')\nexcept PermissionError:\n    print('denied')\n"
            "else:\n    f.write(bytes(105600)); f.close(); print('zeroed')")
    done = node.python_as(b, zero, str(region))
    assert done.stdout.strip() == "denied", done.stdout + done.stderr
    read = node.python_as(b, "import sys\ntry:\n    open(sys.argv[1], 'rb').read(8); print('read')\n"
                             "except PermissionError:\n    print('denied')", str(region))
    assert read.stdout.strip() == "denied", read.stdout + read.stderr
    assert run.code(f"alloc {100 * MiB}") == 0  # a's slice still allocates
    run.close()


def test_a_region_belongs_to_its_grants_owner_in_a_folder_only_root_writes(node: Node, tenants):
    a, _ = tenants
    run = _run_probe(node, a)
    folder = node.state / "grants" / _only_grant(node)["grant_id"]
    st = os.stat(folder)
    assert (st.st_uid, st.st_mode & 0o022) == (0, 0), (st.st_uid, oct(st.st_mode))
    region = os.stat(folder / "region")
    assert region.st_uid == a.uid and region.st_mode & 0o077 == 0, (region.st_uid, oct(region.st_mode))
    run.close()


@pytest.mark.parametrize("who", ["root", "tenant"])
def test_the_enforcer_creates_a_missing_region_for_its_owner_alone(bare_node: Node, tenants, tmp_path, who):
    """A region the enforcer creates itself (no agent made it first) is the creating user's alone."""
    from gpuslice.enforcer.slicefile import write_slice_file

    import tempfile

    tenant = tenants[0] if who == "tenant" else None
    folder = tempfile.mkdtemp(dir=bare_node.base)
    if tenant is not None:
        os.chown(folder, tenant.uid, tenant.gid)
    slice_file = os.path.join(folder, "slice")
    write_slice_file(slice_file, grant="g-own", memory_limit=1 << 30, region=os.path.join(folder, "region"))
    if tenant is not None:  # the tenant's own slice file (a root-written one in its folder is refused)
        os.chown(slice_file, tenant.uid, tenant.gid)
    p = Probe(bare_node.popen(tenant, [str(BUILD / "helpers" / "slice_probe")], stdin=subprocess.PIPE, bufsize=1,
                              env=bare_node.env_for(tenant, LD_PRELOAD=str(BUILD / "libgpuslice.so"),
                                                    GPUSLICE_SLICE=slice_file)))
    assert p.code("init") == 0
    assert p.code(f"alloc {MiB}") == 0
    st = os.stat(os.path.join(folder, "region"))
    assert st.st_mode & 0o077 == 0, oct(st.st_mode)
    assert st.st_uid == (tenant.uid if tenant else 0)
    p.close()


def test_a_resize_with_evict_never_signals_a_pid_because_the_region_lists_it(tmp_path):
    """The live resize's ``evict`` (issue 17, after these fixes) ended the processes a slice's region names as
    holding memory: a tenant could list any pid there (its own region) and have root SIGTERM it. Only processes
    proven to be the grant's are ended; a stranger the region names survives."""
    from regionfile import DeviceRecord, ProcRecord, write_region

    from gpuslice.host import procs
    from gpuslice.host.devices import load_snapshot
    from gpuslice.local.ledger import Ledger, recorded_pids
    from gpuslice.local.paths import StateDir
    from gpuslice.local.records import Ask
    from gpuslice.spec import GiB, Request, Resize, parse_memory

    devices = load_snapshot("h100-80gb")
    ledger = Ledger(StateDir(tmp_path / "state"), devices, node_name="n1", region_pids=recorded_pids)  # as the agent
    me = os.getpid()
    g = ledger.acquire(Ask(request=Request(memory=parse_memory("8GiB")), owner="t", holder_pid=me,
                           holder_start=procs.start_time(me), devices=(devices[0].uuid,)))
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        write_region(Path(g.region_file), [DeviceRecord(devices[0].uuid, 8 * GiB, used=6 * GiB)],
                     [ProcRecord(pid=stranger.pid, start_time=procs.start_time(stranger.pid), used={0: 6 * GiB})])
        done = ledger.resize(g.grant_id, Resize(memory=parse_memory("4GiB"), evict=True))
        assert done.evicted == () and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
        ledger.close()
