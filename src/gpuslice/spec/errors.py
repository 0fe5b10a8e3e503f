"""Typed errors shared by every part. Each carries enough context to print one clear line."""

from __future__ import annotations


class GpusliceError(Exception):
    """Base of every runtime error gpuslice raises on purpose; the CLI prints it and exits 1."""


MAX_SHOWN = 120  # characters of a refused value an error message repeats (a value may be megabytes long)


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`MAX_SHOWN` characters with the full length said."""
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:MAX_SHOWN]}… ({len(text)} characters)"


class SpecError(ValueError):
    """A request, slice or grant field that is not allowed. Carries the field, the value and the rule."""

    def __init__(self, field_name: str, value: object, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name}: {shown(value)} is not allowed; expected {allowed}")

