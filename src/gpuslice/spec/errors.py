"""Typed errors shared by every part. Each carries enough context to print one clear line."""

from __future__ import annotations


class GpusliceError(Exception):
    """Base of every runtime error gpuslice raises on purpose; the CLI prints it and exits 1."""


class SpecError(ValueError):
    """A request, slice or grant field that is not allowed. Carries the field, the value and the rule."""

    def __init__(self, field_name: str, value: object, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name}: {value!r} is not allowed; expected {allowed}")

