"""The one unit parser: memory sizes and compute shares as humans and manifests write them.

Everything a human or a manifest writes (``4GiB``, ``4096Mi``, ``3000``, ``50%``, ``30``) goes through
:func:`parse_memory` and :func:`parse_compute`; inside the program memory is always bytes (``int``) and
compute is always a whole percent of one device's SM time (``int`` 0..100).

Memory units (one parser: the CLI, requests, the ledger and the slice file all call
:func:`parse_memory` / :func:`parse_bytes`; units are case-insensitive):

=================  ====================================================
written            means
=================  ====================================================
``3000``           3000 MiB — a bare number is MiB, as HAMi's ``gpumem``
                   (the caller may say otherwise: ``bare_unit=1`` makes it
                   bytes, as in the slice file)
``512B``           bytes
``4Ki`` ``4KiB``   binary: ×1024 (also Mi/MiB, Gi/GiB, Ti/TiB)
``4k`` ``4K``      binary as well (docker / HAMi env style: ``3000m``)
``4KB`` ``4GB``    decimal: ×1000, ×10⁹ (as disk vendors write them)
``1.5GiB``         a fraction is exact (1536 MiB); it is rounded to a whole byte
``50%``            a share of one device's memory, resolved at placement
                   (``12.5%`` too: above 0 and at most 100)
=================  ====================================================

``strict=True`` accepts only the slice file's grammar, which the enforcer's C parser
(``native/src/config/config.c``, ``gs_parse_bytes``) reads the same way: whole digits followed directly by
one of the units above, no spaces, no fraction, no percent.

Not parsed here: Kubernetes resource quantities (``gpuslice.kube.resources.parse_quantity``) follow the
Kubernetes quantity grammar, where ``k``/``M``/``G`` are decimal (×1000) and ``m`` means milli. That is
the API server's syntax, not a human unit of gpuslice, so it has its own parser on purpose.

Bad input raises :class:`SpecError`, which names the field, echoes the value and says what is allowed.
"""

from __future__ import annotations

import re
from decimal import Decimal, ROUND_HALF_UP
from dataclasses import dataclass

from gpuslice.spec.errors import SpecError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
# The largest memory a request or a slice may name (1 PiB, thousands of times any GPU's): sizes are summed
# over devices and slices in 64-bit integers (numpy in placement, SQLite), which must never overflow
# (issue 15: ``--memory 9999999999999999GiB`` ended in an OverflowError traceback).
MAX_MEMORY_BYTES = 1 << 50

_MEMORY_UNITS: dict[str, int] = {
    "b": 1,
    "ki": KiB, "kib": KiB, "k": KiB,
    "mi": MiB, "mib": MiB, "m": MiB,
    "gi": GiB, "gib": GiB, "g": GiB,
    "ti": TiB, "tib": TiB, "t": TiB,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}

_COMPUTE_FORM = "a whole percent of one device's SM time from 0 to 100, like 30 or 30%"
_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?)"
_MEMORY_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>[A-Za-z]*|%)$")
_STRICT_MEMORY_RE = re.compile(r"^(?P<num>[0-9]+)(?P<unit>[A-Za-z]{0,3})$")  # the C parser's grammar
_COMPUTE_RE = re.compile(r"^(?P<num>[0-9]+)\s*%?$")


def _memory_form(bare_unit: int, allow_percent: bool, strict: bool) -> str:
    """The allowed forms, as an error message says them."""
    bare = "3000 (MiB)" if bare_unit == MiB else f"3000 (×{bare_unit} bytes)" if bare_unit != 1 else "4294967296 (bytes)"
    if strict:
        return f"a whole number directly followed by a unit, like {bare}, 4g, 4Gi, 4GiB or 4096Mi"
    return f"a size like 4GiB, 4096Mi, 512MB, {bare}" + (" or a share like 50%" if allow_percent else "")



# --------------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class MemoryAmount:
    """Memory as written by a user: an absolute size in bytes, or a percent of one device."""

    bytes: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.percent is None):
            raise SpecError("memory", self, "exactly one of bytes or percent")

    def resolve(self, device_total: int) -> int:
        """Bytes this amount means on a device with ``device_total`` bytes (percent rounds down)."""
        if self.bytes is not None:
            return self.bytes
        assert self.percent is not None
        return int(device_total * self.percent // 100)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        # Exact and parseable: repr() round-trips the float, 'f' avoids an exponent (1e-05 → 0.00001).
        return format(Decimal(repr(float(self.percent))).normalize(), "f") + "%"


def parse_memory(
    value: str | int,
    field_name: str = "memory",
    *,
    bare_unit: int = MiB,
    allow_percent: bool = True,
    allow_zero: bool = False,
    strict: bool = False,
    max_bytes: int | None = None,
) -> MemoryAmount:
    """Parse a human memory amount. ``int`` means bytes; strings follow the table in the module doc.

    ``bare_unit``: what a number without a unit means (MiB by default, as HAMi's ``gpumem``; 1 = bytes).
    ``allow_percent``: accept ``50%``. ``allow_zero``: accept a size of 0. ``strict``: only the slice
    file's grammar (whole digits directly followed by a unit). ``max_bytes``: the largest size allowed
    (requests pass :data:`MAX_MEMORY_BYTES`).
    """
    if bare_unit not in _MEMORY_UNITS.values():
        raise ValueError(f"bare_unit must be one of the unit scales, not {bare_unit!r}")
    smallest = 0 if allow_zero else 1
    form = _memory_form(bare_unit, allow_percent, strict)
    if isinstance(value, bool):
        raise SpecError(field_name, value, form)
    if isinstance(value, int):
        if value < smallest or (max_bytes is not None and value > max_bytes):
            raise SpecError(field_name, value, _size_range(smallest, max_bytes))
        return MemoryAmount(bytes=value)
    if not isinstance(value, str):
        raise SpecError(field_name, value, form)
    match = (_STRICT_MEMORY_RE if strict else _MEMORY_RE).fullmatch(value if strict else value.strip())
    if not match:
        raise SpecError(field_name, value, form)
    num, unit = Decimal(match["num"]), match["unit"]
    if unit == "%":
        if not allow_percent:
            raise SpecError(field_name, value, "an absolute size like 4GiB (a percent is not allowed here)")
        if not 0 < num <= 100:
            raise SpecError(field_name, value, "a share above 0% and at most 100%")
        return MemoryAmount(percent=float(num))
    scale = bare_unit if unit == "" else _MEMORY_UNITS.get(unit.lower())
    if scale is None:
        raise SpecError(field_name, value, form + f"; unit {unit!r} is unknown")
    size = int((num * scale).to_integral_value(ROUND_HALF_UP))
    if size < smallest or (max_bytes is not None and size > max_bytes):
        raise SpecError(field_name, value, _size_range(smallest, max_bytes))
    return MemoryAmount(bytes=size)


def _size_range(smallest: int, max_bytes: int | None) -> str:
    low = "a size above zero" if smallest else "a size of zero or more"
    return low if max_bytes is None else f"{low} and at most {max_bytes} bytes ({format_bytes(max_bytes)})"


def parse_bytes(
    value: str | int,
    field_name: str = "memory",
    *,
    bare_unit: int = MiB,
    allow_zero: bool = False,
    strict: bool = False,
    max_bytes: int | None = None,
) -> int:
    """Parse an absolute size (no percent) into bytes; the options are :func:`parse_memory`'s."""
    amount = parse_memory(value, field_name, bare_unit=bare_unit, allow_percent=False, allow_zero=allow_zero,
                          strict=strict, max_bytes=max_bytes)
    assert amount.bytes is not None
    return amount.bytes


def parse_compute(value: str | int, field_name: str = "compute") -> int:
    """Parse a compute share: ``30`` or ``30%`` → 30. 0 means no reserved share (best effort)."""
    if isinstance(value, bool):
        raise SpecError(field_name, value, _COMPUTE_FORM)
    text = str(value).strip() if isinstance(value, (int, str)) else None
    match = _COMPUTE_RE.match(text) if text is not None else None
    if not match:
        raise SpecError(field_name, value, _COMPUTE_FORM)
    share = int(match["num"])
    if share > 100:
        raise SpecError(field_name, value, _COMPUTE_FORM)
    return share


def format_bytes(size: int) -> str:
    """The shortest exact binary form: 4294967296 → '4GiB', 1536 MiB → '1536MiB', 1000 → '1000B'."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def human_bytes(size: int) -> str:
    """Rounded form for tables: 1.5 GiB, 300 MiB."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(size) >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"

