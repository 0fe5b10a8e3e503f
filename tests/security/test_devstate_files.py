"""The per-device pacing files (``<device_state_dir>/<uuid>.dev``): shared by every slice on a device, in a
folder every tenant may write to, they must never let a tenant steer root's file operations.

Issue 15: the enforcer opened ``<uuid>.dev`` with ``O_CREAT`` and no ``O_NOFOLLOW`` and then ``fchmod``ed it
to 0666, so a user's symlink turned a root-owned 0600 file into 0666 (and a zero-length target was
overwritten with the pacing layout). The device plugin created the same files the same way.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from gpuslice.enforcer.slicefile import write_slice_file
from tenantkit import BUILD, Node, Probe, double_uuid, wait_for


def _devices_dir(node: Node) -> Path:
    folder = node.base / "devices"
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o1777)  # as the state dir's devices/ (every slice's processes join there)
    return folder


def _plant_link(node: Node, tenant, link: Path, target: Path) -> None:
    done = node.python_as(tenant, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(target), str(link))
    assert done.returncode == 0, done.stderr


def test_roots_enforcer_does_not_follow_a_tenants_link_in_the_pacing_folder(bare_node: Node, tenants):
    a, _ = tenants
    folder = _devices_dir(bare_node)
    secret = bare_node.base / "root-secret"
    secret.touch(mode=0o600)
    os.chmod(secret, 0o600)
    _plant_link(bare_node, a, folder / f"{double_uuid(0)}.dev", secret)
    slice_dir = tempfile.mkdtemp(dir=bare_node.base)
    slice_file = os.path.join(slice_dir, "slice")
    write_slice_file(slice_file, grant="g-root", compute=30, memory_limit=1 << 30, device_state_dir=str(folder),
                     region=os.path.join(slice_dir, "region"))
    p = Probe(bare_node.popen(None, [str(BUILD / "helpers" / "slice_probe")], stdin=subprocess.PIPE, bufsize=1,
                              env=bare_node.env_for(None, LD_PRELOAD=str(BUILD / "libgpuslice.so"),
                                                    GPUSLICE_SLICE=slice_file)))
    assert p.code("init") == 0
    p.ask("launch")  # the pacer opens the device's file on the first launch
    err = p.close()
    st = os.stat(secret)
    assert (st.st_mode & 0o777, st.st_size) == (0o600, 0), (oct(st.st_mode), st.st_size, err)


def test_the_agent_is_not_hung_by_a_fifo_planted_as_a_pacing_file(bare_node: Node, tenants):
    """A running agent has made every device's pacing file before any tenant can name it, so the name a tenant
    can take first is one of a device the agent has not made yet: a card or MIG instance that appears before
    the agent's next start, in the sticky devices folder the last run left. There root meets the tenant's FIFO
    twice, and neither may wait for a writer that never comes: at start, making the device's pacing file
    (``ensure_shared_file`` must open what is there without blocking), and then on every sample (the monitor
    must skip it). The enforcer's side, a pacer handed a FIFO, is pinned in native/tests/test_devstate_open.c,
    and the Python readers' in tests/enforcer/test_devstate.py
    (``test_a_fifo_or_link_in_place_of_a_device_state_file_is_refused_at_once``)."""
    import stat
    import sys

    a, _ = tenants
    node = bare_node
    node.state.mkdir(mode=0o755)
    os.chmod(node.state, 0o755)
    devices = node.state / "devices"
    devices.mkdir()
    os.chmod(devices, 0o1777)  # as a previous run of the agent left it
    target = devices / f"{double_uuid(1)}.dev"
    done = node.python_as(a, "import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(target))
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.lstat(target).st_mode)
    agent = node.popen(None, [sys.executable, "-m", "gpuslice.cli", "agent", "--port", "0", "--interval", "0.2",
                              "--reclaim-interval", "0.3"])

    def started():
        assert agent.poll() is None, f"the agent ended (rc={agent.returncode}): {agent.communicate()[1][-3000:]}"
        return (node.state / "agent.json").exists()

    wait_for(started, "the agent to start past a tenant's FIFO in place of a device's pacing file (hung opening it?)")
    # a grant on that device takes the agent's lock, which a sampler stuck opening the FIFO would hold for ever
    try:
        granted = node.cli(None, "run", "--device", "1", "--memory", "1GiB", "--", "true", timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the agent hung on a FIFO in the pacing folder") from None
    assert granted.returncode == 0, granted.stderr
    assert agent.poll() is None
    assert stat.S_ISFIFO(os.lstat(target).st_mode), "root must leave a name a tenant took alone, not replace it"


def test_the_agent_makes_every_devices_pacing_file_itself(node: Node):
    """So that no tenant gets to name them first: root-owned regular files, 0666 (every slice's processes
    coordinate through them), in a sticky folder."""
    devices = node.state / "devices"
    for dev in (0, 1):
        path = devices / f"{double_uuid(dev)}.dev"
        wait_for(path.exists, f"{path.name}")
        st = os.lstat(path)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o666) and path.is_file() and not path.is_symlink()
    assert os.stat(devices).st_mode & 0o7777 == 0o1777


def test_the_device_plugin_does_not_follow_a_link_in_its_devices_folder(tmp_path):
    """kube: Allocate creates the node-wide pacing file of each granted device before the kubelet mounts it."""
    from gpuslice.kube.allocator import Allocator, PluginConfig
    from gpuslice.kube.formats import ContainerGrant
    from gpuslice.spec import Grant, Slice

    cfg = PluginConfig(node="n1", host_state_dir=tmp_path / "state")
    allocator = Allocator(api=None, cfg=cfg, devices=lambda: [])
    uuid = double_uuid(0)
    devices = cfg.local_state / "devices"
    devices.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.touch()
    os.chmod(secret, 0o600)
    (devices / f"{uuid}.dev").symlink_to(secret)
    grant = ContainerGrant(container="main", grant=Grant("g-k1", (Slice(uuid, 1 << 30),)))
    try:
        allocator.write_files(grant)
    except OSError:
        pass  # refusing is fine; following is not
    st = os.stat(secret)
    assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    assert not os.stat(devices).st_mode & 0o002, "the host's devices folder must not be world-writable"
