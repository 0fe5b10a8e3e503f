"""The slice file: how a process learns its slice (contract in ``native/README.md``).

A small ``key=value`` text file named by ``GPUSLICE_SLICE``; the enforcer (``native/src/config/config.c``)
parses it, the launcher and the device plugin write it with :func:`write_slice_file`. This module's
parser follows the C parser rule for rule (tests run both on the same inputs), so anything written
here is read identically there.

    write_slice_file(path, SliceConfig(devices=("GPU-...",), memory_limit=4 * GiB, compute=30,
                                       region="/run/gpuslice/g1.region"))
    read_slice_file(path) == SliceConfig(...)

A grant becomes a slice file through :func:`slice_config`, the one builder that ``gpuslice run`` and the
Kubernetes device plugin share; they differ only in the paths (as the slice's processes see them) and the
node's enforcer settings.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from gpuslice import spec
from gpuslice.spec.colocation import check_colocation
from gpuslice.spec.files import open_regular, write_atomic
from gpuslice.spec.errors import GpusliceError

VERSION = 1
_UUID_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/-]+$")
_MODES = {"hard": "hard", "force": "hard", "soft": "soft", "default": "soft", "off": "off", "disable": "off"}
_LOG_LEVELS = ("error", "warn", "info", "debug")
_KEYS = ("version", "grant", "devices", "memory_limit", "compute", "mode", "weight", "priority", "region",
         "device_state_dir", "oom_policy", "log_level", "fail_open", "context_overhead", "engine", "mps_pipe_dir",
         "colocation", "tidal_schedule", "generation", "oom_wait_ms")
OOM_POLICIES = ("return", "kill", "wait")
MAX_OOM_WAIT_MS = 86_400_000
ENGINES = ("timeslice", "spatial")
COLOCATIONS = ("preemptive", "shared", "tidal")
MAX_DEVICES = 16
PATH_MAX = 1023
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1


class SliceFileError(GpusliceError, ValueError):
    """A slice file (or a SliceConfig about to be written) that breaks the contract. Names the key."""

    def __init__(self, key: str, value: object, allowed: str, line: int | None = None, path: str | None = None):
        self.key, self.value, self.allowed, self.line, self.path = key, value, allowed, line, path
        where = f"{path}: " if path else ""
        where += f"line {line}: " if line else ""
        super().__init__(f"{where}{key}: {value!r} is not allowed; expected {allowed}")


def parse_bytes(text: str) -> int:
    """Bytes from ``4294967296``, ``4g``, ``4Gi``, ``4GiB``, ``3000m``, ``512MB`` (decimal). Raises ValueError.

    The one unit parser (:func:`gpuslice.spec.parse_bytes`) in the slice file's grammar: a bare number is
    bytes, 0 is allowed, whole digits directly followed by a unit, at most 2**64-1 (as the C parser)."""
    return spec.parse_bytes(text, "memory_limit", bare_unit=1, allow_zero=True, strict=True, max_bytes=U64_MAX)


def _valid_uuid(u: str) -> bool:
    return bool(_UUID_RE.match(u)) and 5 <= len(u) < 64 and u.isascii()


@dataclass(frozen=True)
class SliceConfig:
    """One process group's slice. ``memory_limit`` None = no default limit; ``memory_limits`` holds
    per-device overrides keyed by UUID (each must be in ``devices``). ``context_overhead`` None = measured
    by the enforcer on the card at the slice's first context (the built-in 680 MiB until then). ``engine="spatial"``: the processes are MPS clients of the
    daemon whose pipe directory is ``mps_pipe_dir`` (as they see it; "" = their environment's), not paced;
    such a slice covers at most one device. ``generation``: bumped by the node side at each live resize of
    the slice (0 = never resized); a running enforcer takes over a rewritten file, and only a higher
    generation than its region records may raise the slice's limit (``native/README.md``, Live resize).
    ``colocation`` (preemptive, shared or tidal) and a tidal
    slice's ``tidal_schedule`` (canonical, "" = follow the high-priority slices' idle time): how it shares
    the device with the other priority (:mod:`gpuslice.spec.colocation`)."""

    devices: tuple[str, ...] = ()
    memory_limit: int | None = None
    memory_limits: Mapping[str, int] = field(default_factory=dict)
    grant: str = ""
    compute: int = 0
    mode: str = "hard"
    weight: int = 1
    priority: int = 1
    region: str = ""
    device_state_dir: str = ""
    oom_policy: str = "return"
    log_level: str = "warn"
    fail_open: bool = False
    context_overhead: int | None = None
    engine: str = "timeslice"
    mps_pipe_dir: str = ""
    generation: int = 0
    oom_wait_ms: int | None = None  # oom_policy=wait: how long a device-full allocation waits (None: 30 s)
    colocation: str = "preemptive"
    tidal_schedule: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        # An override equal to the default says nothing: drop it (this also lets callers pass None
        # for "unlimited" on every device; an unlimited override under a finite default cannot be
        # written and is refused by validate()).
        object.__setattr__(self, "memory_limits",
                           {u: b for u, b in dict(self.memory_limits).items() if b != self.memory_limit})
        self.validate()

    def limit_for(self, uuid: str) -> int | None:
        """Bytes allowed on device ``uuid`` (None = unlimited)."""
        return self.memory_limits.get(uuid, self.memory_limit)

    def validate(self) -> None:
        if len(self.devices) > MAX_DEVICES:
            raise SliceFileError("devices", self.devices, f"at most {MAX_DEVICES} device UUIDs")
        for u in self.devices:
            if not _valid_uuid(u):
                raise SliceFileError("devices", u, "device UUIDs like GPU-... or MIG-...")
        if len(set(self.devices)) != len(self.devices):
            raise SliceFileError("devices", self.devices, "each UUID once")
        for u, b in self.memory_limits.items():
            if u not in self.devices:
                raise SliceFileError(f"memory_limit.{u}", b, "a device listed in devices")
            _check_bytes(f"memory_limit.{u}", b)
        if self.memory_limit is not None:
            _check_bytes("memory_limit", self.memory_limit)
        if self.context_overhead is not None:
            _check_bytes("context_overhead", self.context_overhead, allow_max=False)
        _check_int("compute", self.compute, 0, 100)
        _check_int("weight", self.weight, 1, 16)
        _check_int("priority", self.priority, 0, 1)
        _check_int("generation", self.generation, 0, U32_MAX)
        if self.mode not in ("hard", "soft", "off"):
            raise SliceFileError("mode", self.mode, "hard, soft or off")
        if self.oom_policy not in OOM_POLICIES:
            raise SliceFileError("oom_policy", self.oom_policy, "return, kill or wait")
        if self.oom_wait_ms is not None:
            _check_int("oom_wait_ms", self.oom_wait_ms, 0, MAX_OOM_WAIT_MS)
        if self.log_level not in _LOG_LEVELS:
            raise SliceFileError("log_level", self.log_level, "error, warn, info or debug")
        if not isinstance(self.fail_open, bool):
            raise SliceFileError("fail_open", self.fail_open, "True or False")
        if self.engine not in ENGINES:
            raise SliceFileError("engine", self.engine, "timeslice or spatial")
        if self.engine == "spatial" and len(self.devices) > 1:
            raise SliceFileError("engine", self.engine, "timeslice for a slice of more than one device "
                                 "(a spatial slice is served by the MPS daemon of one device)")
        if self.mps_pipe_dir and self.engine != "spatial":
            raise SliceFileError("mps_pipe_dir", self.mps_pipe_dir, "none unless engine is spatial")
        self._check_colocation()
        for key in ("region", "device_state_dir", "mps_pipe_dir"):
            v = getattr(self, key)
            if v and (not v.startswith("/") or len(v) > PATH_MAX or any(c in v for c in "\n\r#\0")
                      or v != v.strip()):
                raise SliceFileError(key, v, f"an absolute path of at most {PATH_MAX} bytes without '#' or newlines")
        g = self.grant
        if len(g) > 127 or any(c in g for c in "\n\r#\0") or g != g.strip():
            raise SliceFileError("grant", g, "at most 127 characters, no '#', newlines or surrounding spaces")


    def _check_colocation(self) -> None:
        if self.colocation not in COLOCATIONS:
            raise SliceFileError("colocation", self.colocation, "preemptive, shared or tidal")
        try:
            if spec.parse_tidal_schedule(self.tidal_schedule) != self.tidal_schedule:
                raise SliceFileError("tidal_schedule", self.tidal_schedule, "a canonical schedule like 0-8:100,20-24:60")
            check_colocation(spec.Colocation(self.colocation), self.tidal_schedule, priority=self.priority,
                             mode=self.mode, spatial=self.engine == "spatial")
        except spec.SpecError as exc:
            raise SliceFileError(exc.field, exc.value, exc.allowed) from None


def _check_bytes(key: str, v: object, allow_max: bool = True) -> None:
    spec.whole_number(key, v, 0, U64_MAX if allow_max else U64_MAX - 1,
                      allowed="a whole number of bytes from 0 to 2**64-1", error=SliceFileError)


def _check_int(key: str, v: object, lo: int, hi: int) -> None:
    spec.whole_number(key, v, lo, hi, allowed=f"a whole number from {lo} to {hi}", error=SliceFileError)


def format_slice(cfg: SliceConfig) -> str:
    """The slice file text for ``cfg`` (canonical: plain byte counts, one key per line)."""
    cfg.validate()
    lines = [f"version={VERSION}"]
    if cfg.grant:
        lines.append(f"grant={cfg.grant}")
    if cfg.devices:
        lines.append("devices=" + ",".join(cfg.devices))
    if cfg.memory_limit is not None:
        lines.append(f"memory_limit={cfg.memory_limit}")
    for u in cfg.devices:
        if u in cfg.memory_limits:
            lines.append(f"memory_limit.{u}={cfg.memory_limits[u]}")
    lines += [f"compute={cfg.compute}", f"mode={cfg.mode}", f"weight={cfg.weight}", f"priority={cfg.priority}"]
    if cfg.region:
        lines.append(f"region={cfg.region}")
    if cfg.device_state_dir:
        lines.append(f"device_state_dir={cfg.device_state_dir}")
    lines += [f"oom_policy={cfg.oom_policy}", f"log_level={cfg.log_level}", f"fail_open={int(cfg.fail_open)}"]
    if cfg.oom_wait_ms is not None:
        lines.append(f"oom_wait_ms={cfg.oom_wait_ms}")
    if cfg.context_overhead is not None:
        lines.append(f"context_overhead={cfg.context_overhead}")
    if cfg.engine != "timeslice":  # time-sliced slice files stay what they were before engines
        lines.append(f"engine={cfg.engine}")
    if cfg.mps_pipe_dir:
        lines.append(f"mps_pipe_dir={cfg.mps_pipe_dir}")
    if cfg.generation:  # slice files never resized stay what they were before live resize
        lines.append(f"generation={cfg.generation}")
    if cfg.colocation != "preemptive":  # likewise: files of preemptive slices stay what they were
        lines.append(f"colocation={cfg.colocation}")
    if cfg.tidal_schedule:
        lines.append(f"tidal_schedule={cfg.tidal_schedule}")
    return "\n".join(lines) + "\n"


def slice_config(grant: spec.Grant, *, region: str, device_state_dir: str, oom_policy: str = "return",
                 log_level: str = "warn", fail_open: bool = False, mps_pipe_dir: str = "",
                 generation: int = 0, oom_wait_ms: int | None = None) -> SliceConfig:
    """The slice file of ``grant``: its devices and memory limits (per device where they differ), the first
    slice's compute share, mode, weight, priority, engine and co-location (a grant's slices share them), the region,
    device-state and (spatial) MPS pipe paths as the slice's processes see them, and the node's enforcer
    settings; ``generation`` counts the grant's live resizes (0: none)."""
    first = grant.slices[0]
    spatial = first.engine is spec.Engine.SPATIAL
    return SliceConfig(
        devices=grant.uuids, memory_limit=first.memory_limit,
        memory_limits={s.device_uuid: s.memory_limit for s in grant.slices}, grant=grant.grant_id,
        compute=first.compute, mode=first.mode.value, weight=first.weight, priority=int(first.priority),
        region=region, device_state_dir=device_state_dir, oom_policy=oom_policy, log_level=log_level,
        fail_open=fail_open, engine=first.engine.value, mps_pipe_dir=mps_pipe_dir if spatial else "",
        colocation=first.colocation.value, tidal_schedule=first.tidal_schedule, generation=generation,
        oom_wait_ms=oom_wait_ms)


def write_slice_file(path: str | os.PathLike[str], config: SliceConfig | None = None, **fields_: Any) -> SliceConfig:
    """Write ``config`` (or a SliceConfig built from keyword fields) to ``path`` atomically (a reader
    never sees half a file) with mode 0644. Returns the config written."""
    if config is None:
        config = SliceConfig(**fields_)
    elif fields_:
        raise TypeError("pass either a SliceConfig or keyword fields, not both")
    write_atomic(path, format_slice(config), 0o644, encoding="ascii")
    return config


def parse_slice_text(text: str, path: str | None = None) -> SliceConfig:
    """Parse slice-file text with the enforcer's rules. Raises SliceFileError naming line and key."""
    kw: dict[str, Any] = {}
    overrides: dict[str, int] = {}
    seen: set[str] = set()
    for lineno, key, val in _entries(text, path):
        if key.startswith("memory_limit.") and key not in _KEYS:
            uuid = key[len("memory_limit."):]
            if not _valid_uuid(uuid):
                raise SliceFileError(key, uuid, "memory_limit.<device UUID>", lineno, path)
            if uuid in overrides:
                raise SliceFileError(key, val, "each key once", lineno, path)
            overrides[uuid] = _bytes(key, val, lineno, path)
            continue
        if key not in _KEYS:
            raise SliceFileError(key, val, "a known key: " + " ".join(_KEYS) + " memory_limit.<uuid>", lineno, path)
        if key in seen:
            raise SliceFileError(key, val, "each key once", lineno, path)
        seen.add(key)
        kw.update(_value(key, val, lineno, path))
    if "version" not in seen:
        raise SliceFileError("version", None, "version=1", None, path)
    devs = kw.get("devices", ())
    for u in overrides:
        if u not in devs:
            raise SliceFileError(f"memory_limit.{u}", overrides[u], "a device listed in devices", None, path)
    kw["memory_limits"] = overrides
    return SliceConfig(**kw)


def _entries(text: str, path: str | None) -> Iterator[tuple[int, str, str]]:
    """(line number, key, value) of each ``key=value`` line; comments and blank lines skipped."""
    for lineno, raw in enumerate(text.split("\n"), 1):
        if len(raw.encode("utf-8", "surrogateescape")) > 2047:
            raise SliceFileError("line", raw[:40] + "...", "lines of at most 2047 bytes", lineno, path)
        if "\0" in raw:
            raise SliceFileError("line", raw, "no NUL bytes", lineno, path)
        line = raw.split("#", 1)[0].strip(" \t\r")
        if not line:
            continue
        if "=" not in line:
            raise SliceFileError("line", line, "key=value", lineno, path)
        key, val = (s.strip(" \t\r") for s in line.split("=", 1))
        yield lineno, key, val


def _value(key: str, val: str, lineno: int, path: str | None) -> dict[str, Any]:
    """The SliceConfig field(s) one known key sets (none for ``version``, which must be 1)."""
    def bad(allowed: str, shown: object = val) -> SliceFileError:
        return SliceFileError(key, shown, allowed, lineno, path)

    if key == "version":
        if val != "1":
            raise bad("1")
        return {}
    if key == "grant":
        if len(val) > 127:
            raise bad("at most 127 characters")
        return {key: val}
    if key == "devices":
        return {key: _devices(val, bad)}
    if key in ("memory_limit", "context_overhead"):
        b = _bytes(key, val, lineno, path)
        if key == "context_overhead" and b == U64_MAX:
            raise bad("a byte size below 2**64-1")
        return {key: b}
    if key in ("compute", "weight", "fail_open") or (key == "priority" and val not in ("high", "low")):
        lo, hi = {"compute": (0, 100), "weight": (1, 16), "priority": (0, 1), "fail_open": (0, 1)}[key]
        if not val.isdigit() or not val.isascii() or not lo <= int(val) <= hi:
            raise bad(f"a whole number from {lo} to {hi}")
        return {key: bool(int(val)) if key == "fail_open" else int(val)}
    if key == "priority":
        return {key: 0 if val == "high" else 1}
    if key == "mode":
        if val not in _MODES:
            raise bad("hard, soft or off")
        return {key: _MODES[val]}
    if key in ("region", "device_state_dir", "mps_pipe_dir"):
        if not val.startswith("/") or len(val) > PATH_MAX:
            raise bad("an absolute path")
        return {key: val}
    if key == "oom_wait_ms":
        if not val.isdigit() or not val.isascii() or len(val) > 8 or int(val) > MAX_OOM_WAIT_MS:
            raise bad(f"milliseconds from 0 to {MAX_OOM_WAIT_MS}")
        return {key: int(val)}
    if key == "generation":
        if not val.isdigit() or not val.isascii() or len(val) > 10 or int(val) > U32_MAX:
            raise bad(f"a whole number from 0 to {U32_MAX}")
        return {key: int(val)}
    if key == "engine":
        if val not in ENGINES:
            raise bad("timeslice or spatial")
        return {key: val}
    if key == "colocation":
        if val not in COLOCATIONS:
            raise bad("preemptive, shared or tidal")
        return {key: val}
    if key == "tidal_schedule":
        try:
            return {key: spec.parse_tidal_schedule(val) or _empty_schedule(bad)}
        except spec.SpecError as exc:
            raise bad(exc.allowed) from None
    allowed = {"oom_policy": OOM_POLICIES, "log_level": _LOG_LEVELS}[key]
    if val not in allowed:
        raise bad(", ".join(allowed[:-1]) + " or " + allowed[-1])
    return {key: val}


def _empty_schedule(bad: Callable[..., SliceFileError]) -> str:
    raise bad("spans <from>-<to>:<percent> separated by commas (e.g. 8-20:30,20-8:100)")


def _devices(val: str, bad: Callable[..., SliceFileError]) -> tuple[str, ...]:
    devs = [d for d in (d.strip(" \t\r") for d in val.split(",")) if d]
    if not devs:
        raise bad("device UUIDs separated by commas")
    for d in devs:
        if not _valid_uuid(d):
            raise bad("device UUIDs like GPU-... or MIG-...", d)
    if len(devs) > MAX_DEVICES or len(set(devs)) != len(devs):
        raise bad(f"at most {MAX_DEVICES} distinct UUIDs")
    return tuple(devs)


def _bytes(key: str, val: str, lineno: int, path: str | None) -> int:
    try:
        return parse_bytes(val)
    except ValueError:
        raise SliceFileError(key, val, "a byte size like 4294967296, 4g, 4Gi or 4096Mi", lineno, path) from None


def read_slice_file(path: str | os.PathLike[str]) -> SliceConfig:
    """Parse the slice file at ``path`` (a regular file: a FIFO is refused at once rather than hanging)."""
    path = os.fspath(path)
    with os.fdopen(open_regular(path, follow=True), "rb") as f:
        data = f.read(65536)
    return parse_slice_text(data.decode("utf-8", "surrogateescape"), path)


__all__ = ["SliceConfig", "SliceFileError", "format_slice", "parse_bytes", "parse_slice_text", "read_slice_file",
           "slice_config", "write_slice_file"]
