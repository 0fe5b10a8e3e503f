"""Helpers of the adversarial suite (tests/security/): throw-away users, a shared node, tenant processes.

See tests/security/conftest.py for the fixtures built from them.
"""


from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "native" / "build"
DOUBLE_TOTAL = 16 << 30  # the CPU driver double's device memory (native/tests/double/double_common.h)


def double_uuid(dev: int) -> str:
    """The UUID the driver double gives device ``dev`` (native/tests/double/double_common.h)."""
    b = [(k * 17 + dev) & 0xFF for k in range(16)]
    b[0] = 0xA0 + dev
    h = "".join(f"{x:02x}" for x in b)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def write_double_snapshot(path: Path) -> Path:
    """A devices snapshot of the driver double's two cards, so that grants name the devices the enforcer
    sees (the ledger places on the snapshot, the enforcer in the slice's processes on the double)."""
    import json

    devices = [{"uuid": double_uuid(i), "index": i, "name": "gpuslice CPU double", "model": "DOUBLE",
                "memory_total": DOUBLE_TOTAL, "sm_count": 132, "numa_node": 0, "nvlink_peers": [],
                "mig_enabled": False, "mig_instances": [], "compute_mode": "Default",
                "pci_bus_id": f"00000000:{0x18 + i:02x}:00.0"} for i in range(2)]
    path.write_text(json.dumps({"format": "gpuslice.devices/v1", "source": "the CPU driver double",
                                "devices": devices}))
    path.chmod(0o644)
    return path


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0, every: float = 0.05) -> object:
    """Poll ``condition`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def _open_to_all(path: Path) -> bool:
    """Whether every user can execute ``path`` (it and each directory above it)."""
    path = path.resolve()
    for p in [path, *path.parents]:
        if not p.stat().st_mode & 0o001:
            return False
    return True


def tenant_python() -> str:
    """An interpreter of this Python's version that other users can run."""
    mine = Path(sys.executable)
    if _open_to_all(mine):
        return str(mine.resolve())
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (shutil.which(version, path="/usr/local/bin:/usr/bin:/bin"), f"/usr/bin/{version}"):
        if candidate and Path(candidate).exists() and _open_to_all(Path(candidate)):
            return str(Path(candidate).resolve())
    pytest.fail(f"no {version} that other users may execute (this one is {mine}); install the system's {version}",
                pytrace=False)


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


# ------------------------------------------------------------------------------------------- users
@dataclass(frozen=True)
class Tenant:
    name: str
    uid: int
    gid: int
    home: Path


def retry_lock(cmd: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    """useradd/userdel fail at once while another process holds /etc/passwd's lock (another suite running
    beside this one): retry until the lock is ours."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if done.returncode == 0 or "lock" not in (done.stderr or "").lower() or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def add_user(name: str, home: Path) -> Tenant:
    done = retry_lock(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                        "--user-group", name])
    assert done.returncode == 0, f"useradd {name}: {done.stderr}"
    import pwd

    entry = pwd.getpwnam(name)
    home.mkdir(mode=0o700)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    return Tenant(name, entry.pw_uid, entry.pw_gid, home)


def end_processes_of(uid: int) -> None:
    """SIGKILL, one pid at a time, what is left running as ``uid`` (a user made by this session alone)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), 9)
            except OSError:
                pass


# ------------------------------------------------------------------------------------------- node
@dataclass
class Node:
    """A shared state dir, a root agent serving it, and ways to act as root or as a tenant there."""

    base: Path
    env: dict[str, str]
    python: str
    agent: object = None
    started: list[subprocess.Popen] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return Path(self.env["GPUSLICE_STATE_DIR"])

    def env_for(self, tenant: Tenant | None, **extra: str) -> dict[str, str]:
        env = dict(self.env)
        if tenant is not None:
            env.update(HOME=str(tenant.home), USER=tenant.name, LOGNAME=tenant.name)
        env.update(extra)
        return env

    def popen(self, tenant: Tenant | None, args: list[str], **kwargs) -> subprocess.Popen:
        """Start ``args`` as ``tenant`` (None: root) with the node's environment; ended by the fixture."""
        env = kwargs.pop("env", None) or self.env_for(tenant)
        if tenant is not None:
            kwargs.update(user=tenant.uid, group=tenant.gid, extra_groups=[])
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        proc = subprocess.Popen(args, env=env, cwd=kwargs.pop("cwd", "/"), **kwargs)
        self.started.append(proc)
        return proc

    def cli(self, tenant: Tenant | None, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """``gpuslice ARGS`` as ``tenant`` to the end."""
        proc = self.popen(tenant, [self.python, "-m", "gpuslice.cli", *args], **kwargs)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def gpuslice(self, tenant: Tenant | None, *args: str, **kwargs) -> subprocess.Popen:
        return self.popen(tenant, [self.python, "-m", "gpuslice.cli", *args], **kwargs)

    def python_as(self, tenant: Tenant | None, code: str, *argv: str, timeout: float = 60,
                  **kwargs) -> subprocess.CompletedProcess:
        proc = self.popen(tenant, [self.python, "-c", code, *argv], **kwargs)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def grants(self) -> list[dict]:
        import json

        done = self.cli(None, "ps", "--json", timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["slices"]

    def stop(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        if self.agent is not None:
            self.agent.stop()


def node_env(base: Path, python: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSLICE_", "CUDA_", "LD_"))}
    env.update(
        GPUSLICE_STATE_DIR=str(base / "state"), GPUSLICE_KILL_GRACE="2",
        GPUSLICE_DEVICE_SNAPSHOT=str(write_double_snapshot(base / "double-devices.json")),
        GPUSLICE_ENFORCER_LIB=str(BUILD / "libgpuslice.so"), PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), _site_packages()]),
        LD_LIBRARY_PATH=str(BUILD / "double"), GSDOUBLE_NOBACK="1", GPUSLICE_LOG_LEVEL="warn")
    return env


def probe(node: Node, tenant: Tenant | None, slice_file: Path | str | None, **extra: str) -> "Probe":
    """A ``slice_probe`` process (native/tests/helpers) of the slice ``slice_file``, as ``tenant``."""
    env = node.env_for(tenant, LD_PRELOAD=str(BUILD / "libgpuslice.so"), **extra)
    if slice_file is not None:
        env["GPUSLICE_SLICE"] = str(slice_file)
    proc = node.popen(tenant, [str(BUILD / "helpers" / "slice_probe")], env=env, stdin=subprocess.PIPE, bufsize=1)
    return Probe(proc)


@dataclass
class Probe:
    proc: subprocess.Popen

    def ask(self, line: str, timeout: float = 60.0) -> str:
        import select

        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()
            pytest.fail(f"slice_probe did not answer {line!r} within {timeout:.0f} s (hung)")
        answer = self.proc.stdout.readline().strip()
        assert answer, f"slice_probe ended before answering {line!r}: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return answer

    def code(self, line: str) -> int:
        return int(self.ask(line).split()[-1])

    def close(self) -> str:
        out, err = self.proc.communicate(timeout=30)
        return err
