"""``gpuslice run``: get a grant, start the command with the enforcer preloaded, release on every exit.

The launcher makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every process of
the command's tree that is orphaned comes back to it: when the command ends, whatever it left behind is
terminated (SIGTERM, then SIGKILL after a grace period) before the grant is released — the tree is the
slice, as a container is. The command runs in its own process group (the terminal's foreground group
when there is a terminal, so Ctrl-C reaches it directly); SIGINT/SIGTERM/SIGHUP sent to the launcher are
forwarded to that group. If the launcher itself is killed, the command gets SIGTERM (``PDEATHSIG``, which
reaches only the direct child); whatever else is left of the tree — grandchildren reparented away from the
dead launcher, processes started before ``set_child`` was recorded — is ended by the ledger's reclaimer
(:func:`gpuslice.local.ledger.slice_processes`: it finds them by process group and by the
``GPUSLICE_SLICE`` entry every process of the command inherits), which then frees the grant.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from gpuslice.spec.errors import GpusliceError
from gpuslice.host import mps, procs
from gpuslice.local.client import GrantService
from gpuslice.local.errors import LaunchError
from gpuslice.local.records import Ask, GrantRecord
from gpuslice.spec import Device, Engine, Priority, SpecError

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
POLL_S = 0.5

_libc = ctypes.CDLL(None, use_errno=True)
grace_seconds = procs.grace_seconds  # $GPUSLICE_KILL_GRACE; the ledger's reclaimer uses the same


# ------------------------------------------------------------------------------------------ devices
# what a device can be called on any node: an index, or a GPU's or MIG instance's UUID as NVML spells them
# (GPU-<hex groups>, MIG-<hex groups>, the older MIG-GPU-<uuid>/<gi>/<ci>)
_DEVICE_NAME = re.compile(r"[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/-]+")  # [0-9]: \d takes any script's digits


def device_names(text: str | None) -> list[str]:
    """``--device``'s entries; one no node could have (not an index or a GPU-/MIG- UUID, or empty) is a usage
    error (exit 2), whatever the devices here are."""
    if not text:
        return []
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        if not _DEVICE_NAME.fullmatch(part):
            raise SpecError("device", part, "a comma list of device indexes (0,1) or UUIDs (GPU-…, MIG-…)")
    return parts


def resolve_devices(text: str | None, devices: Sequence[Device]) -> tuple[str, ...]:
    """``--device 0,1`` or ``--device GPU-…`` → UUIDs; every entry must name a device of this node."""
    if not text:
        return ()
    by_index = {str(d.index): d.uuid for d in devices}
    uuids = {d.uuid for d in devices} | {m.uuid for d in devices for m in d.mig_instances}
    chosen = []
    for part in device_names(text):
        if part in by_index:
            chosen.append(by_index[part])
        elif part in uuids:
            chosen.append(part)
        else:
            allowed = ", ".join(sorted(by_index)) + " or " + ", ".join(sorted(uuids))
            raise SpecError("device", part, f"a device index or UUID of this node: {allowed}")
    return tuple(dict.fromkeys(chosen))


# ------------------------------------------------------------------------------------------ grant
def obtain_grant(service: GrantService, ask: Ask, wait: bool, say: Callable[[str], None]) -> GrantRecord:
    """Acquire, or with ``wait`` queue and poll until granted, saying the queue position as it changes."""
    ticket: int | None = None
    shown = None
    try:
        while True:
            result = service.acquire(ask, wait=wait, ticket=ticket)
            if isinstance(result, GrantRecord):
                return result
            ticket = result.ticket
            if (result.position, result.reason) != shown:
                say(f"waiting: position {result.position} in the queue ({result.reason})")
                shown = (result.position, result.reason)
            time.sleep(POLL_S)
    except BaseException:
        if ticket is not None:
            try:
                service.cancel(ticket)
            except Exception:  # the ledger forgets waiters whose process is gone anyway
                pass
        raise


def child_environment(grant: GrantRecord, enforcer: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = enforcer + (" " + preload if preload else "")
    env["GPUSLICE_SLICE"] = grant.slice_file
    env["CUDA_VISIBLE_DEVICES"] = ",".join(s.device_uuid for s in grant.slices)
    env["GPUSLICE_GRANT"] = grant.grant_id
    for item in grant.slices:  # a spatial slice: a client of its device's MPS daemon
        env.update(mps.client_env(item, grant.mps_pipe_dir))
    return env


# ------------------------------------------------------------------------------------------ process
@dataclass
class _Tree:
    """Signal forwarding to the command's process group; signals before the fork wait in ``pending``."""

    grace: float
    child: int = 0
    terminating: bool = False
    pending: list[int] | None = None

    def forward(self, signum: int, _frame: object = None) -> None:
        if self.child == 0:
            self.pending = (self.pending or []) + [signum]
            return
        _killpg(self.child, signum)
        if signum != signal.SIGINT and not self.terminating:
            self.terminating = True
            signal.signal(signal.SIGALRM, self.kill_all)
            signal.setitimer(signal.ITIMER_REAL, max(self.grace, 0.01))

    def kill_all(self, _signum: int = 0, _frame: object = None) -> None:
        _killpg(self.child, signal.SIGKILL)
        for pid in procs.descendants(os.getpid()):
            _kill(pid, signal.SIGKILL)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def become_subreaper() -> bool:
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _tty_fd() -> int | None:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return None
    try:
        return fd if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp() else None
    except OSError:
        return None


def _give_terminal(fd: int | None, pgid: int) -> None:
    if fd is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _child_setup(tty: int | None) -> Callable[[], None]:
    parent = os.getpid()

    def setup() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)
        _give_terminal(tty, os.getpid())
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl: do not run unsupervised
            os._exit(1)
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)

    return setup


def spawn(cmd: Sequence[str], env: dict[str, str], tty: int | None) -> int:
    """Fork + exec ``cmd`` in its own process group; LaunchError (with 126/127 in .code) if it cannot."""
    import subprocess

    try:
        proc = subprocess.Popen(list(cmd), env=env, preexec_fn=_child_setup(tty), close_fds=True)
    except FileNotFoundError:
        raise _launch_error(f"command not found: {cmd[0]}", 127) from None
    except PermissionError:
        raise _launch_error(f"command is not executable: {cmd[0]}", 126) from None
    except OSError as exc:
        raise _launch_error(f"cannot start {cmd[0]}: {exc}", 126) from None
    proc.returncode = 0  # we reap it ourselves with waitpid(-1); keep Popen from touching it
    return proc.pid


def _launch_error(message: str, code: int) -> LaunchError:
    err = LaunchError(message)
    err.code = code  # type: ignore[attr-defined]
    return err


@contextmanager
def forwarding(grace: float) -> Iterator[_Tree]:
    """Catch SIGINT/SIGTERM/SIGHUP/SIGQUIT from before the fork until the tree is gone."""
    tree = _Tree(grace=grace)
    previous = {s: signal.signal(s, tree.forward) for s in FORWARDED}
    try:
        yield tree
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_tree(tree: _Tree, child: int, tty: int | None = None) -> int:
    """Wait for ``child`` (forwarding signals), then end what is left of its tree; the exit status."""
    tree.child = child
    for signum in tree.pending or []:
        tree.forward(signum)
    status = _wait_for(child, tty)
    leftovers = procs.descendants(os.getpid())
    if leftovers:
        _end_leftovers(leftovers, tree.grace)
    return status


def _wait_for(child: int, tty: int | None) -> int:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WUNTRACED)
        except ChildProcessError:
            return 0
        if pid != child:
            continue
        if os.WIFSTOPPED(status):
            if tty is not None:
                _job_stopped(child, tty)
            continue
        return os.waitstatus_to_exitcode(status)


def _job_stopped(child: int, tty: int) -> None:
    """Ctrl-Z on a terminal stopped the command: stop with it (the shell sees the job stopped), and on
    SIGCONT (``fg``/``bg``) hand the terminal back if we are in the foreground and continue the command."""
    _give_terminal(tty, os.getpgrp())
    os.kill(os.getpid(), signal.SIGSTOP)
    try:  # resumed: with `fg` our group is the terminal's foreground again
        foreground = os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        foreground = False
    if foreground:
        _give_terminal(tty, child)
    _killpg(child, signal.SIGCONT)


def _end_leftovers(pids: list[int], grace: float) -> None:
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap()
        if not procs.descendants(os.getpid()):
            return
        time.sleep(0.05)
    for pid in procs.descendants(os.getpid()):
        _kill(pid, signal.SIGKILL)
    while procs.descendants(os.getpid()):
        _reap()
        time.sleep(0.02)
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def shell_code(status: int) -> int:
    """waitstatus_to_exitcode gives -N for a signal: shells report 128 + N."""
    return 128 - status if status < 0 else status


# ------------------------------------------------------------------------------------------ the verb
def run_command(service: GrantService, ask: Ask, cmd: Sequence[str], *, wait: bool, enforcer: str,
                say: Callable[[str], None]) -> int:
    """The whole of ``gpuslice run`` after argument parsing; returns the shell exit code."""
    if not cmd:
        raise SpecError("command", "", "a command after --, like: gpuslice run --memory 4GiB -- python train.py")
    try:
        grant = obtain_grant(service, ask, wait, say)
    except KeyboardInterrupt:
        say("interrupted while waiting; nothing was granted")
        return 130
    try:
        say(describe_grant(grant))
        note = engine_note(ask, grant)
        if note:
            say(note)
        become_subreaper()
        tty = _tty_fd()
        with forwarding(grace_seconds()) as tree:
            try:
                child = spawn(cmd, child_environment(grant, enforcer), tty)
            except LaunchError as exc:
                say(f"error: {exc}")
                return int(getattr(exc, "code", 127))
            try:
                _record_child(service, grant.grant_id, child, say)
                status = wait_tree(tree, child, tty)
            finally:
                _give_terminal(tty, os.getpgrp())
        return shell_code(status)
    finally:
        _release_quietly(service, grant.grant_id, say)


def engine_note(ask: Ask, grant: GrantRecord) -> str | None:
    """What `gpuslice run` says of an engine it chose (``--engine auto``): what spatial gives up, or why a slice
    that preferred spatial (one naming its priority) was time-sliced, with what to do for the spatial pair. The
    ledger does not say which rule decided, so a note names every cause that can have."""
    if not ask.engine_auto:
        return None
    preferred = ask.request.engine
    if any(s.engine is Engine.SPATIAL for s in grant.slices):
        why = ("for a slice that names its priority" if preferred is Engine.SPATIAL else
               "as time-sliced it fit nowhere it may run (a device runs one engine at a time): it joined your spatial "
               "slices there")
        return (f"engine spatial, gpuslice's choice (--engine auto) {why}: an MPS client, so a fault in one of your "
                "spatial processes on the device ends the others there too, and the slice cannot be resized in place; "
                "--engine timeslice keeps the time-sliced engine")
    if preferred is not Engine.SPATIAL:
        return None
    if ask.request.priority is Priority.LOW:
        return ("engine timeslice, gpuslice's choice (--engine auto): a low-priority slice is spatial only where the "
                "node has MPS and a device it may use holds your high-priority spatial server with room beside it (its "
                "SM cap is set when its process starts) and the device's MPS daemon could start; if you started it "
                "before its server, start the server first (README, Spatial slices)")
    return ("engine timeslice, gpuslice's choice (--engine auto): no device it may use could take it as an MPS client "
            "(this node has no MPS binaries, its MPS daemon could not start, or each device with room runs time-sliced "
            "slices, another user's spatial ones, or your low-priority spatial slices with no server beside them: a "
            "device runs one engine at a time); beside it, slices are paced by priority")


def _record_child(service: GrantService, grant_id: str, child: int, say: Callable[[str], None]) -> None:
    """Record the command's pid (its group is the slice). A failure must not orphan the running command:
    the launcher still supervises it, and the reclaimer finds it by its GPUSLICE_SLICE entry if we die."""
    try:
        service.set_child(grant_id, child, procs.start_time(child))
    except GpusliceError as exc:
        say(f"warning: could not record the command's pid {child} in the grant ({exc})")


def _release_quietly(service: GrantService, grant_id: str, say: Callable[[str], None]) -> None:
    for attempt in range(3):
        try:
            service.release(grant_id)
            return
        except Exception as exc:  # the agent's reclaimer will release it once our processes are gone
            if attempt == 2:
                if _release_in_ledger(service, grant_id):
                    say(f"the agent did not answer ({exc}); released grant {grant_id} in its ledger file")
                    return
                say(f"warning: could not release grant {grant_id} now ({exc}); it is reclaimed when "
                    "its processes are gone")
            time.sleep(0.2)


def _release_in_ledger(service: GrantService, grant_id: str) -> bool:
    """The agent is gone (killed): release in the ledger file of its state dir, when we may write it, so that
    neither the grant nor an MPS daemon whose last client it was waits for the next agent or ``ps``."""
    socket_path = getattr(service, "socket_path", None)
    if socket_path is None:
        return False
    from gpuslice.local.ledger import Ledger, recorded_pids
    from gpuslice.local.paths import StateDir

    try:
        ledger = Ledger(StateDir(socket_path.parent), [], region_pids=recorded_pids)
        try:
            ledger.release(grant_id)
        finally:
            ledger.close()
    except Exception:  # not ours to write (a root agent's ledger) or unreadable: the next agent reclaims it
        return False
    return True


def describe_grant(grant: GrantRecord) -> str:
    """One line per grant: each slice's device, memory limit and compute share (``unpaced`` for 0: no share
    reserved, the slice's kernels are not paced); devices held whole say so."""
    from gpuslice.spec import human_bytes

    def one(s) -> str:
        if grant.exclusive and not s.compute:
            return f"{s.device_uuid} whole device: memory {human_bytes(s.memory_limit)}, all of its compute"
        if s.engine.value == "spatial":
            client = "spatial, MPS" + (", below-normal client" if mps.yields(s) else "")
            if 0 < s.compute < 100:
                compute = f"compute {s.compute}% of the SMs ({client})"
            elif s.compute == 0 and mps.yields(s):  # the enforcer decides at each process's start
                compute = f"compute: every SM, {mps.YIELD_THREADS}% beside a high-priority slice ({client})"
            else:
                compute = f"compute: every SM ({client})"
        else:
            compute = f"compute {s.compute}% ({s.mode.value})" if s.compute else "compute unpaced"
        held = " whole device:" if grant.exclusive else ""
        return f"{s.device_uuid}{held} memory {human_bytes(s.memory_limit)} {compute}"

    return f"grant {grant.grant_id}: " + "; ".join(one(s) for s in grant.slices)


def command_text(cmd: Sequence[str]) -> str:
    """The command line as the ledger shows it: its first 500 characters, bytes that are not UTF-8 (Python hands
    them over as surrogate escapes) as U+FFFD, so every answer and table that carries it can be encoded."""
    return shlex.join(cmd).encode("utf-8", "surrogateescape").decode("utf-8", "replace")[:500]
