#!/usr/bin/env python3
"""Run a Go build and say how it is going: what is being built, for how long, how far.

    python3 hack/progress.py --what "the control plane" [--cold "7–15 minutes"] [--every 30] -- go build -v ...

A cold build of hack/'s tools takes 8–17 minutes on two CPUs and ``go`` prints nothing meanwhile, which
reads as a hang. With ``-v`` it names each package as it compiles it and ``go: downloading M V`` for each
module it fetches; this script counts both and shows the elapsed time and the last package:

* on a terminal, one status line rewritten every second;
* in a pipe or a log (CI), a status line every ``--every`` seconds (30), so a log shows life without
  thousands of package names.

Lines that are neither (compiler errors, warnings) are printed as they come. The end says how long it
took, or — the command's exit status is kept — that it failed, with its last lines when it printed no
error of its own. Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import threading
import time

PACKAGE = re.compile(r"^[A-Za-z0-9_.~+-]+(/[A-Za-z0-9_.~+-]+)*$")  # what `go build -v` prints per package
DOWNLOAD = re.compile(r"^go: downloading (\S+) (\S+)$")


def elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Build:
    """What the build has printed so far, and the status line made from it."""

    def __init__(self, what: str):
        self.what = what
        self.start = time.monotonic()
        self.packages = 0
        self.downloads = 0
        self.last = ""
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.other: list[str] = []
        self.lock = threading.Lock()

    def take(self, line: str) -> str | None:
        """Count a progress line; return a line to show as it is (an error, a warning), else None."""
        line = line.rstrip("\n")
        with self.lock:
            self.tail.append(line)
            match = DOWNLOAD.match(line)
            if match:
                self.downloads += 1
                self.last = f"downloading {match[1]}"
                return None
            if PACKAGE.match(line):
                self.packages += 1
                self.last = line
                return None
            if line.strip():
                self.other.append(line)
                return line
            return None

    def status(self) -> str:
        with self.lock:
            parts = [f"{elapsed(time.monotonic() - self.start)} elapsed"]
            if self.downloads:
                parts.append(f"{self.downloads} modules downloaded")
            parts.append(f"{self.packages} packages compiled")
            text = f"hack: building {self.what}: {', '.join(parts)}"
            return text + (f" (now: {self.last})" if self.last else "")


def run(what: str, command: list[str], every: float, cold: str = "", out=sys.stderr) -> int:
    build = Build(what)
    tty = out.isatty()
    expect = f" ({cold} with empty Go caches on two CPUs, seconds once they are filled)" if cold else ""
    print(f"hack: building {what}{expect}", file=out, flush=True)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    width = 0

    def show(line: str, final: bool = False) -> None:
        nonlocal width
        if tty:
            line = line[:200]
            print("\r" + line.ljust(width), end="\n" if final else "", file=out, flush=True)
            width = 0 if final else len(line)
        else:
            print(line, file=out, flush=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            shown = build.take(line)
            if shown is not None:
                show(shown, final=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    next_status = time.monotonic() + (1.0 if tty else every)
    while reader.is_alive():
        reader.join(timeout=0.2)
        if time.monotonic() >= next_status and reader.is_alive():
            show(build.status())
            next_status = time.monotonic() + (1.0 if tty else every)
    code = proc.wait()
    took = elapsed(time.monotonic() - build.start)
    if code == 0:
        counts = (f"{build.packages} packages compiled, {build.downloads} modules downloaded"
                  if build.packages or build.downloads else "everything from the Go caches")
        show(f"hack: built {what} in {took} ({counts})", final=True)
        return 0
    show(f"hack: building {what} failed after {took} (exit {code})", final=True)
    if not build.other:  # it said nothing but progress: its last lines are the best clue
        for line in build.tail:
            print(f"  {line}", file=out)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", required=True, help="what is being built, as the messages name it")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between status lines in a log")
    parser.add_argument("--cold", default="", help="how long a build with empty caches takes, as people say it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the build command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    try:
        return run(args.what, command, args.every, args.cold)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"hack: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
