"""Co-location fields of requests and slices (issue 13): parsing, the rules between them and the rest of
a request, and their JSON spelling (written only when not the default, so older documents are unchanged)."""

from __future__ import annotations

import pytest

from gpuslice import spec
from gpuslice.spec import Colocation, Request, SpecError, parse_tidal_schedule


@pytest.mark.parametrize("text,canonical", [
    ("0-8:30,8-20:60", "0-8:30,8-20:60"),
    (" 22-6:100 , 6-8:50,", "22-6:100,6-8:50"),  # wraps past midnight; trailing comma as the C parser
    ("0-24:40", "0-24:40"),
    ("", ""),
])
def test_schedules_are_canonical(text: str, canonical: str) -> None:
    assert parse_tidal_schedule(text) == canonical


@pytest.mark.parametrize("text,why", [
    ("8-20", "spans"), ("8-25:10", "hours"), ("24-2:10", "hours"), ("5-5:10", "hours"), ("1-2:0", "percent"),
    ("1-2:101", "percent"), ("22-6:10,5-7:3", "overlap"), ("1-2:5;3-4:5", "spans"), (",", "span"), ("x", "spans"),
    ("\u0668-20:30", "spans"),  # digits of another script: the C parser reads ASCII ones only
])
def test_bad_schedules_name_the_field_and_what_is_allowed(text: str, why: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_tidal_schedule(text)
    assert e.value.field == "tidal_schedule" and why in e.value.allowed


def test_colocation_values() -> None:
    assert Colocation.parse(" Shared ") is Colocation.SHARED
    with pytest.raises(SpecError) as e:
        Colocation.parse("polite")
    assert e.value.field == "colocation" and e.value.allowed == "preemptive, shared or tidal"


@pytest.mark.parametrize("fields,field", [
    ({"colocation": "tidal", "priority": "high"}, "colocation"),
    ({"colocation": "tidal", "mode": "soft"}, "colocation"),
    ({"colocation": "tidal", "engine": "spatial"}, "colocation"),
    ({"colocation": "shared", "tidal_schedule": "0-8:50"}, "tidal_schedule"),
    ({"colocation": "sometimes"}, "colocation"),
])
def test_requests_refuse_what_the_enforcer_would(fields: dict[str, str], field: str) -> None:
    with pytest.raises(SpecError) as e:
        Request.from_mapping(fields)
    assert e.value.field == field


def test_json_round_trip_and_defaults_unwritten() -> None:
    r = Request.from_mapping({"colocation": "tidal", "tidal_schedule": "0-8:30"})
    doc = spec.request_to_json(r)
    assert doc["colocation"] == "tidal" and doc["tidal_schedule"] == "0-8:30"
    assert spec.request_from_json(doc) == r
    plain = spec.request_to_json(Request())
    assert "colocation" not in plain and "tidal_schedule" not in plain
    s = spec.Slice(device_uuid="GPU-a", memory_limit=1, colocation=Colocation.SHARED, priority=spec.Priority.HIGH)
    assert spec.slice_to_json(s)["colocation"] == "shared" and spec.slice_from_json(spec.slice_to_json(s)) == s
    with pytest.raises(SpecError) as e:
        spec.slice_from_json({"uuid": "GPU-a", "memory": 1, "colocation": "x"}, "grant.slices[0]")
    assert e.value.field == "grant.slices[0].colocation"
