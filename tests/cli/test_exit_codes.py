"""The one exit-code contract, verb by verb: 0 done, 1 gpuslice could not do it, 2 the command line is
wrong (README, "Exit codes"). Every verb has a usage case and a runtime case here, and a success case
where one is quick and needs no GPU or cluster; a test at the end makes sure no verb is left out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clitext import plain

from gpuslice.cli import command, main

UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: x}}]
"""

# verb -> [(argv, exit code, what the output must say)]; "{tmp}" is a fresh folder, "{file}" a plain file
# in it, "{bad_json}" a snapshot that is not JSON, "{kubeconfig}" a kubeconfig whose API server is not there.
CASES: dict[str, list[tuple[list[str], int, str]]] = {
    "version": [(["version"], 0, "gpuslice 0.1.0"), (["--version"], 0, "gpuslice 0.1.0"),
                (["version", "--bogus"], 2, "No such option")],
    "help": [(["help", "run"], 0, "Usage: gpuslice run [OPTIONS] -- CMD..."), (["-h"], 0, "Usage: gpuslice"),
             (["help", "fly"], 2, "'fly' is not a verb"), ([], 2, "Usage: gpuslice")],
    "devices": [(["devices", "--snapshot", "t4"], 0, "Tesla T4"),
                (["devices", "--snapshot", "no-such-card"], 2, "'no-such-card' not found"),
                (["devices", "--snapshot", "{bad_json}"], 1, "not valid JSON")],
    "demo": [(["demo", "--simulate", "--out", "{file}"], 1, "cannot write the report"),
             (["demo", "--fast"], 2, "No such option")],
    "run": [(["run", "--memory", "1GiB", "--", "true"], 0, "grant g-"),
            (["run", "--", "sh", "-c", "exit 3"], 3, "grant g-"),  # the command's own code
            (["run", "--policy", "tetris", "--", "true"], 2, "'--policy'"),
            (["run", "--memory", "4", "GiB", "--", "true"], 2, "--memory 4GiB"),
            (["run"], 2, "Missing argument"),
            (["run", "--device", "9", "--", "true"], 1, "device"),  # this node has no GPU 9
            (["run", "--device", "abc", "--", "true"], 2, "a comma list of device indexes"),  # none has one
            (["run", "--device", "0,", "--", "true"], 2, "'--device'")],
    "ps": [(["ps"], 0, "slices"), (["ps", "--jsn"], 2, "No such option"),
           (["ps"], 1, "state")],  # with the state dir on a file (see _env)
    "resize": [(["resize", "g-00000000", "--memory", "1GiB"], 1, "not in the ledger"),
               (["resize", "g-00000000"], 2, "at least one of --memory"),
               (["resize", "g-00000000", "--compute", "130"], 2, "'--compute'")],  # success: tests/local/test_resize.py
    "top": [(["top", "--count", "1", "--json"], 0, '"devices"'), (["top", "--interval", "0"], 2, "'--interval'"),
            (["top", "--count", "1"], 1, "state")],
    "agent": [(["agent", "--port", "70000"], 2, "'--port'"), (["agent", "--history", "0"], 2, "'--history'"),
              (["agent", "--port", "-1"], 1, "state")],
    "simulate": [(["simulate", "--trace", "{tmp}/nope.csv", "--nodes", "{tmp}/n.csv"], 2, "not found"),
                 (["simulate", "--mode", "fast", "--trace", "{pods}", "--nodes", "{nodes}"], 2, "'--mode'"),
                 (["simulate", "--trace", "{pods}", "--nodes", "{nodes}", "--out", "{file}"], 1,
                  "cannot write the report")],
    "scheduler": [(["scheduler", "--port", "70000"], 2, "'--port'"),
                  (["scheduler", "--port", "0", "--webhook-port", "0"], 2, "nothing to serve"),
                  (["scheduler", "--webhook-port", "8443"], 2, "--tls-cert"),
                  (["scheduler", "--kubeconfig", "{tmp}/nope", "--webhook-port", "0"], 2, "not found"),
                  (["scheduler", "--policy", "tetris", "--webhook-port", "0"], 2, "'--policy'"),
                  (["scheduler", "--webhook-port", "0", "--kubeconfig", "{bad_json}"], 1, "credentials")],
    "kube-agent": [(["kube-agent"], 2, "--node"),
                   (["kube-agent", "--node", "n", "--split-count", "0"], 2, "'--split-count'"),
                   (["kube-agent", "--node", "n", "--oom-policy", "explode"], 2, "'--oom-policy'"),
                   (["kube-agent", "--node", "n", "--snapshot", "nope"], 2, "'nope' not found"),
                   (["kube-agent", "--node", "n", "--snapshot", "t4", "--kubeconfig", "{kubeconfig}",
                     "--register-only"], 1, "127.0.0.1")],
    "kube-certs": [(["kube-certs", "--dir", "{tmp}/certs"], 0, "ca.crt"), (["kube-certs"], 2, "--dir"),
                   (["kube-certs", "--dir", "{file}/certs"], 1, "error:")],
    "completion": [(["completion", "bash"], 0, "complete -o default"), (["completion", "tcsh"], 2, "tcsh")],
}


def _env(tmp: Path, argv: list[str], code: int) -> dict[str, str]:
    env = {**os.environ, "GPUSLICE_DEVICE_SNAPSHOT": "h100-80gb", "GPUSLICE_STATE_DIR": str(tmp / "state"),
           "COLUMNS": "120"}
    if code == 1 and argv[0] in ("ps", "top", "agent"):
        env["GPUSLICE_STATE_DIR"] = str(tmp / "file")  # a state dir that is a file: the node cannot serve
    return env


@pytest.fixture
def paths(tmp_path: Path, small_csvs) -> dict[str, str]:
    (tmp_path / "file").write_text("a file, not a folder\n")
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "kubeconfig").write_text(UNREACHABLE_KUBECONFIG)
    pods, nodes = small_csvs
    return {"tmp": str(tmp_path), "file": str(tmp_path / "file"), "bad_json": str(tmp_path / "bad.json"),
            "kubeconfig": str(tmp_path / "kubeconfig"), "pods": str(pods), "nodes": str(nodes)}


@pytest.fixture
def small_csvs(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\np0,1000,1024,1,500,,LS,Running,0,100,0\n")
    return pods, nodes


@pytest.mark.parametrize("verb, argv, code, says", [(v, a, c, s) for v, cases in CASES.items() for a, c, s in cases],
                         ids=lambda x: x if isinstance(x, str) else None)
def test_exit_code(verb: str, argv: list[str], code: int, says: str, paths: dict[str, str], tmp_path: Path) -> None:
    """The process's exit code, and one line naming what (no traceback), for this verb and case."""
    args = [a.format(**paths) for a in argv]
    result = subprocess.run([sys.executable, "-m", "gpuslice.cli", *args], capture_output=True, text=True,
                            env=_env(tmp_path, args or ["help"], code), timeout=120)
    output = plain(result.stdout + result.stderr)
    assert result.returncode == code, (args, result.returncode, output[-2000:])
    assert says in output, (args, output[-2000:])
    assert "Traceback" not in output


def test_every_verb_has_its_exit_codes_pinned() -> None:
    """A verb added later must add its cases above: each verb has a usage case (2) and a runtime case (1),
    except version, help and completion, which do nothing that can fail at run time."""
    verbs = set(command().commands)
    assert verbs == set(CASES), verbs ^ set(CASES)
    for verb, cases in CASES.items():
        codes = {c for _, c, _ in cases}
        assert 2 in codes, verb
        assert 1 in codes or verb in ("version", "help", "completion"), verb


def test_main_returns_the_code_it_exits_with(capsys: pytest.CaptureFixture) -> None:
    assert main(["version"]) == 0
    assert main(["devices", "--snapshot", "no-such-card"]) == 2
    assert "'--snapshot'" in plain(capsys.readouterr().err)
