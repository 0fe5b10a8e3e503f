"""hack/progress.py: a Go build says what it builds and for how long, instead of minutes of silence. A fake
`go` prints what `go build -v` prints (module downloads, one package per line, errors) at a slow pace."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "progress.py"


def _fake_go(tmp_path: Path, lines: list[str], code: int = 0, pause: float = 0.15) -> Path:
    fake = tmp_path / "fake-go"
    fake.write_text(textwrap.dedent(f"""\
        import sys, time
        for line in {lines!r}:
            print(line, file=sys.stderr if line.startswith("go:") else sys.stdout, flush=True)
            time.sleep({pause})
        sys.exit({code})
        """))
    return fake


def _argv(fake: Path, every: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--what", "the control plane", "--cold", "7–15 minutes", "--every", every,
            "--", sys.executable, str(fake)]


def _run(fake: Path, every: str = "0.3") -> subprocess.CompletedProcess:
    return subprocess.run(_argv(fake, every), capture_output=True, text=True, timeout=60)


PACKAGES = ["internal/goarch", "runtime", "k8s.io/apimachinery/pkg/util/sets", "go.etcd.io/etcd/server/v3/embed",
            "k8s.io/kubernetes/cmd/kube-apiserver/app", "example.com/controlplane"]


def test_a_log_gets_status_lines_with_elapsed_time_counts_and_the_package_now(tmp_path: Path) -> None:
    fake = _fake_go(tmp_path, ["go: downloading k8s.io/kubernetes v1.37.2", "go: downloading go.etcd.io/etcd v3.7.0",
                               *PACKAGES])
    result = _run(fake)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == ("hack: building the control plane (7–15 minutes with empty Go caches on two CPUs, seconds "
                        "once they are filled)")
    status = [x for x in lines if x.startswith("hack: building the control plane: ")]
    assert len(status) >= 2, lines  # ~1.2 s of build, a line every 0.3 s
    assert all("s elapsed" in x and "packages compiled" in x for x in status)
    assert any("(now: " in x for x in status)
    assert re.fullmatch(r"hack: built the control plane in \ds \(6 packages compiled, 2 modules downloaded\)",
                        lines[-1]), lines[-1]
    assert not any(x in PACKAGES for x in lines)  # the package list itself is not dumped into the log


def test_a_failed_build_keeps_its_exit_status_and_shows_the_compiler_error(tmp_path: Path) -> None:
    fake = _fake_go(tmp_path, [*PACKAGES[:3], "main.go:12:2: undefined: server.Run"], code=2, pause=0.02)
    result = _run(fake, every="30")
    assert result.returncode == 2
    assert "main.go:12:2: undefined: server.Run" in result.stderr
    assert "hack: building the control plane failed after" in result.stderr and "(exit 2)" in result.stderr


def test_a_build_that_fails_silently_shows_its_last_lines(tmp_path: Path) -> None:
    fake = _fake_go(tmp_path, PACKAGES[:4], code=1, pause=0.02)
    result = _run(fake, every="30")
    assert result.returncode == 1
    assert "failed after" in result.stderr and "  go.etcd.io/etcd/server/v3/embed" in result.stderr


def test_a_command_that_does_not_exist_is_one_line() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--what", "x", "--", "/nonexistent/go"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 127 and "hack: cannot run /nonexistent/go" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_terminal_gets_one_status_line_rewritten_in_place(tmp_path: Path) -> None:
    """On a terminal the status is redrawn with a carriage return about once a second, not appended."""
    fake = _fake_go(tmp_path, PACKAGES * 2, pause=0.25)  # about 3 s
    master, slave = pty.openpty()
    proc = subprocess.Popen(_argv(fake, "30"), stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the other end closed: the build is over
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode()
    redraws = text.count("\rhack: building the control plane: ")
    assert redraws >= 2 and "\nhack: building the control plane: " not in text, text  # in place, not new lines
    assert "hack: built the control plane in " in text and "12 packages compiled" in text
