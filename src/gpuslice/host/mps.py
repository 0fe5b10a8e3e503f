"""One NVIDIA MPS control daemon, run through the real ``nvidia-cuda-mps-control`` binary given by path.

The spatial engine (``Engine.SPATIAL``) runs a slice's processes as clients of their device's MPS control
daemon. The node side owns the daemons (:mod:`gpuslice.host.mpsfleet` decides which run); this module
starts, queries and stops one, in a folder of its own::

    <folder>/pipe/      CUDA_MPS_PIPE_DIRECTORY: the daemon's sockets and its pid file
                        (nvidia-cuda-mps-control.pid), shared with its clients
    <folder>/log/       CUDA_MPS_LOG_DIRECTORY: control.log, server.log
    <folder>/shm/       (Kubernetes) the daemon's /dev/shm, mounted at /dev/shm in its client containers
    <folder>/daemon.json  who it is: device, user, pid and start time (a reused pid is never taken for it)

The daemon serves one device: it is started with ``CUDA_VISIBLE_DEVICES=<the device's UUID>``, so its
clients see that device as ordinal 0. ``-d`` daemonizes; ready means its pid file names a live process
and it answers ``get_server_list``. Stopping sends ``quit`` (MPS ends its servers), then — if it is still
there after the grace — SIGTERM and SIGKILL to the daemon and to every MPS process (control or server) whose
environment names this pipe directory, and removes the pipe directory, so nothing stale is left. The
tests drive this class with a stand-in executable that behaves like the control daemon
(``tests/support/mps_standin.py``); the ``gpu``-marked tests and ``bench/gpu/spatial.sh`` use the real one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from gpuslice.host import procs
from gpuslice.spec import Engine, GpusliceError, Priority, Slice
from gpuslice.spec.model import Colocation
from gpuslice.spec.files import LEFT, open_regular, remove_tree


CONTROL_ENV = "GPUSLICE_MPS_CONTROL"  # path of nvidia-cuda-mps-control (default: found on PATH)
CONTROL_NAME = "nvidia-cuda-mps-control"
SERVER_NAME = "nvidia-cuda-mps-server"  # MPS starts it from the control binary's folder
PID_FILE = "nvidia-cuda-mps-control.pid"
PID_FILE_MAX = 32  # bytes read of it: a pid and a newline
# /proc/<pid>/comm keeps 15 characters: control daemon and server both read "nvidia-cuda-mps".
MPS_COMM = "nvidia-cuda-mps"
# A Unix socket path has room for 107 bytes; MPS puts its sockets in the pipe directory.
MAX_PIPE_DIR = 80
START_TIMEOUT_S = 15.0
QUIT_TIMEOUT_S = 10.0
# Lines of the daemon's logs that mean a client or server hit a fatal error. MPS writes its own wording;
# these are the words of such lines (matched case-insensitively) and are checked against the real logs
# by bench/gpu/spatial.sh's fault experiment.
FAULT_RE = re.compile(r"\b(fatal|exception|xid|illegal|fault)\b|exited with status [1-9]|terminated by signal",
                      re.IGNORECASE)
LOG_TAIL = 256 * 1024
STOPPED = ("T", "t")  # /proc/<pid>/stat states: stopped by a signal, stopped by a tracer


def _any_stopped(found: list[procs.ProcStat]) -> bool:
    """Whether one of these MPS processes is stopped or traced (its user may SIGSTOP it: the daemon runs as them):
    it answers no ``quit`` and acts on no SIGTERM, so waiting for it only held the node side up (attacker's
    review, stop 28)."""
    return any(s.state in STOPPED for s in found)


class MpsError(GpusliceError):
    """An MPS daemon could not be started, queried or stopped; the message says which and why."""


def find_control(env: Mapping[str, str] | None = None) -> Path | None:
    """``$GPUSLICE_MPS_CONTROL`` if set (it must be an executable file), else ``nvidia-cuda-mps-control`` on
    ``PATH``; None when there is none."""
    env = os.environ if env is None else env
    given = env.get(CONTROL_ENV)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MpsError(f"{CONTROL_ENV}={given}: not an executable file; expected the path of {CONTROL_NAME}")
        return path
    found = shutil.which(CONTROL_NAME, path=env.get("PATH"))
    return Path(found) if found else None


# The active-thread percentage of a yielding spatial slice (low priority, not co-location shared, no compute share
# of its own) whose process starts while a high-priority preemptive slice of the same MPS daemon holds the device.
# The enforcer applies it, from the device's roster at the process's start (native/include/gpuslice/mps.h
# GS_MPS_YIELD_THREADS says why and what it measured); this copy only says so in `gpuslice run`'s grant line.
YIELD_THREADS = 60


def yields(item: Slice) -> bool:
    """Whether a spatial slice yields to high-priority ones: a below-normal MPS client, and with no compute share
    of its own capped at :data:`YIELD_THREADS` beside them."""
    return item.priority == Priority.LOW and item.colocation is not Colocation.SHARED


def client_env(item: Slice, pipe_dir: str) -> dict[str, str]:
    """The MPS variables of a spatial slice's processes (the launcher's and Allocate's): the daemon's pipe
    directory, the compute share as the active-thread percentage (1..99; 0 and 100 leave every SM), the
    memory limit as the pinned device-memory limit of ordinal 0 in whole MiB (rounded down), and a low-priority
    slice that yields (co-location ``preemptive``) as a below-normal client (``CUDA_MPS_CLIENT_PRIORITY=1``: the
    server runs normal clients' work first). The enforcer applies the same rules from the slice file before the
    driver starts (``native/src/core/mps.c``), and one more that only a process's start can decide: a yielding
    slice with no compute share gets :data:`YIELD_THREADS` when the device's roster lists a high-priority
    preemptive slice of the same daemon then."""
    if item.engine is not Engine.SPATIAL:
        return {}
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if 0 < item.compute < 100:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(item.compute)
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, item.memory_limit >> 20)}M"
    if yields(item):
        env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
    return env


@dataclass(frozen=True)
class DaemonRecord:
    """``daemon.json``: which device, user and tenant (mpsfleet.DaemonKey) the folder's daemon serves, and the
    process when it runs."""

    device: str
    uid: int
    pid: int = 0
    start: int = 0
    started: float = 0.0
    tenant: str = ""

    def to_json(self) -> dict:
        return {"device": self.device, "uid": self.uid, "pid": self.pid, "start": self.start, "started": self.started,
                "tenant": self.tenant}

    @classmethod
    def from_json(cls, data: object) -> "DaemonRecord":
        if not isinstance(data, dict) or not isinstance(data.get("device"), str):
            raise MpsError(f"daemon.json: {str(data)[:80]!r} is not a daemon record")
        return cls(device=data["device"], uid=int(data.get("uid", -1)), pid=int(data.get("pid", 0)),
                   start=int(data.get("start", 0)), started=float(data.get("started", 0.0)),
                   tenant=str(data.get("tenant", "")))


# What an MPS daemon inherits of the environment of the process starting it (the agent, the ledger's `gpuslice run`,
# the device plugin): where its programs and the driver's libraries are, and the locale. Nothing more: the daemon
# runs as the tenant, who can read its /proc/<pid>/environ, and the agent's own variables (a kubeconfig path or
# token, its configuration, the admin's shell) are not the tenant's to read (stop 39: the whole environment was
# passed before). The daemon also gets CUDA_VISIBLE_DEVICES and its pipe and log folders (MpsControl.env).
DAEMON_INHERITS = frozenset({"PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "TZ"})


class MpsControl:
    """The MPS control daemon of ``device`` for user ``uid`` (-1: the user running this code), in ``folder``.

    ``shm``: run the daemon with ``<folder>/shm`` bind-mounted on its ``/dev/shm`` (a private mount
    namespace): MPS clients and server share memory through /dev/shm, and a client container gets the same
    folder mounted there (Kubernetes). Needs CAP_SYS_ADMIN; local mode shares the host's /dev/shm instead.
    """

    def __init__(self, binary: Path, folder: Path, device: str, uid: int = -1, *, shm: bool = False,
                 start_timeout: float = START_TIMEOUT_S, quit_timeout: float = QUIT_TIMEOUT_S, tenant: str = ""):
        self.binary = Path(binary)
        self.folder = Path(folder)
        self.device = device
        self.uid = uid
        self.shm = shm
        self.tenant = tenant
        self.start_timeout = start_timeout
        self.quit_timeout = quit_timeout

    # -------------------------------------------------------------------------------------- places
    @property
    def pipe_dir(self) -> Path:
        return self.folder / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.folder / "log"

    @property
    def shm_dir(self) -> Path:
        return self.folder / "shm"

    @property
    def record_file(self) -> Path:
        return self.folder / "daemon.json"

    def env(self) -> dict[str, str]:
        """The daemon's environment (and that of control commands sent to it): :data:`DAEMON_INHERITS` of this
        process's, and where the daemon's pipes, logs and device are."""
        env = {k: v for k, v in os.environ.items() if k in DAEMON_INHERITS}
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(self.log_dir),
                   CUDA_VISIBLE_DEVICES=self.device)
        return env

    # -------------------------------------------------------------------------------------- state
    def record(self) -> DaemonRecord | None:
        try:
            return DaemonRecord.from_json(json.loads(self.record_file.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, MpsError):
            return None

    def pid(self) -> int | None:
        """The daemon's pid while it runs: the process the pid file names, an MPS process serving this pipe
        directory (its environment says so), with the start time recorded when it was started."""
        rec = self.record()
        text = _read_tenant_file(self.pipe_dir / PID_FILE, PID_FILE_MAX).decode("ascii", "replace").strip()
        pid = int(text) if text.isdigit() else (rec.pid if rec else 0)
        if pid <= 0:
            return self._find_daemon()
        start = rec.start if rec and rec.pid == pid else 0
        if not procs.alive(pid, start) or not self._serves(pid):
            return None
        return pid

    def _find_daemon(self) -> int | None:
        """Without a pid file: the MPS process of this pipe directory whose program is the control daemon."""
        for s in self.mps_processes():
            if self._program(s.pid) == "control":
                return s.pid
        return None

    def running(self) -> bool:
        return self.pid() is not None

    def _serves(self, pid: int) -> bool:
        """``pid`` is an MPS process (control or server) of this pipe directory: named like one, running as the
        daemon's user, its program the control binary or the server beside it, its environment naming this pipe
        directory. Name and environment alone are anyone's to forge: a tenant's program called
        ``nvidia-cuda-mps-control`` with another tenant's pipe directory in its environment was adopted as that
        tenant's daemon (issue 15, attacker's review)."""
        try:
            comm = procs.read_text(pid, "comm").strip()
        except OSError:
            return False
        if not comm.startswith(MPS_COMM) or procs.real_uid(pid) != self._daemon_uid() or self._program(pid) is None:
            return False
        return procs.environ_has(pid, f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}") is True

    def _daemon_uid(self) -> int:
        return self.uid if self.uid >= 0 else os.geteuid()

    def _program(self, pid: int) -> str | None:
        """``"control"`` or ``"server"`` when ``pid`` runs that MPS binary (its ``/proc/<pid>/exe`` is the same
        file: device and inode), else None. A ``#!`` script (the tests' stand-in) runs as its interpreter with
        the script's path as the first argument: both must match."""
        try:
            exe = os.stat(procs.PROC / str(pid) / "exe")
        except OSError:
            return None
        argv1: bytes | None = None
        on_path = shutil.which(SERVER_NAME)
        candidates = [("control", self.binary), ("server", self.binary.with_name(SERVER_NAME))]
        if on_path:
            candidates.append(("server", Path(on_path)))
        for role, path in candidates:
            ident = _file_id(path)
            if ident is None:
                continue
            if ident == (exe.st_dev, exe.st_ino):
                return role
            interpreter = _interpreter(path)
            if interpreter is None or _file_id(Path(interpreter)) != (exe.st_dev, exe.st_ino):
                continue
            if argv1 is None:
                try:
                    argv = (procs.PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    return None
                argv1 = argv[1] if len(argv) > 1 else b""
            if argv1.startswith(b"/") and _file_id(Path(os.fsdecode(argv1))) == ident:
                return role
        return None

    def mps_processes(self) -> list[procs.ProcStat]:
        """Every live MPS process (control daemon, servers) of this pipe directory, whoever its parent is now."""
        return [s for s in procs.all_stats() if self._serves(s.pid)]

    # -------------------------------------------------------------------------------------- life
    def start(self) -> int:
        """Start the daemon (fresh pipe and log folders); its pid once it answers. Raises MpsError with the
        end of its log when it does not come up within ``start_timeout`` seconds. A daemon that already runs
        is kept (its pid)."""
        pid = self.pid()
        if pid is not None:
            return pid
        if len(str(self.pipe_dir)) > MAX_PIPE_DIR:
            raise MpsError(f"MPS pipe directory {self.pipe_dir} is {len(str(self.pipe_dir))} bytes long; MPS puts "
                           f"Unix sockets there, whose paths must stay short: at most {MAX_PIPE_DIR} bytes (use a "
                           "shorter state dir, GPUSLICE_STATE_DIR)")
        self._fresh_folders()
        self.record_file.write_text(json.dumps(DaemonRecord(self.device, self.uid, tenant=self.tenant).to_json()))
        cmd = [str(self.binary), "-d"]
        if self.shm:
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount --bind "$0" /dev/shm && exec "$@"', str(self.shm_dir), *cmd]
        try:
            done = subprocess.run(cmd, env=self.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=self.start_timeout, preexec_fn=self._as_user(), start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{self.binary} -d for {self.device}: {exc}") from None
        if done.returncode != 0:
            raise MpsError(f"{self.binary} -d for {self.device} exited with {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-300:]}{self._log_hint()}")
        pid = self._wait_ready()
        self.record_file.write_text(json.dumps(DaemonRecord(self.device, self.uid, pid, procs.start_time(pid),
                                                            time.time(), self.tenant).to_json()))
        return pid

    def _fresh_folders(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.pipe_dir, self.log_dir, *((self.shm_dir,) if self.shm else ())):
            remove_tree(folder, self.folder.parent / LEFT)
            folder.mkdir(mode=0o700)
            if self._other_user():
                os.chown(folder, self.uid, -1)  # the daemon runs as the slice's user and writes here
        if self._other_user():
            os.chmod(self.folder, 0o755)

    def _other_user(self) -> bool:
        return self.uid >= 0 and os.geteuid() == 0 and self.uid != 0

    def _as_user(self) -> Callable[[], None] | None:
        """Drop to the slice's user in the child (a root node side starting a user's daemon). MPS runs one
        server per user at a time per daemon, so each user on a device gets a daemon of their own."""
        if not self._other_user():
            return None
        uid = self.uid

        def drop() -> None:
            import pwd

            try:
                entry = pwd.getpwuid(uid)
                os.initgroups(entry.pw_name, entry.pw_gid)
                os.setgid(entry.pw_gid)
            except KeyError:
                os.setgroups([])
            os.setuid(uid)
        return drop

    def _wait_ready(self) -> int:
        deadline = time.monotonic() + self.start_timeout
        problem = "no pid file"
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid is not None and _any_stopped(self.mps_processes()):
                problem = "it was stopped (SIGSTOP or a tracer) before it answered"
                break
            if pid is not None:
                try:
                    self.query("get_server_list", timeout=max(1.0, deadline - time.monotonic()))
                    return pid
                except MpsError as exc:
                    problem = str(exc)
            time.sleep(0.05)
        self._kill_all()
        raise MpsError(f"the MPS control daemon of {self.device} did not come up within {self.start_timeout:g} s "
                       f"({problem}){self._log_hint()}")

    def query(self, command: str, timeout: float = 5.0) -> str:
        """Send one control command (``get_server_list``, ``quit``, ...) and return its answer."""
        try:
            done = subprocess.run([str(self.binary)], input=command + "\n", env=self.env(), capture_output=True,
                                  text=True, timeout=timeout, preexec_fn=self._as_user())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"MPS control of {self.device}: {command}: {exc}") from None
        if done.returncode != 0:
            raise MpsError(f"MPS control of {self.device}: {command}: exit {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-200:]}")
        return done.stdout

    def servers(self) -> list[int]:
        """The pids of the daemon's MPS servers (``get_server_list``)."""
        return [int(w) for w in self.query("get_server_list").split() if w.isdigit()]

    def stop(self) -> None:
        """``quit``, then force what is left (daemon and servers of this pipe directory), and remove the pipe
        directory: afterwards no MPS process of this folder runs and no stale socket is left. The logs are
        kept (``last.log`` beside the folder's others) until the folder is removed or started again."""
        if self.running() and not _any_stopped(self.mps_processes()):
            try:
                self.query("quit", timeout=self.quit_timeout)
            except MpsError:
                pass  # forced below
            deadline = time.monotonic() + self.quit_timeout
            while (left := self.mps_processes()) and not _any_stopped(left) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._kill_all()
        remove_tree(self.pipe_dir, self.folder.parent / LEFT)
        remove_tree(self.shm_dir, self.folder.parent / LEFT)
        self.record_file.unlink(missing_ok=True)

    def _kill_all(self) -> None:
        """SIGTERM, then SIGKILL, every MPS process of this pipe directory (a daemon that would not quit, or
        servers left behind by a daemon that died)."""
        left = self.mps_processes()
        for signum in (signal.SIGKILL,) if _any_stopped(left) else (signal.SIGTERM, signal.SIGKILL):
            for s in left:
                procs.signal_exact(s.pid, s.start, signum)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                left = [s for s in left if procs.alive(s.pid, s.start)]
                if not left:
                    return
                time.sleep(0.05)

    # -------------------------------------------------------------------------------------- health
    def log_text(self) -> str:
        """The end of the daemon's control and server logs (what this daemon wrote since it started)."""
        return "\n".join(_read_tenant_file(self.log_dir / name, LOG_TAIL, tail=True).decode("utf-8", "replace")
                         for name in ("control.log", "server.log"))

    def faults(self) -> list[str]:
        """Log lines of this daemon's life that report a fatal error of a client or server (FAULT_RE)."""
        return [line.strip() for line in self.log_text().splitlines() if FAULT_RE.search(line)]

    def _log_hint(self) -> str:
        tail = self.log_text().strip().splitlines()[-3:]
        return f"; its log ({self.log_dir}) ends: {' | '.join(tail)}" if tail else ""


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _interpreter(path: Path) -> str | None:
    """The interpreter a ``#!`` script names (its first word), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else None


def _read_tenant_file(path: Path, limit: int, tail: bool = False) -> bytes:
    """Up to ``limit`` bytes of ``path`` (its last ones with ``tail``), b"" when it is missing or not a plain
    file. The pipe and log folders belong to the daemon's user (and in Kubernetes the pipe folder is mounted
    into the containers), but root reads these files: a link there must not make root read another file into
    ``ps`` and metrics, nor a FIFO hang the agent of every tenant (issue 15)."""
    try:
        fd = open_regular(path)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if tail:
            f.seek(max(0, os.fstat(fd).st_size - limit))
        return f.read(limit)


__all__ = ["CONTROL_ENV", "DaemonRecord", "FAULT_RE", "MpsControl", "MpsError", "YIELD_THREADS", "client_env",
           "find_control", "yields"]
