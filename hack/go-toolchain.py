#!/usr/bin/env python3
"""Print the path of a Go toolchain new enough to build hack/'s tools; fetch the pinned one if needed.

    python3 hack/go-toolchain.py --min 1.26.0 --version 1.26.8 --dir hack/.go \
        --h1 linux-amd64=h1:... --h1 linux-arm64=h1:... [--go go]

1. ``--go`` (the Makefile passes ``$(GO)``, default ``go``) when it is on PATH and at least ``--min``.
2. Else the pinned ``--version`` already unpacked under ``--dir`` (a previous run).
3. Else download it from the Go module proxy, where Go releases are the module ``golang.org/toolchain``
   at version ``v0.0.1-go<VERSION>.<os>-<arch>`` (what ``GOTOOLCHAIN=auto`` fetches), check the zip's
   ``h1:`` hash against the pinned one (the line sum.golang.org serves for that module version), unpack
   it under ``--dir`` and use it.

Only the path is printed (stdout); what happens goes to stderr. When no toolchain can be had this exits 1
with one line saying why: the e2e tools must not be skipped silently. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

DEFAULT_PROXY = "https://proxy.golang.org"
_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class Failure(Exception):
    """Why no toolchain could be had (one line)."""


def say(message: str) -> None:
    print(f"hack: {message}", file=sys.stderr, flush=True)


def parse_version(text: str) -> tuple[int, int, int, int] | None:
    """(major, minor, patch, final) from 'go version go1.26.8 linux/amd64', 'go1.26rc1' or '1.26.0'.
    A pre-release (rc, beta) sorts before the release of the same number."""
    m = re.search(r"(?:go)?(\d+)\.(\d+)(?:\.(\d+))?((?:rc|beta)\d+)?", text)
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0), 0 if m[4] else 1


def installed_version(go: str) -> tuple[str, tuple[int, int, int, int] | None] | None:
    """(path, version) of ``go`` if it runs; the version is None when its output cannot be read."""
    path = shutil.which(go)
    if path is None:
        return None
    env = {**os.environ, "GOTOOLCHAIN": "local"}  # the binary's own version, not one it would switch to
    env.pop("GOROOT", None)
    try:
        out = subprocess.run([path, "version"], capture_output=True, text=True, env=env, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return path, None
    return path, parse_version(out)


def platform_name() -> str:
    system = platform.system().lower()
    arch = _ARCHES.get(platform.machine().lower())
    if system != "linux" or arch is None:
        raise Failure(f"no pinned Go toolchain for {platform.system()}/{platform.machine()} (linux-amd64 and "
                      "linux-arm64 are pinned); install Go yourself")
    return f"{system}-{arch}"


def h1_of_zip(path: Path) -> str:
    """Go's dirhash Hash1 of a module zip: sha256 over the sorted 'sha256hex  name' lines of its files."""
    lines = []
    with zipfile.ZipFile(path) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename.encode()):
            if info.is_dir():
                continue
            if "\n" in info.filename:
                raise Failure(f"{path.name}: a file name with a newline")
            digest = hashlib.sha256()
            with z.open(info) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            lines.append(f"{digest.hexdigest()}  {info.filename}\n")
    return "h1:" + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode()


def proxies() -> list[str]:
    """The HTTP(S) proxies of $GOPROXY in order ('direct' cannot serve a toolchain zip; 'off' forbids)."""
    value = os.environ.get("GOPROXY", "").strip() or DEFAULT_PROXY
    entries = [e.strip() for e in re.split(r"[,|]", value) if e.strip()]
    urls = [e.rstrip("/") for e in entries if e not in ("direct", "off")]
    if not urls:
        raise Failure(f"GOPROXY={value} names no module proxy to download the Go toolchain from")
    return urls


def download(url: str, into: Path) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "gpuslice-hack-go-toolchain"})
    with urllib.request.urlopen(request, timeout=60) as response, open(into, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)


def unpack(zip_path: Path, prefix: str, into: Path) -> None:
    """Extract the files under ``prefix`` into ``into``; module zips hold no modes: set the exec bits Go's
    own toolchain switch sets (bin/ and pkg/tool/)."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(prefix):
                raise Failure(f"{zip_path.name}: {name!r} is outside {prefix!r}")
            rel = Path(name[len(prefix):])
            if rel.is_absolute() or ".." in rel.parts:
                raise Failure(f"{zip_path.name}: unsafe path {name!r}")
            target = into / rel
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    for sub in ("bin", "pkg/tool"):
        for f in (into / sub).rglob("*"):
            if f.is_file():
                f.chmod(f.stat().st_mode | 0o111)


def fetch(version: str, plat: str, pinned_h1: str, cache: Path) -> Path:
    """The pinned toolchain's go binary under ``cache``, downloading and checking it first if needed."""
    module_version = f"v0.0.1-go{version}.{plat}"
    root = cache / f"go{version}.{plat}"
    go = root / "bin" / "go"
    if go.is_file():
        return go
    cache.mkdir(parents=True, exist_ok=True)
    errors = []
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as tmp:
        zip_path = Path(tmp) / f"{module_version}.zip"
        for proxy in proxies():
            url = f"{proxy}/golang.org/toolchain/@v/{module_version}.zip"
            say(f"downloading Go {version} ({plat}, about 70 MB) from {url}")
            started = time.monotonic()
            try:
                download(url, zip_path)
                break
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                errors.append(f"{url}: {exc}")
        else:
            raise Failure("could not download the Go toolchain: " + "; ".join(errors))
        got = h1_of_zip(zip_path)
        if got != pinned_h1:
            raise Failure(f"{module_version}.zip has hash {got}, but {pinned_h1} is pinned (sum.golang.org's line "
                          "for golang.org/toolchain); refusing to use it")
        staging = Path(tmp) / "root"
        unpack(zip_path, f"golang.org/toolchain@{module_version}/", staging)
        try:
            staging.rename(root)
        except OSError:
            if not go.is_file():  # not a concurrent run that got there first
                raise
        say(f"Go {version} checked ({pinned_h1}) and unpacked in {root} ({time.monotonic() - started:.0f} s)")
    return go


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--go", default=os.environ.get("GO") or "go", help="the Go command to try first")
    parser.add_argument("--min", required=True, help="the oldest Go that will do, e.g. 1.26.0")
    parser.add_argument("--version", required=True, help="the pinned Go release to download, e.g. 1.26.8")
    parser.add_argument("--h1", action="append", default=[], metavar="PLATFORM=h1:HASH",
                        help="the pinned hash of golang.org/toolchain@v0.0.1-go<version>.<platform>")
    parser.add_argument("--dir", required=True, type=Path, help="where downloaded toolchains are kept")
    args = parser.parse_args(argv)
    minimum = parse_version(args.min)
    pinned = parse_version(args.version)
    if minimum is None or pinned is None or pinned < minimum:
        say(f"--version {args.version} must be a Go version at least --min {args.min}")
        return 2
    found = installed_version(args.go)
    if found is not None and found[1] is not None and found[1] >= minimum:
        print(found[0])
        return 0
    why = (f"'{args.go}' is not on PATH" if found is None else
           f"{found[0]} does not say its version" if found[1] is None else
           f"{found[0]} is Go {'.'.join(map(str, found[1][:3]))}, older than {args.min}")
    try:
        plat = platform_name()
        hashes = dict(h.split("=", 1) for h in args.h1 if "=" in h)
        if plat not in hashes:
            raise Failure(f"no pinned hash for {plat}")
        go = fetch(args.version, plat, hashes[plat], args.dir.resolve())
        ran = installed_version(str(go))
        if ran is None or ran[1] is None or ran[1] < minimum:
            raise Failure(f"{go} does not run or does not report Go {args.version}")
    except Failure as exc:
        say(f"no Go >= {args.min}: {why}, and the pinned Go {args.version} cannot be had: {exc}. "
            f"Install Go >= {args.min}, or make the Go module proxy reachable (GOPROXY).")
        return 1
    say(f"{why}; using the pinned Go {args.version} in {go.parent.parent}")
    print(go)
    return 0


if __name__ == "__main__":
    sys.exit(main())
