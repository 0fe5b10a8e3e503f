"""The wait queue under attack: one user's waiting ticket must not hold back other users' requests that fit.

Before this fix any caller could queue a request at high priority that cannot fit now, and every other user's
request that fit on the same device was refused (or queued) behind it for as long as it waited — one ticket
jammed the device for everyone (issue 15, attacker's review). The rule now (``local/admission.py``): a user
orders their own queue; root's waiting tickets hold back everyone's later or lower-priority requests; a user's
waiting ticket holds back no other user's request; a user may keep at most ``MAX_WAITING_PER_USER`` waiting."""

from __future__ import annotations

import json
import os
import subprocess

from tenantkit import DOUBLE_TOTAL, Node, double_uuid, wait_for

from gpuslice.local.admission import MAX_WAITING_PER_USER

# POST /v1/grants as the calling user: argv = socket, device, memory (MiB), priority, wait (0/1), hold (0/1).
# Prints "<status> <body>"; with hold, keeps its holder process (and so its ticket or grant) until stdin ends.
POST = r"""
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX); sock.connect(sys.argv[1])
start = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19])
body = {"request": {"count": 1, "memory": int(sys.argv[3]), "priority": sys.argv[4]}, "owner": "x",
        "holder_pid": os.getpid(), "holder_start": start, "devices": [sys.argv[2]], "wait": sys.argv[5] == "1"}
raw = json.dumps(body).encode()
sock.sendall(b"POST /v1/grants HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
             % len(raw) + raw)
data = b""
while b"\r\n\r\n" not in data:
    chunk = sock.recv(65536)
    if not chunk:
        sys.exit("connection closed before a full response")
    data += chunk
head, rest = data.split(b"\r\n\r\n", 1)
length = int(next(l.split(b":", 1)[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
while len(rest) < length:
    rest += sock.recv(65536)
print(head.split()[1].decode(), rest.decode(), flush=True)
if sys.argv[6] == "1":
    sys.stdin.read()
"""

MIB = 1 << 20
TOTAL_MIB = DOUBLE_TOTAL // MIB

# Started by root: becomes user argv[7] / group argv[8] (real and effective; saved uid still 0), posts as POST
# does (argv[1..6], hold "0"), then takes effective uid 0 back, as a holder that execs a setuid-root program
# (passwd waiting at its prompt) would be, and prints "root". Dumpable again after each change, so /proc/<pid>
# is its euid's.
BECOME_USER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.setgroups([]); os.setresgid(int(sys.argv[8]), int(sys.argv[8]), 0); os.setresuid(int(sys.argv[7]), int(sys.argv[7]), 0)
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
"""
TURN_ROOT = r"""
os.seteuid(0); libc.prctl(4, 1, 0, 0, 0)
print("root", flush=True)
sys.stdin.read()
"""


def _post(node: Node, tenant, memory_mib: int, priority: str, wait: bool, hold: bool):
    """(status, body, process): the process is kept (holding its ticket or grant) when ``hold``."""
    args = [node.python, "-c", POST, str(node.state / "agent.sock"), double_uuid(0), str(memory_mib), priority,
            "1" if wait else "0", "1" if hold else "0"]
    proc = node.popen(tenant, args, stdin=subprocess.PIPE)
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no answer"
    status, body = line.split(" ", 1)
    return int(status), json.loads(body), proc


def _half_of_device_0_held_by_root(node: Node):
    hog = node.gpuslice(None, "run", "--device", "0", "--memory", f"{TOTAL_MIB // 2}MiB", "--", "sleep", "600")
    wait_for(node.grants, "the root grant on device 0")
    return hog


def test_one_users_high_priority_waiting_ticket_does_not_hold_back_another_users_fitting_request(node: Node, tenants):
    a, b = tenants
    hog = _half_of_device_0_held_by_root(node)
    status, body, jammer = _post(node, b, TOTAL_MIB * 3 // 4, "high", wait=True, hold=True)
    assert status == 202, body  # b waits: three quarters do not fit beside root's half
    status, body, _ = _post(node, a, TOTAL_MIB // 10, "low", wait=False, hold=False)
    assert status == 201, body  # a's tenth fits now and is placed, b's ticket notwithstanding
    jammer.kill()
    hog.kill()


def test_a_ticket_whose_holder_turns_setuid_root_is_still_its_users(node: Node, tenants):
    """A ticket is the user's who queued it, not whoever /proc says runs its holder now: a holder that execs a
    setuid-root program (passwd at its prompt) made the queue take b's ticket for root's, so it held back every
    other user's fitting request and stopped counting toward b's cap (attacker's review, stop 28)."""
    a, b = tenants
    hog = _half_of_device_0_held_by_root(node)
    args = [node.python, "-c", BECOME_USER + POST + TURN_ROOT, str(node.state / "agent.sock"), double_uuid(0),
            str(TOTAL_MIB * 3 // 4), "high", "1", "0", str(b.uid), str(b.gid)]
    jammer = node.popen(None, args, stdin=subprocess.PIPE)
    status, body = jammer.stdout.readline().split(" ", 1)
    assert int(status) == 202, body  # queued as b: three quarters do not fit beside root's half
    assert jammer.stdout.readline().strip() == "root", jammer.stderr.read()
    assert os.stat(f"/proc/{jammer.pid}").st_uid == 0  # what the queue used to read as the ticket's user
    status, body, _ = _post(node, a, TOTAL_MIB // 10, "low", wait=False, hold=False)
    assert status == 201, body  # a's tenth fits and is placed: b's ticket is still b's
    held = []
    for _ in range(MAX_WAITING_PER_USER - 1):  # and it still counts toward b's waiting requests
        status, body, proc = _post(node, b, TOTAL_MIB * 3 // 4, "low", wait=True, hold=True)
        assert status == 202, body
        held.append(proc)
    status, body, _ = _post(node, b, TOTAL_MIB * 3 // 4, "low", wait=True, hold=False)
    assert status == 400 and body["field"] == "wait", body
    for proc in [*held, jammer, hog]:
        proc.kill()


def test_roots_waiting_ticket_still_holds_back_later_requests(node: Node, tenants):
    a, _ = tenants
    hog = _half_of_device_0_held_by_root(node)
    status, body, waiter = _post(node, None, TOTAL_MIB * 3 // 4, "high", wait=True, hold=True)
    assert status == 202, body
    status, body, _ = _post(node, a, TOTAL_MIB // 10, "low", wait=False, hold=False)
    assert status == 409 and "ahead in the queue" in body["message"], body  # reserved for root's waiter
    waiter.kill()
    hog.kill()


def test_a_user_may_keep_only_so_many_requests_waiting(node: Node, tenants):
    _, b = tenants
    hog = _half_of_device_0_held_by_root(node)
    held = []
    for _ in range(MAX_WAITING_PER_USER):
        status, body, proc = _post(node, b, TOTAL_MIB * 3 // 4, "low", wait=True, hold=True)
        assert status == 202, body
        held.append(proc)
    status, body, _ = _post(node, b, TOTAL_MIB * 3 // 4, "low", wait=True, hold=False)
    assert status == 400 and body["field"] == "wait", body
    assert f"at most {MAX_WAITING_PER_USER} waiting requests per user" in body["message"]
    status, body, root_waiter = _post(node, None, TOTAL_MIB * 3 // 4, "low", wait=True, hold=True)
    assert status == 202, body  # root is not limited
    for proc in [*held, root_waiter, hog]:
        proc.kill()
