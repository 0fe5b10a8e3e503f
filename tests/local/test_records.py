"""Local records: their JSON is the spec codec's spelling, exact inverses, and missing fields are named."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpuslice.host import procs
from gpuslice.host.devices import load_snapshot
from gpuslice.local.records import Ask, GrantRecord
from gpuslice.spec import GiB, Grant, Priority, Request, Slice, SpecError, parse_memory, request_from_json, request_to_json

DEVICES = load_snapshot("h100-80gb")


def grant(tmp_path: Path, memory=4 * GiB, compute=30, created=None) -> GrantRecord:
    return GrantRecord(grant=Grant("g-1", (Slice(DEVICES[0].uuid, memory, compute),)), owner="bob",
                       request=Request(memory=parse_memory(memory), compute=compute), created=created or time.time(),
                       holder_pid=os.getpid(), holder_start=procs.start_time(os.getpid()),
                       slice_file=str(tmp_path / "slice"), region_file=str(tmp_path / "region"))


def test_records_round_trip(tmp_path):
    r = Request(count=2, memory=parse_memory("50%"), compute=20, priority=Priority.HIGH)
    assert request_from_json(json.loads(json.dumps(request_to_json(r)))) == r
    a = Ask(r, "me", 12, 34, uid=1000, devices=("GPU-x",), command="python x.py", policy="spread")
    assert Ask.from_json(json.loads(json.dumps(a.to_json()))) == a
    g = grant(tmp_path)
    assert GrantRecord.from_json(json.loads(json.dumps(g.to_json()))) == g


def test_ask_refuses_missing_fields():
    with pytest.raises(SpecError, match="holder_pid"):
        Ask.from_json({"owner": "x", "holder_start": 1, "request": {}})
    with pytest.raises(SpecError, match="compute"):
        Ask.from_json({"owner": "x", "holder_pid": 1, "holder_start": 1, "request": {"compute": 130}})


def test_an_ask_with_text_utf8_cannot_carry_is_refused_naming_the_field():
    """JSON's "\\udcff" decodes to a lone surrogate, which no UTF-8 answer can carry: stored as a command, it made
    every agent answer that held it fail (ps, top and the dashboard, for every user: helper 42). It is refused at
    the door, naming the field; a device name must be ASCII."""
    base = {"holder_pid": 1, "holder_start": 1, "request": {}, "owner": "x"}
    for field, value in (("command", "sleep \udcff"), ("owner", "\ud800x"), ("policy", "binpack\udcff")):
        with pytest.raises(SpecError) as err:
            Ask.from_json(json.loads(json.dumps({**base, field: value})))
        assert err.value.field == field and "valid Unicode" in err.value.allowed
        json.dumps(str(err.value)).encode("utf-8")  # the refusal itself can be sent
    with pytest.raises(SpecError) as err:
        Ask.from_json({**base, "devices": ["GPU-\udcff"]})
    assert err.value.field == "devices"
    assert Ask.from_json({**base, "command": "python zürich.py ✓"}).command == "python zürich.py ✓"
