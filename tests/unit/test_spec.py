"""spec.py: the one unit parser and the vocabulary's validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.spec import (
    GiB, MiB, ComputeMode, Grant, MemoryAmount, Priority, Request, Slice, SpecError,
    format_bytes, parse_bytes, parse_compute, parse_memory, parse_models,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4GiB", 4 * GiB), ("4Gi", 4 * GiB), ("4g", 4 * GiB), ("4096Mi", 4 * GiB), ("4096MiB", 4 * GiB),
        ("3000", 3000 * MiB), ("3000m", 3000 * MiB), ("512B", 512), ("1KB", 1000), ("2GB", 2 * 10**9),
        ("1.5GiB", 1536 * MiB), (" 8 GiB ", 8 * GiB), ("1Ti", 1024 * GiB),
    ],
)
def test_memory_forms_mean_the_documented_bytes(text: str, expected: int) -> None:
    assert parse_memory(text) == MemoryAmount(bytes=expected)


def test_bare_number_is_mib_as_in_hami() -> None:
    assert parse_bytes("1") == MiB


def test_int_input_is_bytes() -> None:
    assert parse_bytes(4096) == 4096


def test_percent_resolves_against_the_device() -> None:
    amount = parse_memory("50%")
    assert amount.percent == 50 and amount.resolve(80 * GiB) == 40 * GiB


@pytest.mark.parametrize("bad", ["", "abc", "-1GiB", "0", "0%", "101%", "4XB", "4 G i B", "1e3", True, None, 0])
def test_bad_memory_names_the_field_and_the_allowed_form(bad: object) -> None:
    with pytest.raises(SpecError) as info:
        parse_memory(bad, "gpumem")  # type: ignore[arg-type]
    assert info.value.field == "gpumem"
    assert "gpumem" in str(info.value) and "expected" in str(info.value)


def test_percent_is_refused_where_only_bytes_make_sense() -> None:
    with pytest.raises(SpecError, match="percent is not allowed"):
        parse_bytes("50%")


@pytest.mark.parametrize("text, expected", [("30", 30), ("30%", 30), (30, 30), ("0", 0), ("100%", 100)])
def test_compute_forms(text: object, expected: int) -> None:
    assert parse_compute(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["101", "-5", "30.5", "half", "", True, 3.0])
def test_bad_compute_is_refused(bad: object) -> None:
    with pytest.raises(SpecError, match="compute"):
        parse_compute(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=2**50))
def test_format_then_parse_round_trips_any_size(size: int) -> None:
    assert parse_bytes(format_bytes(size)) == size


@given(st.integers(min_value=1, max_value=2**20), st.sampled_from(["Ki", "KiB", "Mi", "MiB", "Gi", "GiB", "k", "m", "g"]))
def test_binary_units_scale_exactly(number: int, unit: str) -> None:
    scale = {"k": 1024, "m": MiB, "g": GiB}[unit[0].lower()]
    assert parse_bytes(f"{number}{unit}") == number * scale


@given(st.integers(min_value=0, max_value=100), st.booleans())
def test_compute_round_trips(share: int, with_percent: bool) -> None:
    assert parse_compute(f"{share}{'%' if with_percent else ''}") == share


def test_priority_accepts_hami_numbers_and_words() -> None:
    assert Priority.parse("0") is Priority.HIGH and Priority.parse("low") is Priority.LOW
    with pytest.raises(SpecError, match="priority"):
        Priority.parse("urgent")


def test_mode_accepts_hami_policy_names() -> None:
    assert ComputeMode.parse("force") is ComputeMode.HARD
    assert ComputeMode.parse("default") is ComputeMode.SOFT
    assert ComputeMode.parse("disable") is ComputeMode.OFF
    with pytest.raises(SpecError, match="mode"):
        ComputeMode.parse("fast")


def test_request_from_mapping_parses_every_field() -> None:
    req = Request.from_mapping({"count": "2", "memory": "4GiB", "compute": "30%", "priority": "high",
                                "mode": "soft", "weight": 4, "exclusive": "false", "models": "V100M16|V100M32"})
    assert req == Request(count=2, memory=MemoryAmount(bytes=4 * GiB), compute=30, priority=Priority.HIGH,
                          mode=ComputeMode.SOFT, weight=4, models=("V100M16", "V100M32"))


@pytest.mark.parametrize(
    "data, field",
    [({"count": 0}, "count"), ({"count": "two"}, "count"), ({"weight": 17}, "weight"),
     ({"compute": 120}, "compute"), ({"gpus": 1}, "gpus"), ({"exclusive": "maybe"}, "exclusive")],
)
def test_request_from_mapping_names_the_bad_field(data: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        Request.from_mapping(data)
    assert info.value.field == field


def test_models_parse_trace_and_list_forms() -> None:
    assert parse_models("V100M16|V100M32") == ("V100M16", "V100M32")
    assert parse_models(["A10", "T4"]) == ("A10", "T4")
    assert parse_models("") == ()
    with pytest.raises(SpecError):
        parse_models("A10||T4")


def test_slice_and_grant_validate() -> None:
    s = Slice("GPU-1", memory_limit=GiB, compute=30)
    assert Grant("g-1", (s,)).slices == (s,)
    with pytest.raises(SpecError, match="memory_limit"):
        Slice("GPU-1", memory_limit=0)
    with pytest.raises(SpecError, match="at most one slice per device"):
        Grant("g-1", (s, s))
    with pytest.raises(SpecError, match="grant_id"):
        Grant("bad id!", (s,))
