"""The one entry point: ``gpuslice <verb>``.

Each part owns a ``commands`` module with ``register(app)`` that adds its verbs; this file only wires
them. Exit codes: 0 ok, 2 usage error (click's own), 1 runtime error (a :class:`GpusliceError`).
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from gpuslice import __version__
from gpuslice.spec.errors import GpusliceError
from gpuslice.spec import SpecError

app = typer.Typer(
    name="gpuslice",
    help="Share NVIDIA GPUs safely: slices with hard memory limits, compute shares and priorities.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)

# The parts that contribute verbs. A missing module is a packaging bug, so import errors propagate.
PART_COMMANDS = (
    "gpuslice.host.commands",
    "gpuslice.cli.demo",
    "gpuslice.local.commands",
    "gpuslice.sim.commands",
    "gpuslice.kube.commands",
)


@app.command()
def version() -> None:
    """Print the gpuslice version."""
    typer.echo(f"gpuslice {__version__}")


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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn our typed errors into one red line and exit code 1.

    Click (inside typer) handles usage errors itself in standalone mode: message + exit code 2.
    """
    try:
        app(args=_kubernetes_alias(sys.argv[1:] if argv is None else list(argv)), prog_name="gpuslice")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (GpusliceError, SpecError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 1
    return 0

