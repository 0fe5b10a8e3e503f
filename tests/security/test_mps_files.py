"""The spatial engine's MPS folders: a tenant owns its daemon's pipe and log folders (the daemon runs as the
tenant and writes there; in Kubernetes the pipe folder is mounted into the tenant's containers), yet root reads
the daemon's pid file and logs for ``ps``, metrics and restarts. A tenant who puts a FIFO there must not hang
root's agent (every tenant's grants wait on it), and a link there must not make root read another file into
what every user sees. Both held on the code before this fix: root's ``pid()`` blocked forever in ``open`` on
the FIFO, and ``faults()`` showed a root-only file's lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuslice.host.mps import PID_FILE

# Root's side, in a child so that a hang is a failure with a reason, not a stuck suite.
ROOT_LOOKS = r"""
import json, sys
from pathlib import Path
from gpuslice.host.mps import MpsControl
ctl = MpsControl(Path("/nonexistent/nvidia-cuda-mps-control"), Path(sys.argv[1]), "GPU-0", int(sys.argv[2]))
print(json.dumps({"pid": ctl.pid(), "faults": ctl.faults(), "log": ctl.log_text()}))
"""

PLANT = r"""
import os, sys
folder = sys.argv[1]
os.mkfifo(os.path.join(folder, "pipe", sys.argv[2]))
os.symlink(sys.argv[3], os.path.join(folder, "log", "control.log"))
os.mkfifo(os.path.join(folder, "log", "server.log"))
"""


@pytest.fixture
def daemon_folder(tenants):
    """A daemon folder as a root node side makes it for tenant a: root's folder, the tenant's pipe/ and log/."""
    a, _ = tenants
    base = Path(tempfile.mkdtemp(prefix="gsmpsf-", dir="/tmp"))
    os.chmod(base, 0o755)
    folder = base / "GPU-0-a"
    folder.mkdir(mode=0o755)
    for name in ("pipe", "log"):
        (folder / name).mkdir(mode=0o700)
        os.chown(folder / name, a.uid, a.gid)
    secret = base / "root-only"
    secret.write_text("root's secret: fatal line every user would see\n")
    os.chmod(secret, 0o600)
    try:
        yield folder, secret
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_tenants_fifo_or_link_in_its_mps_folders_neither_hangs_nor_informs_root(bare_node, tenants, daemon_folder):
    a, _ = tenants
    folder, secret = daemon_folder
    planted = bare_node.python_as(a, PLANT, str(folder), PID_FILE, str(secret))
    assert planted.returncode == 0, planted.stderr
    assert (folder / "pipe" / PID_FILE).is_fifo() and (folder / "log" / "control.log").is_symlink()
    env = {**bare_node.env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run([sys.executable, "-c", ROOT_LOOKS, str(folder), str(a.uid)], env=env,
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("root blocked reading the tenant's MPS pid file or log (a FIFO): its agent would hang")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["pid"] is None  # no daemon: the FIFO named nothing
    assert "secret" not in seen["log"] and seen["faults"] == []
