"""The scorer registry: every policy name has exactly one scorer, and an unknown name is refused."""

from __future__ import annotations

import pytest

from gpuslice.placement import POLICIES
from gpuslice.placement.scorers import SCORERS, scorer
from gpuslice.spec import SpecError


def test_every_policy_has_its_scorer():
    """PlacementPolicy accepts exactly the names the registry can score."""
    assert sorted(SCORERS) == sorted(POLICIES)
    assert all(scorer(name).name == name for name in POLICIES)


def test_unknown_policy_is_refused_with_the_allowed_names():
    with pytest.raises(SpecError, match="binpack"):
        scorer("tetris")
