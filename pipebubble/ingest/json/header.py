"""The header of a Chrome/Kineto trace (everything but ``traceEvents``): each field decoded on its own,
checked, and made safe to store.

Values the analysis computes with are checked against their column's range: ``baseTimeNanoseconds`` must
lie strictly within ``±spans.TIME_LIMIT_NS`` (it is added to every timestamp), ``distributedInfo.rank`` and
``world_size`` must fit Int32; anything else there is a TraceFormatError, never a wrapped value. Free-form
values (``backend``, ``pg_config``) are kept for the report but made storable: ints beyond int64 become
their decimal text, containers deeper than a few levels are dropped, each with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.json import mend
from pipebubble.spans import INT32, INT64, TIME_LIMIT_NS

_MAX_DEPTH = 16
_MAX_TEXT = 4000  # decimal digits of an int turned into text (Python's own limit is 4300)


def header_dict(path: Path, head: Any) -> tuple[dict[str, Any], list[str]]:
    """The header fields later steps use, and warnings about values that had to be changed."""
    warnings: list[str] = []
    info = _value(path, head.distributedInfo, "distributedInfo", warnings)
    info = info if isinstance(info, dict) else {}
    base = _whole(path, _value(path, head.baseTimeNanoseconds, "baseTimeNanoseconds", warnings), warnings)
    fields = {
        "base_time_ns": _checked_int(path, base, "baseTimeNanoseconds", TIME_LIMIT_NS),
        "rank": _checked_int(path, info.get("rank"), "distributedInfo.rank", INT32),
        "world_size": _checked_int(path, info.get("world_size"), "distributedInfo.world_size", INT32),
        "backend": _storable(path, info.get("backend"), "distributedInfo.backend", warnings),
        "pg_config": _storable(path, info.get("pg_config"), "distributedInfo.pg_config", warnings),
        "gpu_memory_bytes": _gpu_memory(devices := _value(path, head.deviceProperties, "deviceProperties", warnings)),
        "gpu_names": _gpu_names(devices),
        "kineto": any(_present(r) for r in (head.schemaVersion, head.deviceProperties, head.distributedInfo)),
    }
    return fields, warnings


def _gpu_memory(devices: Any) -> dict[int, int]:
    """Each GPU's memory in bytes from ``deviceProperties[]`` (``id``, ``totalGlobalMem``): entries that are
    not a whole id with a positive int64 size are left out (the capacity is then unknown, not guessed)."""
    if not isinstance(devices, list):
        return {}
    out = {}
    for d in devices:
        if isinstance(d, dict):
            gid, size = d.get("id"), d.get("totalGlobalMem")
            if type(gid) is int and 0 <= gid < INT32 and type(size) is int and 0 < size < INT64:
                out[gid] = size
    return out


def _gpu_names(devices: Any) -> dict[int, str]:
    """Each GPU's name from ``deviceProperties[]`` (``id``, ``name``: ``NVIDIA H100 80GB HBM3``), what its
    peaks are found by; entries without a whole id and a name are left out."""
    if not isinstance(devices, list):
        return {}
    return {d["id"]: d["name"][:200] for d in devices if isinstance(d, dict) and type(d.get("id")) is int
            and 0 <= d["id"] < INT32 and isinstance(d.get("name"), str) and d["name"].strip()}


def _whole(path: Path, base: Any, warnings: list[str]) -> Any:
    """``baseTimeNanoseconds`` written as a float: a whole one is used as the int it is; any other value is
    ignored with a warning (timestamps then count from 0, as in a trace without a base)."""
    if isinstance(base, float):
        if base.is_integer() and abs(base) < 2**53:
            return int(base)
        warnings.append(f"{path}: header field baseTimeNanoseconds ignored (not a whole number of ns: {base!r})")
        return None
    if base is not None and not isinstance(base, int):
        warnings.append(f"{path}: header field baseTimeNanoseconds ignored (not a number: {str(base)[:40]!r})")
        return None
    return base


def _present(raw: msgspec.Raw) -> bool:
    return len(raw) > 0 and bytes(raw) != b"null"


def _value(path: Path, raw: msgspec.Raw, name: str, warnings: list[str]) -> Any:
    """A raw header value decoded; None (with a warning) when it holds a number no float can hold."""
    if not len(raw):
        return None
    try:
        try:
            return msgspec.json.decode(raw)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:  # invalid UTF-8 inside the value (the header itself was repaired)
            fixed, replaced, _ = mend.fix_unicode(bytes(raw))
            value = msgspec.json.decode(fixed)
            warnings.append(f"{path}: header field {name}: {replaced} invalid UTF-8 sequences replaced by U+FFFD")
            return value
    except msgspec.DecodeError as exc:
        warnings.append(f"{path}: header field {name} ignored ({exc})")
        return None


def _checked_int(path: Path, value: Any, name: str, limit: int) -> int | None:
    """An int strictly within ``±limit``; None when the field is absent or not an int; else an error."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not -limit < value < limit:
        shown = str(value) if value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
        reason = f"header field {name} is out of range ({shown}; it must lie strictly within ±{limit})"
        raise TraceFormatError(path, reason)
    return value


def _storable(path: Path, value: Any, name: str, warnings: list[str]) -> Any:
    """``value`` with ints beyond int64 as text and containers below ``_MAX_DEPTH`` dropped."""
    changed: list[str] = []
    clean = _clean(value, 0, changed)
    if changed:
        warnings.append(f"{path}: header field {name} changed to be storable ({', '.join(sorted(set(changed)))})")
    return clean


def _clean(value: Any, depth: int, changed: list[str]) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        if -INT64 <= value < INT64:
            return value
        changed.append("ints beyond int64 as text")
        return str(value) if value.bit_length() < _MAX_TEXT * 3 else None
    if depth >= _MAX_DEPTH:
        changed.append(f"values nested deeper than {_MAX_DEPTH} dropped")
        return None
    if isinstance(value, dict):
        return {k: _clean(v, depth + 1, changed) for k, v in value.items()}
    return [_clean(v, depth + 1, changed) for v in value]
