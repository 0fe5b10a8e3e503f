"""spec/resize.py: a live resize's fields, parsed as a request's are (issue 15: the socket API's bare number)."""

from __future__ import annotations

import pytest

from gpuslice.spec import MiB, Resize, SpecError
from gpuslice.spec.units import MAX_MEMORY_BYTES


@pytest.mark.parametrize("memory", [5, "5"])
def test_a_bare_number_of_memory_is_mib_json_number_or_text(memory) -> None:
    """What the README says of every memory field: ``{"memory": 5}`` from JSON is 5 MiB, not 5 bytes."""
    change = Resize.from_mapping({"memory": memory})
    assert change.memory is not None and change.memory.resolve(80 << 30) == 5 * MiB
    assert change.to_json() == {"memory": "5MiB"}


@pytest.mark.parametrize("memory", [10**30, str(10**30), MAX_MEMORY_BYTES // MiB + 1])
def test_a_huge_memory_is_refused_naming_the_field(memory) -> None:
    with pytest.raises(SpecError) as caught:
        Resize.from_mapping({"memory": memory})
    assert caught.value.field == "memory" and str(caught.value).startswith("memory: ")


def test_the_largest_memory_allowed_passes() -> None:
    assert Resize.from_mapping({"memory": MAX_MEMORY_BYTES // MiB}).memory.resolve(0) == MAX_MEMORY_BYTES
