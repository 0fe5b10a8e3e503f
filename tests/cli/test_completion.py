"""Shell completion for bash, zsh and fish: the scripts `gpuslice completion` prints, run by the real shells,
complete verbs, options and the values an option lists; `--install` puts them where each shell loads
them, once. bash is always here; zsh and fish are used when installed (apt-get install zsh fish), and
otherwise the answers they would get are checked through the same protocol without the shell."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.cli.completion import install_script

BIN = str(Path(sys.executable).parent)  # the venv's bin, where the gpuslice entry point lives


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "PATH": BIN + os.pathsep + os.environ["PATH"], "SHELL": "/bin/bash"}


def _gpuslice(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run([str(Path(BIN) / "gpuslice"), *args], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _bash_complete(words: list[str], env: dict[str, str], setup: str) -> list[str]:
    """COMPREPLY after bash runs the completion function on ``words`` (the cursor on the last word), as
    bash itself calls it: with the command's name as $1."""
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f"{setup}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _gpuslice_completion gpuslice; "
              'printf "%s\\n" "${COMPREPLY[@]}"')
    result = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return [x for x in result.stdout.splitlines() if x]


@pytest.mark.parametrize("words, expected", [
    (["gpuslice", "sim"], ["simulate"]),
    (["gpuslice", "run", "--mem"], ["--memory"]),
    (["gpuslice", "run", "--mode", ""], ["hard", "soft", "off"]),
    (["gpuslice", "completion", ""], ["bash", "zsh", "fish"]),
])
def test_bash_completes_verbs_options_and_listed_values(tmp_path: Path, words: list[str], expected: list[str]):
    env = _env(tmp_path)
    assert _bash_complete(words, env, 'source <(gpuslice completion bash)') == expected


def test_install_writes_once_and_a_new_bash_loads_it(tmp_path: Path):
    env = _env(tmp_path)
    (tmp_path / ".bashrc").write_text("alias ll='ls -l'\n")
    said = _gpuslice("completion", "--install", env=env)  # the shell from $SHELL
    assert "bash completion written to" in said and ".bash_completions/gpuslice.sh" in said
    _gpuslice("completion", "--install", "bash", env=env)  # again: nothing added twice
    rc = (tmp_path / ".bashrc").read_text()
    assert rc.startswith("alias ll='ls -l'\n") and rc.count("gpuslice.sh") == 1
    assert _bash_complete(["gpuslice", "dev"], env, "source ~/.bashrc") == ["devices"]


def test_install_zsh_and_fish_where_they_look(tmp_path: Path):
    script = "echo completion"
    path, rc = install_script("zsh", script, tmp_path)
    assert path == tmp_path / ".zfunc" / "_gpuslice" and path.read_text() == script + "\n"
    assert rc is not None and "fpath+=~/.zfunc" in rc.read_text()
    install_script("zsh", script, tmp_path)
    assert rc.read_text().count("fpath+=~/.zfunc") == 1
    path, rc = install_script("fish", script, tmp_path)
    assert path == tmp_path / ".config" / "fish" / "completions" / "gpuslice.fish" and rc is None


def test_zsh_completion(tmp_path: Path):
    env = _env(tmp_path)
    script = tmp_path / "c.zsh"
    script.write_text(_gpuslice("completion", "zsh", env=env))
    if shutil.which("zsh") is None:  # the protocol the script speaks, without zsh
        answer = subprocess.run([str(Path(BIN) / "gpuslice")], capture_output=True, text=True, timeout=60, env={
            **env, "_GPUSLICE_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "gpuslice sim"}).stdout
        assert '"simulate"' in answer
        return
    # zsh's completion widgets need a terminal; _arguments (which the script calls with the candidates) is
    # stood in for by a function that prints them, so the script's own code runs in the real zsh.
    run = ("autoload -Uz compinit; compinit -u -d $HOME/.zcompdump; source " + str(script) +
           "; _arguments() { print -r -- \"$@\"; }; words=(gpuslice sim); CURRENT=2; _gpuslice_completion")
    result = subprocess.run(["zsh", "-f", "-c", run], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"simulate":' in result.stdout


def test_fish_completion(tmp_path: Path):
    env = _env(tmp_path)
    script = tmp_path / "c.fish"
    script.write_text(_gpuslice("completion", "fish", env=env))
    if shutil.which("fish") is None:
        answer = subprocess.run([str(Path(BIN) / "gpuslice")], capture_output=True, text=True, timeout=60, env={
            **env, "_GPUSLICE_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "get-args",
            "_TYPER_COMPLETE_ARGS": "gpuslice run --mode "}).stdout
        assert answer.split() == ["hard", "soft", "off"]
        return
    result = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C 'gpuslice run --mode '"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["hard", "off", "soft"]
