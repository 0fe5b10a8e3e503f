"""The one entry point: ``gpuslice <verb>``.

Each part owns a ``commands`` module with ``register(app)`` that adds its verbs; this file only wires
them, adds the verbs about the CLI itself (``version``, ``help``, ``completion``) and keeps the one
exit-code contract (README, "Exit codes"):

* 0 — done;
* 1 — gpuslice could not do it (a :class:`GpusliceError` / :class:`SpecError` escaping a verb, or an
  ``OSError`` such as an unwritable folder): one line ``error: …``;
* 2 — the command line is wrong (click's usage errors; verbs turn a bad option value into one);
* 130 — interrupted (Ctrl-C).

``run`` exits with its command's own code once the command started.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text

from gpuslice import __version__
from gpuslice.cli.helptext import polish
from gpuslice.host.devices import NvmlError, bundled_snapshots
from gpuslice.host.errors import NoGpuError
from gpuslice.spec.errors import GpusliceError
from gpuslice.spec import SpecError

app = typer.Typer(
    name="gpuslice",
    help="Share NVIDIA GPUs safely: slices with hard memory limits, compute shares and priorities.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err_console = Console(stderr=True)

# The parts that contribute verbs. A missing module is a packaging bug, so import errors propagate.
PART_COMMANDS = (
    "gpuslice.host.commands",
    "gpuslice.cli.demo",
    "gpuslice.local.commands",
    "gpuslice.sim.commands",
    "gpuslice.kube.commands",
    "gpuslice.cli.completion",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpuslice {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    version: Optional[bool] = typer.Option(None, "--version", "-V", callback=_print_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """Share NVIDIA GPUs safely: slices with hard memory limits, compute shares and priorities.

    Exit codes of every verb: 0 done, 1 gpuslice could not do it, 2 the command line is wrong, 130
    interrupted (`run`: its command's own code once the command started)."""


@app.command()
def version() -> None:
    """Print the gpuslice version."""
    typer.echo(f"gpuslice {__version__}")


@app.command("help")
def help_verb(ctx: typer.Context,
              verb: Optional[str] = typer.Argument(None, metavar="VERB", help="The verb to explain.")) -> None:
    """Show the help of gpuslice or of one verb (the same as `gpuslice VERB -h`)."""
    group = ctx.parent.command if ctx.parent else ctx.command
    if verb is None:
        typer.echo(group.get_help(ctx.parent) if ctx.parent else "")
        return
    command = group.get_command(ctx, verb)  # type: ignore[attr-defined]
    if command is None:
        known = ", ".join(group.list_commands(ctx))  # type: ignore[attr-defined]
        raise typer.BadParameter(f"{verb!r} is not a verb; expected one of {known}", param_hint="'VERB'")
    command.make_context(verb, ["--help"], parent=ctx.parent)  # prints the help and exits 0


def _register_parts() -> None:
    for name in PART_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that part has not landed yet
                continue
            raise
        module.register(app)


_register_parts()


def _kubernetes_alias(args: list[str]) -> list[str]:
    """`gpuslice agent --kubernetes ...` is `gpuslice kube-agent ...`: the node agent in its Kubernetes role
    (device plugin, node registration, metrics with pod labels) takes kube-agent's options, so the alias is
    resolved before click parses `agent`'s own."""
    if args[:1] == ["agent"] and "--kubernetes" in args[1:]:
        rest = list(args[1:])
        rest.remove("--kubernetes")
        return ["kube-agent", *rest]
    return args


NO_GPU_HINT = ("\nno GPU here? a device snapshot lets you explore: `gpuslice devices --snapshot h100-80gb` "
               "(bundled: " + ", ".join(bundled_snapshots()) + "), and GPUSLICE_DEVICE_SNAPSHOT=h100-80gb makes "
               "every verb use one (grants are recorded, nothing is enforced: there is no GPU)")


def _error(text: str) -> None:
    """``error: …`` in red; the text is printed as it is (a ``[`` in a message is not markup)."""
    err_console.print(Text.assemble(("error:", "red"), " ", text), soft_wrap=True, highlight=False)


def command() -> typer.core.TyperGroup:
    """The click command tree of ``gpuslice`` with its help polished (metavars, paragraphs)."""
    return polish(typer.main.get_command(app))  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (the contract in this module's docstring).

    Click (inside typer) handles usage errors itself in standalone mode: message + exit code 2. Shell
    completion requests (``_GPUSLICE_COMPLETE`` in the environment) are answered here too.
    """
    args = _kubernetes_alias(sys.argv[1:] if argv is None else list(argv))
    try:
        command().main(args=args, prog_name="gpuslice")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (GpusliceError, SpecError) as exc:
        # no driver or no GPU at all: point at the snapshots (not when NVML runs and fails: that needs fixing)
        no_gpu = isinstance(exc, NoGpuError) and not isinstance(exc, NvmlError)
        _error(str(exc) + (NO_GPU_HINT if no_gpu else ""))
        return 1
    except OSError as exc:  # an unwritable folder, a full disk: what and where, not a traceback
        _error(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return 1
    return 0
