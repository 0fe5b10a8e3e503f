"""The per-slice record files (``<device_state_dir>/<stem>.slices/<grant>``, layout version 5): each slice writes
only its own, its neighbours read it; nothing there lets a tenant steer root's file operations or write another
slice's records.

Issue 15: until version 4 every slice of a device wrote one shared file, ``<uuid>.dev``, 0666, in the sticky
devices folder: any tenant could rewrite, free or truncate its neighbours' records. Before that, the enforcer
opened it with ``O_CREAT`` and no ``O_NOFOLLOW`` and then ``fchmod``ed it to 0666, so a user's symlink turned a
root-owned 0600 file into 0666. Now the root agent makes each device's folder (root's, 0755) at start and each
grant's file at grant time (empty, the grant's user's, 0644); the device plugin makes them root's, 0666, in a
host folder only the kubelet reaches.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuslice.enforcer.devstate import records_folder_name
from gpuslice.enforcer.slicefile import write_slice_file
from tenantkit import BUILD, Node, Probe, double_uuid, wait_for


def _devices_dir(node: Node) -> Path:
    folder = node.base / "devices"
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o1777)  # as the state dir's devices/ (every slice's processes join there)
    return folder


def test_roots_enforcer_does_not_follow_a_tenants_link_in_a_records_folder(bare_node: Node, tenants):
    """With no manager, the first enforcer makes a device's records folder; a tenant can be that first one and
    plant a link named after root's grant in it. Root's enforcer must not follow it (a root-owned 0600 file stays
    0600 and empty)."""
    a, _ = tenants
    folder = _devices_dir(bare_node)
    secret = bare_node.base / "root-secret"
    secret.touch(mode=0o600)
    os.chmod(secret, 0o600)
    plant = ("import os, sys; d = sys.argv[1]; os.mkdir(d); os.chmod(d, 0o1777); "
             "os.symlink(sys.argv[2], os.path.join(d, 'g-root'))")
    done = bare_node.python_as(a, plant, str(folder / records_folder_name(double_uuid(0))), str(secret))
    assert done.returncode == 0, done.stderr
    slice_dir = tempfile.mkdtemp(dir=bare_node.base)
    slice_file = os.path.join(slice_dir, "slice")
    write_slice_file(slice_file, grant="g-root", compute=30, memory_limit=1 << 30, device_state_dir=str(folder),
                     region=os.path.join(slice_dir, "region"))
    p = Probe(bare_node.popen(None, [str(BUILD / "helpers" / "slice_probe")], stdin=subprocess.PIPE, bufsize=1,
                              env=bare_node.env_for(None, LD_PRELOAD=str(BUILD / "libgpuslice.so"),
                                                    GPUSLICE_SLICE=slice_file)))
    assert p.code("init") == 0
    p.ask("launch")  # the pacer opens the device's folder on the first launch
    err = p.close()
    st = os.stat(secret)
    assert (st.st_mode & 0o777, st.st_size) == (0o600, 0), (oct(st.st_mode), st.st_size, err)


def test_the_agent_is_not_hung_by_a_fifo_planted_as_a_records_folder(bare_node: Node, tenants):
    """A running agent has made every device's records folder before any tenant can name it, so the name a tenant
    can take first is one of a device the agent has not made yet: a card or MIG instance that appears before the
    agent's next start, in the sticky devices folder the last run left. At start root moves the tenant's FIFO
    aside without opening it (nothing may wait for a writer that never comes) and makes its own folder; the
    monitor then reads root's folder on every sample. The enforcer's side is pinned in native/tests, the Python
    reader's in tests/enforcer/test_devstate.py (``test_a_fifo_or_link_in_place_of_a_record_or_folder_…``)."""
    a, _ = tenants
    node = bare_node
    node.state.mkdir(mode=0o755)
    os.chmod(node.state, 0o755)
    devices = node.state / "devices"
    devices.mkdir()
    os.chmod(devices, 0o1777)  # as a previous run of the agent left it
    target = devices / records_folder_name(double_uuid(1))
    done = node.python_as(a, "import os, sys; os.mkfifo(sys.argv[1], 0o666)", str(target))
    assert done.returncode == 0, done.stderr
    agent = node.popen(None, [sys.executable, "-m", "gpuslice.cli", "agent", "--port", "0", "--interval", "0.2",
                              "--reclaim-interval", "0.3"])

    def started():
        assert agent.poll() is None, f"the agent ended (rc={agent.returncode}): {agent.communicate()[1][-3000:]}"
        return (node.state / "agent.json").exists()

    wait_for(started, "the agent to start past a tenant's FIFO in place of a device's records folder (hung?)")
    try:
        granted = node.cli(None, "run", "--device", "1", "--memory", "1GiB", "--", "true", timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the agent hung on a FIFO in the devices folder") from None
    assert granted.returncode == 0, granted.stderr
    assert agent.poll() is None
    st = os.lstat(target)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    moved = [p for p in devices.iterdir() if p.name.startswith(f".{target.name}.refused-")]
    assert len(moved) == 1 and stat.S_ISFIFO(os.lstat(moved[0]).st_mode), "the FIFO is moved aside, not replaced"


def test_the_agent_makes_every_devices_records_folder_itself(node: Node):
    """So that no tenant gets to name them first: root's real folders, 0755 (nobody else can make a file in them),
    in the sticky devices folder; no world-writable shared file any more."""
    devices = node.state / "devices"
    for dev in (0, 1):
        path = devices / records_folder_name(double_uuid(dev))
        wait_for(path.exists, path.name)
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert not list(devices.glob("*.dev"))
    assert os.stat(devices).st_mode & 0o7777 == 0o1777


WRITE = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
except PermissionError:
    print("denied"); raise SystemExit(0)
os.write(fd, b"mine"); os.close(fd); print("written")
"""


def test_each_tenant_writes_its_own_record_file_and_no_one_elses(node: Node, tenants):
    """Each grant's record file belongs to its user, 0644, in root's 0755 folder: its owner writes it; the other
    tenant can neither write it nor make a file of its own in the folder. Release removes the files."""
    a, b = tenants
    runs = [node.gpuslice(t, "run", "--device", "0", "--memory", "1GiB", "--", "sleep", "600") for t in (a, b)]
    slices = wait_for(lambda: len(node.grants()) == 2 and node.grants(), "both grants to show in ps")
    folder = node.state / "devices" / records_folder_name(double_uuid(0))
    files = {os.lstat(folder / s["grant_id"]).st_uid: folder / s["grant_id"] for s in slices}
    assert set(files) == {a.uid, b.uid}
    for path in files.values():
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert (os.lstat(folder).st_uid, stat.S_IMODE(os.lstat(folder).st_mode)) == (0, 0o755)
    assert node.python_as(a, WRITE, str(files[a.uid])).stdout.strip() == "written"
    assert node.python_as(a, WRITE, str(files[b.uid])).stdout.strip() == "denied"
    assert node.python_as(a, WRITE, str(folder / "g-forged")).stdout.strip() == "denied"
    assert files[b.uid].stat().st_size == 0 and not (folder / "g-forged").exists()
    for run in runs:
        run.kill()
    wait_for(lambda: not node.grants(), "the reclaimer to release both grants", timeout=90, every=0.3)
    assert not files[a.uid].exists() and not files[b.uid].exists()


def test_the_device_plugin_does_not_follow_a_link_in_its_devices_folder(tmp_path):
    """kube: Allocate makes each granted device's records folder and the grant's file in it before the kubelet
    mounts them; a link at either name is removed or moved aside, never followed."""
    from gpuslice.kube.allocator import Allocator, PluginConfig
    from gpuslice.kube.formats import ContainerGrant
    from gpuslice.spec import Grant, Slice

    cfg = PluginConfig(node="n1", host_state_dir=tmp_path / "state")
    allocator = Allocator(api=None, cfg=cfg, devices=lambda: [])
    devices = cfg.local_state / "devices"
    devices.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.mkdir()
    os.chmod(secret, 0o700)
    secret_file = tmp_path / "secret-file"
    secret_file.touch()
    os.chmod(secret_file, 0o600)
    (devices / records_folder_name(double_uuid(0))).symlink_to(secret)
    (devices / records_folder_name(double_uuid(1))).mkdir()
    (devices / records_folder_name(double_uuid(1)) / "g-k1").symlink_to(secret_file)
    grant = ContainerGrant(container="main", grant=Grant("g-k1", (Slice(double_uuid(0), 1 << 30),
                                                                  Slice(double_uuid(1), 1 << 30))))
    allocator.write_files(grant)
    assert list(secret.iterdir()) == [] and stat.S_IMODE(secret.stat().st_mode) == 0o700
    assert (stat.S_IMODE(secret_file.stat().st_mode), secret_file.stat().st_size) == (0o600, 0)
    for dev in (0, 1):
        st = os.lstat(devices / records_folder_name(double_uuid(dev)) / "g-k1")
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o666)
    assert not os.stat(devices).st_mode & 0o002, "the host's devices folder must not be world-writable"
