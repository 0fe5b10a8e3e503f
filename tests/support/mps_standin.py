#!/usr/bin/env python3
"""A stand-in for NVIDIA's ``nvidia-cuda-mps-control`` (and, under the name ``nvidia-cuda-mps-server``, for its
server), for the CPU tests of the MPS daemon lifecycle. The tests copy it into a temporary folder under
those two names and point ``GPUSLICE_MPS_CONTROL`` at the first.

It behaves as the real control daemon does where gpuslice depends on it:

* ``-d``: daemonizes (double fork, new session), creates ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a Unix socket)
  and ``nvidia-cuda-mps-control.pid``, logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log``; refuses to start when a
  daemon already answers on that pipe directory. Its process name (``/proc/<pid>/comm``) is
  ``nvidia-cuda-mps``, as the real binaries'.
* no argument: reads control commands from stdin, sends each to the daemon, prints the answers; exit 1
  when no daemon answers.
* commands: ``get_server_list``, ``start_server -uid N`` (spawns a server process, as a client's first
  connection does), ``set_default_active_thread_percentage N`` and other ``set_*``, ``quit`` (ends the
  servers, removes its socket and pid file, exits).
* test-only commands: ``standin_fault`` (the server logs a fatal GPU exception, as MPS does when a client
  faults), ``standin_crash`` (the daemon dies at once, leaving its socket, pid file and servers behind),
  ``standin_hang_quit`` (``quit`` is then ignored: the caller must force it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOGS = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
CONTROL = os.path.join(PIPE, "control")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")


def set_comm() -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(15, b"nvidia-cuda-mps", 0, 0, 0)  # PR_SET_NAME, as the real binaries are named


def log(name: str, text: str) -> None:
    # the real daemon keeps its log open: a log folder moved away (the node side keeps a faulted daemon's logs
    # before it restarts it) loses lines, never the daemon
    try:
        with open(os.path.join(LOGS, name), "a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} Control {os.getpid()}] {text}\n")
    except OSError:
        pass


def answers() -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(CONTROL)
        return True
    except OSError:
        return False


def server_main() -> None:
    set_comm()
    log("server.log", "Server has started")
    signal.signal(signal.SIGTERM, lambda *_: (log("server.log", "Server exiting"), os._exit(0)))
    while True:
        time.sleep(3600)


class Daemon:
    def __init__(self) -> None:
        self.servers: list[subprocess.Popen] = []
        self.hang_quit = False

    def handle(self, command: str) -> str | None:
        words = command.split()
        if not words:
            return ""
        log("control.log", f"Cmd:{command}")
        if words[0] == "get_server_list":
            return "".join(f"{p.pid}\n" for p in self.servers if p.poll() is None)
        if words[0] == "start_server":
            here = os.path.dirname(os.path.abspath(sys.argv[0]))
            proc = subprocess.Popen([os.path.join(here, "nvidia-cuda-mps-server")], start_new_session=False)
            self.servers.append(proc)
            log("control.log", f"Starting new server {proc.pid} for user {words[-1]}")
            return ""
        if words[0] == "standin_fault":
            log("server.log", "Client 4242 encountered a fatal GPU exception (illegal address); "
                "the server waits for all its clients to exit")
            return ""
        if words[0] == "standin_crash":
            os._exit(3)
        if words[0] == "standin_hang_quit":
            self.hang_quit = True
            return ""
        if words[0] == "quit":
            if self.hang_quit:
                return ""
            for p in self.servers:
                if p.poll() is None:
                    p.terminate()
                    p.wait()
            log("control.log", "Exit")
            for path in (CONTROL, PID_FILE):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            return None
        return ""

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                reply = self.handle(data.decode().strip())
                if reply is None:
                    conn.sendall(b"")
                    conn.close()
                    os._exit(0)
                conn.sendall(reply.encode())


def daemon_main() -> int:
    if answers():
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    os.makedirs(PIPE, exist_ok=True)
    os.makedirs(LOGS, exist_ok=True)
    if os.fork():
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    set_comm()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        os.unlink(CONTROL)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(CONTROL)
    listener.listen(16)
    with open(PID_FILE, "w") as f:
        f.write(f"{os.getpid()}\n")
    log("control.log", f"Starting control daemon using socket {CONTROL}")
    Daemon().serve(listener)
    return 0


def client_main() -> int:
    out = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(CONTROL)
                s.sendall(line.strip().encode() + b"\n")
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
        except OSError:
            print("Cannot find MPS control daemon process")
            return 1
        sys.stdout.write(reply.decode())
    return out


if __name__ == "__main__":
    if os.path.basename(sys.argv[0]) == "nvidia-cuda-mps-server":
        server_main()
    sys.exit(daemon_main() if sys.argv[1:] == ["-d"] else client_main())
