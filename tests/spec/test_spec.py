"""spec.py: the one unit parser and the vocabulary's validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice.spec import (
    GiB, MiB, TiB, ComputeMode, Device, Grant, MemoryAmount, MigInstance, Priority, Request, Slice, SpecError,
    format_bytes, parse_bytes, parse_compute, parse_memory, parse_models, whole_number,
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


@given(st.floats(min_value=0, max_value=100, exclude_min=True, allow_nan=False))
def test_percent_round_trips_through_its_text(percent: float) -> None:
    """What str() writes (the ledger stores it) parses back to the same share, however many digits."""
    amount = MemoryAmount(percent=percent)
    assert parse_memory(str(amount)) == amount


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["KB", "MB", "GB", "TB", "kb", "Gb"]))
def test_decimal_units_scale_exactly(number: int, unit: str) -> None:
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}[unit[0].lower()]
    assert parse_bytes(f"{number}{unit}") == number * scale


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=999),
       st.sampled_from(["MB", "GB", "TB", "MiB", "GiB", "TiB"]))
def test_fractions_are_exact_not_float_rounded(whole: int, thousandths: int, unit: str) -> None:
    scale = {"MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "MiB": MiB, "GiB": GiB, "TiB": TiB}[unit]
    exact = (whole * 1000 + thousandths) * scale
    assert parse_bytes(f"{whole}.{thousandths:03d}{unit}") == (exact + 500) // 1000


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


# --------------------------------------------------------------------------------------------- one parser, options
def test_bare_unit_says_what_a_number_without_unit_means() -> None:
    assert parse_bytes("4096") == 4096 * MiB
    assert parse_bytes("4096", bare_unit=1) == 4096
    assert parse_memory("2", bare_unit=GiB) == MemoryAmount(bytes=2 * GiB)
    with pytest.raises(ValueError, match="bare_unit"):
        parse_bytes("1", bare_unit=3)


@pytest.mark.parametrize("text, expected", [("0", 0), ("4294967296", 4 * GiB), ("4g", 4 * GiB), ("4GiB", 4 * GiB),
                                            ("3000m", 3000 * MiB), ("512MB", 512 * 10**6), ("18446744073709551615", 2**64 - 1)])
def test_strict_mode_is_the_slice_file_grammar(text: str, expected: int) -> None:
    assert parse_bytes(text, bare_unit=1, allow_zero=True, strict=True, max_bytes=2**64 - 1) == expected


@pytest.mark.parametrize("bad", ["4 g", " 4g", "4g ", "1.5g", "50%", "4kibb", "", "g", "-1", "18446744073709551616",
                                 "16777216Ti", "4g\n"])
def test_strict_mode_refuses_what_the_c_parser_refuses(bad: str) -> None:
    with pytest.raises(SpecError, match="memory_limit"):
        parse_bytes(bad, "memory_limit", bare_unit=1, allow_zero=True, strict=True, max_bytes=2**64 - 1)


def test_zero_and_max_are_the_callers_choice() -> None:
    with pytest.raises(SpecError, match="above zero"):
        parse_bytes("0")
    assert parse_bytes("0", allow_zero=True) == 0
    with pytest.raises(SpecError, match="at most 1024 bytes"):
        parse_bytes("2KiB", max_bytes=1024)


def test_the_slice_file_calls_the_one_parser() -> None:
    """ARCHITECTURE 'Units: one parser': the slice file has no unit table of its own."""
    from gpuslice.enforcer import slicefile

    assert not hasattr(slicefile, "_UNITS") and not hasattr(slicefile, "_BYTES_RE")
    assert slicefile.parse_bytes("4096") == 4096 and slicefile.parse_bytes("4Gi") == 4 * GiB
    with pytest.raises(ValueError):
        slicefile.parse_bytes("1.5g")


_C_UNITS = {"": 1, "b": 1, "k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mi": 1 << 20,
            "mib": 1 << 20, "mb": 1000**2, "g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1000**3,
            "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1000**4}


def _c_grammar(text: str) -> int | None:
    """native/src/config/config.c gs_parse_bytes, transcribed: digits, then a unit from its table; None = refused."""
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0:
        return None
    unit = text[digits:].lower()
    if unit not in _C_UNITS or not text[digits:].isascii():
        return None
    value = int(text[:digits]) * _C_UNITS[unit]
    return value if value <= 2**64 - 1 else None


@given(st.text(alphabet="0123456789kKmMgGtTiIbB. %x", max_size=8))
def test_slice_file_sizes_follow_the_c_grammar(text: str) -> None:
    from gpuslice.enforcer import slicefile

    try:
        got: int | None = slicefile.parse_bytes(text)
    except ValueError:
        got = None
    assert got == _c_grammar(text)


# --------------------------------------------------------------------------------------------- MIG instances
def _card(**extra) -> Device:
    fields = dict(uuid="GPU-a", index=0, name="NVIDIA A100 80GB PCIe", memory_total=80 * GiB, sm_count=108,
                  mig_enabled=True)
    return Device(**{**fields, **extra})


@pytest.mark.parametrize(
    "kwargs, field",
    [({"uuid": ""}, "mig_instances.uuid"), ({"uuid": None}, "mig_instances.uuid"), ({"profile": " "}, "mig_instances.profile"),
     ({"memory_total": 0}, "mig_instances.memory_total"), ({"memory_total": 1.5}, "mig_instances.memory_total"),
     ({"sm_count": -1}, "mig_instances.sm_count"), ({"sm_count": True}, "mig_instances.sm_count")],
)
def test_mig_instance_fields_are_validated(kwargs: dict, field: str) -> None:
    good = {"uuid": "MIG-1", "profile": "1g.10gb", "memory_total": 9728 * MiB, "sm_count": 14}
    with pytest.raises(SpecError) as info:
        MigInstance(**{**good, **kwargs})
    assert info.value.field == field


def test_mig_instances_must_belong_to_a_mig_card_and_fit_in_it() -> None:
    one = MigInstance("MIG-1", "3g.40gb", 40192 * MiB, 42)
    assert _card(mig_instances=(one,)).mig_instances == (one,)
    with pytest.raises(SpecError, match="mig_enabled is false"):
        _card(mig_enabled=False, mig_instances=(one,))
    with pytest.raises(SpecError, match="distinct"):
        _card(mig_instances=(one, one))
    with pytest.raises(SpecError, match="memory"):
        _card(mig_instances=(one, MigInstance("MIG-2", "3g.40gb", 40192 * MiB, 42)), memory_total=60 * GiB)
    with pytest.raises(SpecError, match="sm_count"):
        _card(mig_instances=(one, MigInstance("MIG-2", "7g.80gb", 10 * GiB, 98)))


@pytest.mark.parametrize("fields, field", [
    ({"mig_enabled": "false"}, "mig_enabled"), ({"nvlink_peers": ["GPU-1", 2]}, "nvlink_peers"),
    ({"nvlink_peers": ["GPU-1"]}, "nvlink_peers"), ({"numa_node": "0"}, "numa_node"),
    ({"compute_mode": 7}, "compute_mode"), ({"name": None}, "name"),
])
def test_device_refuses_loose_types_naming_the_field(fields: dict, field: str) -> None:
    from gpuslice.spec import Device

    with pytest.raises(SpecError) as err:
        Device(**{"uuid": "GPU-0", "index": 0, "name": "H100", "memory_total": GiB, "sm_count": 132, **fields})
    assert err.value.field == field


@pytest.mark.parametrize("value, low, high, allowed", [
    (True, 0, None, "a whole number at least 0"),          # JSON true is not 1
    (1.0, 0, None, "a whole number at least 0"),
    ("3", None, None, "a whole number"),
    (-1, 0, 100, "a whole number at least 0 and at most 100"),
    (101, 0, 100, "a whole number at least 0 and at most 100"),
    (None, 1, None, "a whole number at least 1"),
])
def test_whole_number_refuses_non_integers_and_out_of_range_naming_the_bounds(value, low, high, allowed):
    with pytest.raises(SpecError) as err:
        whole_number("field.x", value, low, high)
    assert err.value.field == "field.x" and err.value.value == value and err.value.allowed == allowed


def test_whole_number_passes_ints_in_range_and_raises_the_callers_error_type_and_words():
    assert whole_number("n", 0, 0, 0) == 0 and whole_number("n", 2**70) == 2**70

    class KeyError_(ValueError):
        def __init__(self, key, value, allowed):
            super().__init__(key, value, allowed)

    with pytest.raises(KeyError_) as err:
        whole_number("weight", 17, 1, 16, allowed="1 to 16", error=KeyError_)
    assert err.value.args == ("weight", 17, "1 to 16")


@given(st.integers(min_value=0, max_value=100), st.integers(min_value=1, max_value=8), st.booleans())
def test_compute_only_requests_get_their_share_of_the_memory(compute: int, count: int, exclusive: bool) -> None:
    """Issue 12's rule, for every compute share: a share below 100 without memory means sharing the device,
    so the request gets that percent of each device's memory; anything else is left as it is."""
    r = Request(count=count, compute=compute, exclusive=exclusive)
    d = r.with_default_memory()
    if 0 < compute < 100 and not exclusive:
        assert r.compute_only and d.memory == MemoryAmount(percent=float(compute))
        assert d.with_default_memory() == d and d.compute == compute and d.count == count  # idempotent
    else:
        assert not r.compute_only and d is r  # no share, 100 % or exclusive: whole devices, as before
    sized = Request(count=count, compute=compute, memory=MemoryAmount(bytes=2**30), exclusive=exclusive)
    assert sized.with_default_memory() is sized  # a size given is kept
