"""The command line's edge, shared by every part's verbs: what the user typed wrong is a usage error.

The exit-code contract (``gpuslice.cli``): 2 when the command line is wrong — an unknown option, a
value the option does not take, a file named on the line that does not exist — and 1 when the line is
fine but gpuslice could not do it. Verbs validate their options inside :func:`option_values`, so the
:class:`SpecError` the shared validators raise comes out as click's usage error naming the option.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import typer
from typer._click.exceptions import UsageError  # typer 0.29 vendors click; pinned in pyproject.toml

from gpuslice.host.errors import SnapshotNotFound
from gpuslice.spec import SpecError


def flag_of(field: str, flags: Mapping[str, str] | None = None) -> str:
    """The option a field came from: ``flags[field]``, a field that is already a flag, else ``--field-name``
    (a sub-field such as ``policy.node`` comes from ``--policy``)."""
    name = (flags or {}).get(field, field)
    return name if name.startswith("-") else "--" + name.split(".")[0].replace("_", "-")


def usage_error(exc: SpecError, flags: Mapping[str, str] | None = None) -> typer.BadParameter:
    """``exc`` as click's usage error (exit 2), naming the option."""
    return typer.BadParameter(f"{exc.value!r} is not allowed; expected {exc.allowed}",
                              param_hint=f"'{flag_of(exc.field, flags)}'")


@contextmanager
def option_values(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Validate options inside: a :class:`SpecError` becomes a usage error naming the option (``flags``
    maps field names to options where they differ, e.g. ``{"count": "--gpus"}``)."""
    try:
        yield
    except SpecError as exc:
        raise usage_error(exc, flags) from None


def usage(message: str) -> UsageError:
    """A usage error (exit 2) about how options combine, not about one value."""
    return UsageError(message)


@contextmanager
def named_file(option: str, given: bool = True) -> Iterator[None]:
    """Inside: a snapshot ``option`` named that does not exist is a usage error (when ``given`` on the
    command line; one named by the environment stays a runtime error)."""
    try:
        yield
    except SnapshotNotFound as exc:
        if not given:
            raise
        raise typer.BadParameter(str(exc), param_hint=f"'{option}'") from None


def existing_file(path: Path | str, option: str, what: str = "file") -> Path:
    """``path`` if it names a readable file; else a usage error that says it was not found (or what it is)."""
    path = Path(path)
    if not path.exists():
        raise typer.BadParameter(f"{str(path)!r} not found (no such {what})", param_hint=f"'{option}'")
    if not path.is_file():
        raise typer.BadParameter(f"{str(path)!r} is a folder, not a {what}", param_hint=f"'{option}'")
    return path


__all__ = ["existing_file", "flag_of", "named_file", "option_values", "usage", "usage_error"]
