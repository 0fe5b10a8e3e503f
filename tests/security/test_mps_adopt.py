"""Which process root takes for a tenant's MPS control daemon (``MpsControl.pid``, ``mps_processes``): root
keeps a running daemon for the next grant, sends it control commands and signals what it finds. A program
called ``nvidia-cuda-mps-control`` whose environment names a victim's pipe directory is anyone's to start:
before this fix root adopted another tenant's such program as the victim's daemon (and its servers), because
only the process name, argv and environment were checked (issue 15, attacker's review). Now the process must
run as the daemon's user and its ``/proc/<pid>/exe`` must be the control binary (or the server beside it)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from gpuslice.host.mps import MpsControl
from mpskit import install_standin, kill_all


@pytest.fixture
def mps_home(tenants, bare_node):
    """Root's MPS folder for tenant a (pipe/ and log/ a's, as the node side makes them) and the stand-in
    control binary, runnable by the tenants."""
    a, _ = tenants
    base = Path(tempfile.mkdtemp(prefix="gsmpsa-", dir="/tmp"))
    os.chmod(base, 0o755)
    control = install_standin(base / "bin", bare_node.python)
    os.chmod(base / "bin", 0o755)
    folder = base / "GPU-0-a"
    folder.mkdir(mode=0o755)
    for name in ("pipe", "log"):
        (folder / name).mkdir(mode=0o700)
        os.chown(folder / name, a.uid, a.gid)
    try:
        yield control, folder
    finally:
        kill_all(base)
        shutil.rmtree(base, ignore_errors=True)


def fake_daemon(node, tenant, folder: Path, home: Path):
    """``tenant`` runs its own program (a copy of sleep) named nvidia-cuda-mps-control, with the victim's pipe
    directory in its environment; returned once its process name shows."""
    fake = home / "nvidia-cuda-mps-control"
    shutil.copy("/bin/sleep", fake)
    os.chown(fake, tenant.uid, tenant.gid)
    proc = node.popen(tenant, [str(fake), "300"], env=node.env_for(tenant, CUDA_MPS_PIPE_DIRECTORY=str(folder / "pipe")))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{proc.pid}/comm").read_text().startswith("nvidia-cuda-mps"):
                return proc
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail("the fake daemon did not start")


def test_another_tenants_fake_control_daemon_is_not_adopted(bare_node, tenants, mps_home):
    a, b = tenants
    control, folder = mps_home
    proc = fake_daemon(bare_node, b, folder, b.home)
    ctl = MpsControl(control, folder, "GPU-0", a.uid)
    assert ctl.pid() is None and not ctl.running()
    assert proc.pid not in [s.pid for s in ctl.mps_processes()]  # root would signal it as a's at stop()


def test_the_daemon_users_own_program_of_that_name_is_not_adopted(bare_node, tenants, mps_home):
    a, _ = tenants
    control, folder = mps_home
    proc = fake_daemon(bare_node, a, folder, a.home)
    ctl = MpsControl(control, folder, "GPU-0", a.uid)
    assert ctl.pid() is None
    assert proc.pid not in [s.pid for s in ctl.mps_processes()]


def test_the_real_control_daemon_run_as_the_tenant_is_still_found(bare_node, tenants, mps_home):
    a, b = tenants
    control, folder = mps_home
    fake = fake_daemon(bare_node, b, folder, b.home)
    ctl = MpsControl(control, folder, "GPU-0", a.uid)
    pid = ctl.start()  # dropped to a's uid: the stand-in, through its interpreter
    try:
        assert ctl.pid() == pid and Path(f"/proc/{pid}/status").read_text().count(f"\t{a.uid}\t") >= 1
        assert [s.pid for s in ctl.mps_processes()] == [pid] and fake.poll() is None
    finally:
        ctl.stop()
    assert fake.poll() is None  # root's stop() signalled only a's daemon, never b's program
