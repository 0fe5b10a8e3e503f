"""The adversarial suite's machine: a root agent on a shared state dir and two throw-away tenants.

Every test here plays a tenant attacking another tenant or root, the way issue 15 found the holes: real
users (created with ``useradd`` for the session and removed with ``userdel`` at its end, names unique per
run so two suites on one machine never meet), real processes started as those users, the real agent
running as root, the real enforcer over the CPU driver double. It needs root (CI runs the suite as root in
a container): without root the tests are skipped, and with ``CI=true`` they fail instead.

Tenant processes run a Python every user can execute (this interpreter if its directories are open to all,
else the system's ``python3.X`` of the same version) with this checkout's ``src`` and the venv's
site-packages on ``PYTHONPATH``: the venv's interpreter may live under ``/root``, which others cannot enter.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tenantkit import BUILD, REPO, Node, Tenant, add_user, end_processes_of, node_env, retry_lock, tenant_python


@pytest.fixture(scope="session", autouse=True)
def as_root() -> None:
    if os.geteuid() == 0:
        return
    reason = "the adversarial suite creates users and runs a root agent: it needs root (CI runs it as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason + f"; running as uid {os.geteuid()}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tenants() -> Iterator[tuple[Tenant, Tenant]]:
    """Two users made for this session: ``gs<6 hex>a`` and ``…b`` (removed at the end, also after failures)."""
    tag = secrets.token_hex(3)
    base = Path(tempfile.mkdtemp(prefix="gpuslice-tenants-"))
    os.chmod(base, 0o755)
    made: list[Tenant] = []
    try:
        for suffix in ("a", "b"):
            made.append(add_user(f"gs{tag}{suffix}", base / suffix))
        yield made[0], made[1]
    finally:
        for t in made:
            end_processes_of(t.uid)
            retry_lock(["userdel", t.name])
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def native() -> Path:
    done = subprocess.run(["make", "-C", str(REPO / "native"), "all"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return BUILD


@pytest.fixture
def bare_node(tenants, native) -> Iterator[Node]:
    """The shared state dir (root-owned, open to all like /var/lib/gpuslice) without an agent."""
    base = Path(tempfile.mkdtemp(prefix="gpuslice-sec-"))
    os.chmod(base, 0o755)
    node = Node(base, node_env(base, tenant_python()), tenant_python())
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def node(bare_node: Node) -> Node:
    """``bare_node`` with a root agent serving it (fast reclaim and sampling)."""
    from nodekit import AgentProcess

    bare_node.agent = AgentProcess(bare_node.env, interval=0.2, reclaim_interval=0.3)
    return bare_node
