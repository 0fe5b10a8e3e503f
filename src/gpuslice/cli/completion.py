"""``gpuslice completion``: shell completion for bash, zsh and fish.

The completion scripts are typer's (they call ``gpuslice`` back with ``_GPUSLICE_COMPLETE`` set, and
:func:`gpuslice.cli.main` answers with the verbs, options and values that fit). ``--install`` writes the
script where the shell looks for it and, for bash and zsh, one line that loads it into the shell's rc
file (once: a second install finds the line and adds nothing):

* bash: ``~/.bash_completions/gpuslice.sh``, ``source``d from ``~/.bashrc``;
* zsh: ``~/.zfunc/_gpuslice``, with ``fpath+=~/.zfunc; autoload -Uz compinit; compinit`` in ``~/.zshrc``;
* fish: ``~/.config/fish/completions/gpuslice.fish`` (fish loads that folder by itself).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from typer import completion as typer_completion

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_GPUSLICE_COMPLETE"


def _shell_of_user() -> str | None:
    """The login shell's name from ``$SHELL`` when it is one of :data:`SHELLS`."""
    name = Path(os.environ.get("SHELL", "")).name
    return name if name in SHELLS else None


def completion(
    shell: Optional[str] = typer.Argument(None, metavar="[bash|zsh|fish]",
                                          help="The shell (default: the one in $SHELL)."),
    install: bool = typer.Option(False, "--install", help="Write the script where the shell loads it "
                                 "(and the line that loads it into ~/.bashrc or ~/.zshrc) instead of printing it."),
) -> None:
    """Print (or --install) the shell completion script for bash, zsh or fish.

    One command installs it for your shell: `gpuslice completion --install`; it takes effect in a new
    shell. To load it into the current bash only: `source <(gpuslice completion bash)`."""
    chosen = shell or _shell_of_user()
    if chosen not in SHELLS:
        given = shell if shell else f"$SHELL={os.environ.get('SHELL', '')!r}"
        raise typer.BadParameter(f"{given} is not a shell gpuslice completes; expected bash, zsh or fish",
                                 param_hint="'SHELL'")
    script = typer_completion.get_completion_script(prog_name="gpuslice", complete_var=COMPLETE_VAR,
                                                    shell=chosen)
    if not install:
        typer.echo(script)
        return
    path, rc = install_script(chosen, script, Path.home())
    loaded = f", loaded from {rc}" if rc else ""
    typer.echo(f"gpuslice: {chosen} completion written to {path}{loaded}; it takes effect in a new shell")


def install_script(shell: str, script: str, home: Path) -> tuple[Path, Path | None]:
    """Write ``script`` where ``shell`` finds it under ``home``; add the loading line to the rc file when
    it is not there yet. Returns the script's path and the rc file (None for fish)."""
    path, rc, line = {
        "bash": (home / ".bash_completions" / "gpuslice.sh", home / ".bashrc",
                 f"source '{home / '.bash_completions' / 'gpuslice.sh'}'"),
        "zsh": (home / ".zfunc" / "_gpuslice", home / ".zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit"),
        "fish": (home / ".config" / "fish" / "completions" / "gpuslice.fish", None, ""),
    }[shell]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script + "\n")
    if rc is not None:
        text = rc.read_text() if rc.is_file() else ""
        if line not in text.splitlines():
            rc.write_text(text + ("" if text.endswith("\n") or not text else "\n") +
                          f"# gpuslice shell completion (gpuslice completion --install)\n{line}\n")
    return path, rc


def register(app: typer.Typer) -> None:
    typer_completion.completion_init()  # the completion classes answer _GPUSLICE_COMPLETE requests
    app.command("completion")(completion)
