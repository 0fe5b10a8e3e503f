"""hack/go-toolchain.py: the Go the hack/ Makefile builds with — found, or fetched from the module proxy and
checked against a pinned h1: hash. The proxy here is a file:// directory holding a tiny fake toolchain, so
nothing is downloaded; the real download was measured by hand (hack/README.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "go-toolchain.py"
spec = importlib.util.spec_from_file_location("go_toolchain", SCRIPT)
assert spec and spec.loader
gt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gt)


def _fake_go(version: str) -> str:
    return f"#!/bin/sh\necho 'go version go{version} linux/amd64'\n"


def _proxy(tmp_path: Path, version: str = "1.99.1") -> tuple[Path, dict[str, str]]:
    """A module proxy directory serving golang.org/toolchain@v0.0.1-go<version>.<platform> for this machine."""
    proxy = tmp_path / "proxy"
    hashes = {}
    for plat in ("linux-amd64", "linux-arm64"):
        mv = f"v0.0.1-go{version}.{plat}"
        zpath = proxy / "golang.org" / "toolchain" / "@v" / f"{mv}.zip"
        zpath.parent.mkdir(parents=True, exist_ok=True)
        prefix = f"golang.org/toolchain@{mv}/"
        with zipfile.ZipFile(zpath, "w") as z:
            z.writestr(prefix + "bin/go", _fake_go(version))  # module zips keep no exec bits
            z.writestr(prefix + "pkg/tool/linux_amd64/compile", "")
            z.writestr(prefix + "go.env", "GOTOOLCHAIN=auto\n")
        hashes[plat] = gt.h1_of_zip(zpath)
    return proxy, hashes


def _run(tmp_path: Path, env_path: str, proxy: Path, hashes: dict[str, str], minimum: str = "1.26.0",
         version: str = "1.99.1") -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": env_path, "GOPROXY": f"file://{proxy}", "GO": ""}
    args = [sys.executable, str(SCRIPT), "--min", minimum, "--version", version, "--dir", str(tmp_path / "cache")]
    for plat, h1 in hashes.items():
        args += ["--h1", f"{plat}={h1}"]
    return subprocess.run(args, capture_output=True, text=True, env=env)


def _bin_with_go(tmp_path: Path, version: str) -> str:
    d = tmp_path / f"bin-{version}"
    d.mkdir()
    (d / "go").write_text(_fake_go(version))
    (d / "go").chmod(0o755)
    return str(d)


def _no_go(tmp_path: Path) -> str:
    """A PATH without any go on it (whatever this machine has installed)."""
    d = tmp_path / "empty-bin"
    d.mkdir(exist_ok=True)
    return str(d)


@pytest.mark.parametrize("text, expected", [("go version go1.26.8 linux/amd64", (1, 26, 8, 1)), ("1.26.0", (1, 26, 0, 1)),
                                            ("go1.26rc1", (1, 26, 0, 0)), ("go version devel go1.27-abc", (1, 27, 0, 1)),
                                            ("no go here", None)])
def test_versions_compare_as_go_orders_them(text: str, expected: tuple | None) -> None:
    assert gt.parse_version(text) == expected
    assert gt.parse_version("go1.26rc1") < gt.parse_version("1.26.0") < gt.parse_version("go1.26.8")


def test_h1_is_go_dirhash(tmp_path: Path) -> None:
    """Go's dirhash.Hash1, worked by hand for a two-file zip (sorted names, 'sha256hex  name' lines)."""
    import base64
    import hashlib

    z = tmp_path / "m.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("m@v1/b.txt", "b")
        f.writestr("m@v1/a.txt", "a")
    lines = "".join(f"{hashlib.sha256(c.encode()).hexdigest()}  m@v1/{c}.txt\n" for c in "ab")
    assert gt.h1_of_zip(z) == "h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode()


def test_a_new_enough_go_on_path_is_used_as_is(tmp_path: Path) -> None:
    proxy, hashes = _proxy(tmp_path)
    path = _bin_with_go(tmp_path, "1.26.8")
    r = _run(tmp_path, path, proxy, hashes)
    assert r.returncode == 0 and r.stdout.strip() == path + "/go"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("have", [None, "1.22.5", "1.26rc1"])
def test_missing_or_old_go_fetches_the_pinned_one(tmp_path: Path, have: str | None) -> None:
    proxy, hashes = _proxy(tmp_path)
    path = _no_go(tmp_path) if have is None else _bin_with_go(tmp_path, have)
    r = _run(tmp_path, path, proxy, hashes)
    assert r.returncode == 0, r.stderr
    go = Path(r.stdout.strip())
    assert go == tmp_path / "cache" / f"go1.99.1.{gt.platform_name()}" / "bin" / "go"
    assert os.access(go, os.X_OK) and "checked (h1:" in r.stderr
    again = _run(tmp_path, path, proxy, hashes)  # kept: no second download
    assert again.stdout == r.stdout and "downloading" not in again.stderr


def test_a_zip_that_does_not_match_the_pin_is_refused_loudly(tmp_path: Path) -> None:
    proxy, hashes = _proxy(tmp_path)
    wrong = {plat: "h1:" + "A" * 43 + "=" for plat in hashes}
    r = _run(tmp_path, _no_go(tmp_path), proxy, wrong)
    assert r.returncode == 1 and r.stdout == ""
    assert "refusing to use it" in r.stderr and "Install Go >= 1.26.0" in r.stderr
    assert not list((tmp_path / "cache").glob("go*"))


def test_no_proxy_to_fetch_from_is_exit_1_with_the_reason(tmp_path: Path) -> None:
    proxy, hashes = _proxy(tmp_path)
    r = _run(tmp_path, _no_go(tmp_path), tmp_path / "nowhere", hashes)
    assert r.returncode == 1 and "could not download" in r.stderr and "'go' is not on PATH" in r.stderr


def test_the_makefile_pins_what_sum_golang_org_serves() -> None:
    """The h1: lines sum.golang.org serves for golang.org/toolchain@v0.0.1-go1.26.8 (checked 2026-11-23, and
    by `go mod download`, which verifies against the checksum database)."""
    text = (SCRIPT.parent / "Makefile").read_text()
    assert "GO_BOOTSTRAP_VERSION := 1.26.8" in text
    assert "linux-amd64=h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM=" in text
    assert "linux-arm64=h1:sYL/O6MqS68ML0kjsQ36WoYIpJqkw60TxizWUYUKQMc=" in text
