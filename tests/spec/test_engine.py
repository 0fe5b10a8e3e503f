"""The engine of a slice (timeslice | spatial) in the vocabulary and its one JSON spelling."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.spec import (
    Engine, GiB, Grant, Request, Slice, SpecError, grant_from_json, grant_to_json, request_from_json, request_to_json,
    slice_from_json, slice_to_json,
)


def test_default_engine_is_timeslice_everywhere() -> None:
    assert Request().engine is Engine.TIMESLICE
    assert Slice("GPU-a", GiB).engine is Engine.TIMESLICE


@pytest.mark.parametrize("text, expected", [("spatial", Engine.SPATIAL), (" Spatial ", Engine.SPATIAL),
                                            ("mps", Engine.SPATIAL), ("timeslice", Engine.TIMESLICE),
                                            ("time-slice", Engine.TIMESLICE)])
def test_engine_names(text: str, expected: Engine) -> None:
    assert Engine.parse(text) is expected


@pytest.mark.parametrize("bad", ["", "mig", "spatial2", None, 1])
def test_a_bad_engine_names_the_field_and_the_choices(bad: object) -> None:
    with pytest.raises(SpecError) as info:
        Request.from_mapping({"engine": bad})
    assert info.value.field == "engine" and "timeslice or spatial" in info.value.allowed


def test_a_spatial_request_covers_one_device() -> None:
    """A process is the client of one MPS daemon; gpuslice runs one per device."""
    assert Request(engine=Engine.SPATIAL, exclusive=True).count == 1
    with pytest.raises(SpecError) as info:
        Request(count=2, engine=Engine.SPATIAL)
    assert info.value.field == "engine" and "more than one device" in info.value.allowed


def test_documents_without_engine_decode_unchanged_and_timeslice_writes_no_key() -> None:
    """Ledgers and annotations written before the engine existed read as time-sliced, and a time-sliced
    slice is written exactly as before (no new key): byte-identical documents."""
    old = {"uuid": "GPU-a", "memory": GiB, "compute": 30, "priority": 1, "mode": "hard", "weight": 1}
    item = slice_from_json(old)
    assert item.engine is Engine.TIMESLICE and slice_to_json(item) == old
    assert "engine" not in request_to_json(Request())
    assert request_from_json({"count": 1}).engine is Engine.TIMESLICE


def test_spatial_is_spelled_and_read_back() -> None:
    item = Slice("GPU-a", 4 * GiB, compute=25, engine=Engine.SPATIAL)
    data = slice_to_json(item)
    assert data["engine"] == "spatial" and slice_from_json(json.loads(json.dumps(data))) == item
    req = Request(compute=25, engine=Engine.SPATIAL)
    assert request_to_json(req)["engine"] == "spatial" and request_from_json(request_to_json(req)) == req


def test_a_bad_engine_in_a_document_names_its_path() -> None:
    doc = {"grant": "g-1", "exclusive": False,
           "slices": [{"uuid": "GPU-a", "memory": GiB, "engine": "fast"}]}
    with pytest.raises(SpecError) as info:
        grant_from_json(doc, "ledger.entries[x]")
    assert info.value.field == "ledger.entries[x].slices[0].engine"


@given(st.sampled_from(list(Engine)), st.integers(0, 100), st.integers(1, 2**40))
def test_slices_of_either_engine_round_trip(engine: Engine, compute: int, memory: int) -> None:
    grant = Grant("g-1", (Slice("GPU-a", memory, compute=compute, engine=engine),))
    assert grant_from_json(json.loads(json.dumps(grant_to_json(grant)))) == grant
