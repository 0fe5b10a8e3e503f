"""The socket API's request bodies: bounded and typed before anything reads them (issue 15).

Every body is read against :data:`MAX_BODY_BYTES` (a ``Content-Length`` above it, or a stream that grows past
it, is a 413 before it is kept in memory), parsed as JSON, and walked once: nesting deeper than
:data:`MAX_DEPTH`, ``NaN``/``Infinity`` (which Python's JSON accepts but JSON does not), and integers outside a
signed 64-bit word are refused as a 400 naming the field (``request.memory``, ``ticket``) rather than
reaching SQLite (an ``OverflowError``), the placement core or the JSON encoder (which refuses to write NaN back).
The fields themselves are then range-checked by their decoders (:meth:`gpuslice.local.records.Ask.from_json`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpuslice.spec import SpecError

MAX_BODY_BYTES = 64 * 1024  # an Ask is a few hundred bytes; 64 KiB leaves room for a long command line
MAX_DEPTH = 8  # an Ask nests 3 deep (body → request → models)
MAX_INT = 2**63 - 1  # SQLite's INTEGER, and every count, pid, tick and ticket gpuslice keeps


class BodyTooLarge(SpecError):
    """A body above :data:`MAX_BODY_BYTES` (HTTP 413)."""

    def __init__(self, size: int | str):
        super().__init__("body", f"{size} bytes", f"a JSON object of at most {MAX_BODY_BYTES} bytes")


class _NonFinite:
    def __init__(self, name: str):
        self.name = name


async def read_json_object(request: Any) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``), bounded and checked; :class:`SpecError` otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        raise BodyTooLarge(declared)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(f"more than {MAX_BODY_BYTES}")
        chunks.append(chunk)
    return parse_object(b"".join(chunks))


def parse_object(raw: bytes) -> dict[str, Any]:
    """Parse and check one body (see the module doc)."""
    try:
        data = json.loads(raw or b"{}", parse_constant=_NonFinite)
    except RecursionError:
        raise SpecError("body", f"(nested more than {MAX_DEPTH} deep)", "a JSON object") from None
    except ValueError as exc:  # also invalid UTF-8
        raise SpecError("body", "(not JSON)", f"a JSON object ({str(exc)[:100]})") from None
    if not isinstance(data, dict):
        raise SpecError("body", data, "a JSON object (see the socket API in gpuslice.local.client)")
    _check(data, "", 1)
    return data


def _check(value: Any, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SpecError(where or "body", f"(nested more than {MAX_DEPTH} deep)", "the fields of the socket API")
    if isinstance(value, _NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
        name = value.name if isinstance(value, _NonFinite) else repr(value)
        raise SpecError(where or "body", name, "a finite number (JSON has no NaN or Infinity)")
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT - 1 <= value <= MAX_INT:
        raise SpecError(where or "body", value, f"a whole number from {-MAX_INT - 1} to {MAX_INT}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check(item, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list):
        for k, item in enumerate(value):
            _check(item, f"{where}[{k}]", depth + 1)


def printable(value: Any) -> Any:
    """``value`` as an error response may repeat it: JSON-safe (no NaN) and short."""
    from gpuslice.spec.errors import shown

    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and -MAX_INT - 1 <= value <= MAX_INT:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= 120:
        return value
    return shown(value)
