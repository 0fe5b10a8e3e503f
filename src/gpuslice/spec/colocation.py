"""Co-location modes: how a slice shares its device with slices of the other priority (issue 13).

``preemptive`` (the default, what ``priority`` always meant): a low-priority slice holds back while a
preemptive high-priority slice on the device has GPU work queued, and otherwise runs at full speed with a
bounded queue of its own in front of it (README-compute.md, "Co-location"). ``shared``: nobody yields;
priorities only order the shares' guarantees (weighted shares). ``tidal`` (low priority, mode hard): the
slice's share follows ``tidal_schedule`` — whole UTC hours — or, without one, the measured idle time of
the device's high-priority slices.

A schedule is ``<from>-<to>:<percent>[,...]``: ``to`` exclusive (24 = midnight), a span may wrap past
midnight (``22-6:100``), spans may not overlap, percent 1..100; hours no span covers use the slice's
compute share (0: the whole device). The enforcer's parser (``native/src/config/colocation.c``) follows
the same rules; :func:`parse_tidal_schedule` returns the canonical text both write.
"""

from __future__ import annotations

import enum
import re

from gpuslice.spec.errors import SpecError

MAX_SPANS = 24
_SPAN = re.compile(r"([0-9]{1,3})-([0-9]{1,3}):([0-9]{1,3})")  # ASCII, as the enforcer's C parser


class Colocation(str, enum.Enum):
    PREEMPTIVE = "preemptive"
    SHARED = "shared"
    TIDAL = "tidal"

    @classmethod
    def parse(cls, value: object, field_name: str = "colocation") -> "Colocation":
        if isinstance(value, Colocation):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise SpecError(field_name, value, "preemptive, shared or tidal") from None


def parse_tidal_schedule(value: object, field_name: str = "tidal_schedule") -> str:
    """The canonical text (``0-8:100,20-24:60``, spans in the order given) of a schedule; "" for none."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise SpecError(field_name, value, "spans <from>-<to>:<percent> separated by commas (e.g. 8-20:30,20-8:100)")
    covered: set[int] = set()
    spans = []
    parts = [p.strip(" \t") for p in value.split(",")]
    if parts and parts[-1] == "":  # a trailing comma, as the C parser allows
        parts.pop()
    for part in parts:
        m = _SPAN.fullmatch(part)
        if not m:
            raise SpecError(field_name, value, f"spans <from>-<to>:<percent> (e.g. 8-20:30); {part!r} is not one")
        start, end, pct = (int(x) for x in m.groups())
        if start > 23 or not 1 <= end <= 24 or start == end:
            raise SpecError(field_name, value, "whole UTC hours, from 0..23 to 1..24 (exclusive), not equal")
        if not 1 <= pct <= 100:
            raise SpecError(field_name, value, "a percent from 1 to 100 in each span")
        hours = {(start + k) % 24 for k in range((end - start) % 24 or 24)}
        if hours & covered:
            raise SpecError(field_name, value, "spans that do not overlap")
        covered |= hours
        spans.append(f"{start}-{end}:{pct}")
    if not spans:
        raise SpecError(field_name, value, "at least one span <from>-<to>:<percent>")
    if len(spans) > MAX_SPANS:
        raise SpecError(field_name, value, f"at most {MAX_SPANS} spans")
    return ",".join(spans)


def check_colocation(colocation: "Colocation", tidal_schedule: str, *, priority: int, mode: str,
                     spatial: bool) -> None:
    """The rules between the co-location fields and the rest of a request or slice (the enforcer's too)."""
    if not isinstance(colocation, Colocation):
        raise SpecError("colocation", colocation, "a Colocation")
    if tidal_schedule and colocation is not Colocation.TIDAL:
        raise SpecError("tidal_schedule", tidal_schedule, "none unless colocation is tidal")
    if colocation is Colocation.TIDAL:
        if priority != 1 or mode != "hard":
            raise SpecError("colocation", colocation.value,
                            "preemptive or shared for this slice: tidal is for a low-priority slice with mode hard")
        if spatial:
            raise SpecError("colocation", colocation.value,
                            "preemptive or shared with engine spatial: tidal needs the time-slice engine (paced)")
