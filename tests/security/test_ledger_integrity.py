"""A damaged or lost ledger never silently frees memory, and never stops the rest of the node working.

Issue 15: one bad grant row made every ``ps``/``run`` die with a traceback; a ledger truncated to 0 bytes
while grants were live silently forgot them and over-committed the next request; ``--memory
9999999999999999GiB`` ended in an ``OverflowError`` traceback.
"""

from __future__ import annotations

import json
import os
import sqlite3

from tenantkit import Node, wait_for


def _rows(node: Node) -> list[tuple[str, str]]:
    from contextlib import closing

    try:
        with closing(sqlite3.connect(node.state / "ledger.db")) as db:  # closed: an open one would hold a lock
            return db.execute("SELECT id, record FROM grants").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []


def test_one_bad_grant_row_is_reported_by_id_and_the_rest_works(bare_node: Node):
    node = bare_node  # the ledger file itself, no agent in between
    first = node.gpuslice(None, "run", "--device", "0", "--memory", "12GiB", "--", "sleep", "600")
    wait_for(lambda: (node.state / "ledger.db").exists() and _rows(node), "the first grant")
    (gid, text), = _rows(node)
    record = json.loads(text)
    del record["owner"]  # a field missing: the slices still read
    db = sqlite3.connect(node.state / "ledger.db")
    with db:
        db.execute("UPDATE grants SET record = ? WHERE id = ?", (json.dumps(record), gid))
        db.execute("INSERT INTO grants (id, record) VALUES ('g-garbage', '{not json')")
    db.close()
    ps = node.cli(None, "ps")
    assert ps.returncode == 0 and "Traceback" not in ps.stderr, ps.stderr
    assert gid in ps.stdout and "g-garbage" in ps.stdout, ps.stdout  # both named
    as_json = node.cli(None, "ps", "--json")
    assert as_json.returncode == 0
    assert any(gid in e for e in json.loads(as_json.stdout)["errors"])
    # the damaged grant's 12 GiB stay reserved: 8 GiB more on the 16 GiB device 0 does not fit there ...
    refused = node.cli(None, "run", "--device", "0", "--memory", "8GiB", "--", "true")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    # ... and other requests are granted as usual
    ok = node.cli(None, "run", "--device", "1", "--memory", "8GiB", "--", "true")
    assert ok.returncode == 0, ok.stderr
    first.kill()


def test_a_truncated_ledger_with_live_grants_refuses_instead_of_over_committing(node: Node):
    """The agent is restarted on a ledger truncated to 0 bytes while a grant's program still runs."""
    from nodekit import AgentProcess

    holder = node.gpuslice(None, "run", "--device", "0", "--memory", "12GiB", "--", "sleep", "600")
    wait_for(lambda: _rows(node), "the grant")
    node.agent.stop()
    for name in ("ledger.db-wal", "ledger.db-shm"):
        try:
            os.unlink(node.state / name)
        except FileNotFoundError:
            pass
    os.truncate(node.state / "ledger.db", 0)
    node.agent = AgentProcess(node.env, interval=0.2, reclaim_interval=0.3)
    over = node.cli(None, "run", "--device", "0", "--memory", "8GiB", "--", "true")
    assert over.returncode == 1, (over.stdout, over.stderr)  # 12 + 8 GiB on a 16 GiB device: never granted
    assert "no record of grant" in over.stderr and "Traceback" not in over.stderr, over.stderr
    wait_for(lambda: "no record of grant" in node.cli(None, "ps").stdout, "ps to name the lost grant")
    holder.kill()  # the launcher dies, its sleep with it (PDEATHSIG): nothing carries the grant any more
    holder.wait()
    wait_for(lambda: node.cli(None, "run", "--device", "0", "--memory", "8GiB", "--", "true").returncode == 0,
             "granting to resume once the lost grant's processes are gone", timeout=90, every=0.5)


def test_an_absurd_memory_size_is_a_usage_error_not_a_traceback(bare_node: Node):
    done = bare_node.cli(None, "run", "--memory", "9999999999999999GiB", "--", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--memory" in done.stderr
