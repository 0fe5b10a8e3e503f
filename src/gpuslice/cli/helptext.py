"""Help that reads like a manual: metavars instead of Python types, paragraphs without hard line breaks.

typer (0.29) labels every value with its Python annotation (``<int>``, ``<list[str]>``, ``<bool>`` even
for flags), writes a required variadic argument as ``{-- CMD...}...`` and keeps the line breaks of a
docstring's later paragraphs. :func:`polish` fixes the built click tree once per run, so every verb,
including verbs other parts add later, gets the same treatment; options that declare ``metavar=`` (``SIZE``,
``PCT``, ``CSV``…) keep theirs, and a metavar that lists values (``hard|soft|off``) is what shell completion
offers for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

import typer
from typer._click.shell_completion import CompletionItem  # typer 0.29 vendors click; pinned

# What a value is called when its option declares no metavar, by its Python type.
_BY_TYPE = {int: "N", float: "NUM", str: "TEXT", Path: "PATH", bool: ""}


def tidy(text: str | None) -> str | None:
    """Join the hard-wrapped lines of each paragraph (paragraphs are separated by a blank line; one that
    starts with ``\\b`` is kept as written, click's convention for preformatted blocks)."""
    if not text:
        return text
    paragraphs = re.split(r"\n\s*\n", _dedent(text))
    joined = [p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines()) for p in paragraphs]
    return "\n\n".join(joined)


def _dedent(text: str) -> str:
    import inspect

    return inspect.cleandoc(text)


def _type_metavar(param: Any) -> str:
    annotation = param.type_descriptor.annotation
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation)
    choices = getattr(param.type_descriptor, "choices", None)
    if choices:
        return "|".join(str(getattr(c, "value", c)) for c in choices)
    return _BY_TYPE.get(annotation, "VALUE")


def _argument_usage(param: Any) -> list[str]:
    """How an argument reads in the usage line: ``CMD...`` when required, ``[VERB]`` when optional."""
    name = param.metavar or param.name.upper()
    if param.nargs != 1 and not name.endswith("..."):
        name += "..."
    return [name if param.required else f"[{name}]"]


def _flag(option: Any) -> Any:
    """The help option (made on demand by click, so not in ``params`` yet) is a flag too."""
    if option is not None:
        option.metavar = ""
    return option


def _choices(param: Any) -> list[str]:
    """The values a metavar like ``hard|soft|off`` or ``[bash|zsh|fish]`` lists (empty for ``SIZE``)."""
    match = re.fullmatch(r"\[?([a-z-]+(?:\|[a-z-]+)+)\]?", param.metavar or "")
    return match.group(1).split("|") if match else []


def _complete_choices(param: Any) -> None:
    """Shell completion offers the values such a metavar lists (``--mode <TAB>`` → hard soft off)."""
    choices = _choices(param)
    if choices:
        param.shell_complete = lambda ctx, incomplete: [CompletionItem(c) for c in choices if c.startswith(incomplete)]


def polish(command: Any) -> Any:
    """Polish ``command`` and every command below it in place; returns it."""
    command.help = tidy(command.help)
    for param in command.params:
        _complete_choices(param)
        if isinstance(param, typer.core.TyperArgument):
            # instance attributes: typer's own versions print the Python type and braces
            param.get_usage_pieces = lambda ctx, p=param: _argument_usage(p)
            param.display_type_rich = lambda ctx: None
        elif isinstance(param, typer.core.TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else _type_metavar(param)
        if getattr(param, "help", None):
            param.help = tidy(param.help)
    command.get_help_option = lambda ctx, make=command.get_help_option: _flag(make(ctx))
    for sub in getattr(command, "commands", {}).values():
        polish(sub)
    return command
