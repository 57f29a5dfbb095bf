"""Decode Chrome-trace JSON (torch.profiler/Kineto writes this format too) into columns.

The ``traceEvents`` array is cut into blocks at event boundaries and each block is decoded with a typed
msgspec decoder that reads only the fields we use; a block's Python objects are dropped as soon as its
columns are built, so memory stays near the size of the file. A file cut off mid-write is read up to its
last whole event.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from pipebubble.errors import TraceFormatError

BLOCK_BYTES = 32 << 20
# Floats below 2**43 µs still resolve 1 ns; above (absolute epoch µs with a fraction) the text is re-read.
_EXACT_FLOAT_US = 2.0**43
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _Args(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    name: Any = None  # process/thread names in metadata events


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    args: _Args | None = None


class _EventTs(msgspec.Struct, gc=False):
    ph: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")


class _DistInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None
    pg_config: Any = None


class _Header(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: _DistInfo | None = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    deviceProperties: Any = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_EVENTS_TS = msgspec.json.Decoder(list[_EventTs])
_HEADER = msgspec.json.Decoder(_Header)


@dataclass
class Decoded:
    """Raw event columns of one file plus its header and what could not be read."""

    events: pl.DataFrame
    header: dict[str, Any] = field(default_factory=dict)
    unread_bytes: int = 0
    total_bytes: int = 0


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when needed; a gzip stream cut short yields what it holds."""
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, zlib.error, OSError):
        return zlib.decompressobj(wbits=31).decompress(raw)


def decode(path: Path, data: bytes) -> Decoded:
    """Split ``data`` into header and event blocks, decode each block into columns."""
    start = len(data) - len(data.lstrip())
    if not data[start:start + 1]:
        raise TraceFormatError(path, "empty file")
    if data[start:start + 1] == b"[":
        header, region, whole = {}, memoryview(data)[start + 1:], False
    elif data[start:start + 1] == b"{":
        header, region, whole = _split_object(path, data)
    else:
        raise TraceFormatError(path, "not a JSON trace (expected '{' or '[' at the start)")
    frames, unread = _decode_region(path, region, whole)
    events = pl.concat(frames, how="vertical_relaxed") if frames else _frame([], None)
    return Decoded(events, header, unread, len(data))


def _split_object(path: Path, data: bytes) -> tuple[dict[str, Any], memoryview, bool]:
    """Header fields and the bytes inside ``traceEvents: [...]``; ``whole`` is False for a cut-off file."""
    try:
        head = _HEADER.decode(data)
    except msgspec.DecodeError:
        head = None
    if head is not None:
        raw = memoryview(head.traceEvents)
        if not raw.nbytes:
            raise TraceFormatError(path, "JSON object without a 'traceEvents' array")
        body = bytes(raw).strip()
        if body[:1] != b"[":
            raise TraceFormatError(path, "'traceEvents' is not an array")
        return _header_dict(head), memoryview(body)[1:-1], True
    match = _ARRAY_KEY.search(data)
    if match is None:
        raise TraceFormatError(path, "not valid JSON and no 'traceEvents' array found")
    try:
        head = _HEADER.decode(data[: match.start()] + b'"traceEvents": []}')
    except msgspec.DecodeError:
        head = _Header()
    return _header_dict(head), memoryview(data)[match.end():], False


def _header_dict(head: _Header) -> dict[str, Any]:
    info = head.distributedInfo
    return {
        "base_time_ns": head.baseTimeNanoseconds if isinstance(head.baseTimeNanoseconds, int) else None,
        "rank": info.rank if info and isinstance(info.rank, int) else None,
        "world_size": info.world_size if info and isinstance(info.world_size, int) else None,
        "backend": info.backend if info else None,
        "pg_config": info.pg_config if info else None,
        "kineto": head.schemaVersion is not None or head.deviceProperties is not None or info is not None,
    }


def _decode_region(path: Path, region: memoryview, whole: bool) -> tuple[list[pl.DataFrame], int]:
    """Decode the array body block by block. Returns the frames and the count of unreadable bytes.

    A block that fails to decode usually means its boundary sat inside a string or nested value: the
    block is extended to the next boundary. In a cut-off file (``whole`` False) the last block is read up
    to its last whole event.
    """
    frames: list[pl.DataFrame] = []
    pos, end = 0, len(region)
    while pos < end and region[pos:end].tobytes().strip():
        cut, tries = _next_boundary(region, pos + BLOCK_BYTES, end), 0
        while True:
            try:
                frames.append(_decode_block(region[pos:cut]))
                break
            except msgspec.ValidationError as exc:
                raise TraceFormatError(path, f"trace events of the wrong shape: {exc}") from None
            except msgspec.DecodeError as exc:
                if cut < end and (whole or tries < _MAX_EXTENSIONS):
                    cut, tries = _next_boundary(region, cut + 1, end), tries + 1
                    continue
                if whole:
                    raise TraceFormatError(path, f"malformed trace events: {exc}") from None
                good = _last_whole_prefix(region, pos, cut, _error_offset(exc, cut - pos))
                if good is None:
                    raise TraceFormatError(path, f"malformed trace event near byte {pos}: {exc}") from None
                if good > pos:
                    frames.append(_decode_block(region[pos:good]))
                return frames, len(region) - good
        pos = cut + 1
    return frames, 0


_MAX_EXTENSIONS = 8
_MAX_TAIL_TRIES = 64
_BYTE = re.compile(r"\(byte (\d+)\)")


def _decode_block(body: memoryview) -> pl.DataFrame:
    block = b"".join((b"[", body, b"]"))
    return _frame(_EVENTS.decode(block), block)


def _error_offset(exc: msgspec.DecodeError, length: int) -> int:
    """Where in the block body the decoder gave up (the end, for truncated input)."""
    match = _BYTE.search(str(exc))
    return min(length, int(match.group(1))) if match else length


def _next_boundary(region: memoryview, target: int, end: int) -> int:
    """Offset of the comma after the first ``}`` at or past ``target`` that may end an event, else ``end``."""
    window = 1 << 20
    while target < end:
        chunk = region[target:min(end, target + window)].tobytes()
        match = _BOUNDARY.search(chunk)
        if match:
            return target + chunk.index(b",", match.start())
        target += window - 64
    return end


def _last_whole_prefix(region: memoryview, pos: int, cut: int, failed_at: int) -> int | None:
    """The end of the longest run of whole events in ``region[pos:cut]`` before the decoder failed."""
    text = region[pos:cut].tobytes()
    ends = [m.start() + 1 for m in _BOUNDARY.finditer(text, 0, failed_at + 1)]
    closing = text.rfind(b"}", 0, failed_at + 1)
    candidates = sorted({*ends[-_MAX_TAIL_TRIES:], closing + 1} - {0}, reverse=True)
    for end in candidates[:_MAX_TAIL_TRIES]:
        try:
            _EVENTS.decode(b"[" + text[:end] + b"]")
            return pos + end
        except msgspec.DecodeError:
            continue
    return pos if text.lstrip()[:1] in (b"{", b"") else None


def _frame(events: list[_Event], block: bytes | None) -> pl.DataFrame:
    """Columns of one block. ``ts``/``dur`` become exact int ns (see ``_ns``)."""
    get = _getter(events)
    ts = pl.Series("ts", get("ts"), dtype=pl.Float64, strict=False)
    frame = pl.DataFrame(
        [
            pl.Series("ph", get("ph"), dtype=pl.String, strict=False),
            pl.Series("cat", get("cat"), dtype=pl.String, strict=False),
            pl.Series("name", get("name"), dtype=pl.String, strict=False),
            _id_series("pid", get("pid")),
            _id_series("tid", get("tid")),
            pl.Series("dur", get("dur"), dtype=pl.Float64, strict=False),
            pl.Series("id", [None if v is None else str(v) for v in get("id")], dtype=pl.String),
        ]
    )
    args = [e.args for e in events]
    frame = frame.with_columns(
        ts_ns=_exact_ts(ts, events, block),
        dur_ns=(pl.col("dur") * 1000).round().cast(pl.Int64),
        external_id=pl.Series([a.external_id if a else None for a in args], dtype=pl.Int64, strict=False),
        correlation=pl.Series([a.correlation if a else None for a in args], dtype=pl.Int64, strict=False),
        arg_name=pl.Series([a.name if a else None for a in args], dtype=pl.String, strict=False),
    )
    return frame.drop("dur")


def _getter(events: list[_Event]):
    def get(attr: str) -> list[Any]:
        return [getattr(e, attr) for e in events]

    return get


def _id_series(name: str, values: list[Any]) -> pl.Series:
    """pid/tid: ints as they are; a string id (generic traces name processes) maps to a stable int."""
    series = pl.Series(name, values, dtype=pl.Int64, strict=False)
    if series.null_count() == sum(v is None for v in values):
        return series
    return pl.Series(name, [_stable_id(v) for v in values], dtype=pl.Int64)


def _stable_id(value: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    text = str(value)
    if text.lstrip("-").isdigit():
        return int(text)
    return -(zlib.crc32(text.encode()) + 1)  # negative: never collides with a real OS pid


def _exact_ts(ts: pl.Series, events: list[_Event], block: bytes | None) -> pl.Series:
    """µs to int ns without float drift: whole µs and the fraction are converted separately; where the
    float cannot hold 1 ns (absolute epoch µs with a fraction) the number's text is parsed instead."""
    whole = ts.floor()
    ns = whole.cast(pl.Int64) * 1000 + ((ts - whole) * 1000).round().cast(pl.Int64)
    if block is None or not len(ts) or (ts.abs().max() or 0) < _EXACT_FLOAT_US or (ts == whole).all():
        return ns.rename("ts_ns")
    text = b"\n".join(e.ts for e in _EVENTS_TS.decode(block)).decode()
    return _parse_us_text(pl.Series("t", text.split("\n"), dtype=pl.String)).rename("ts_ns")


def _parse_us_text(text: pl.Series) -> pl.Series:
    """Decimal µs text (``1712195495519695.812``) to int ns exactly; exponent forms fall back to float."""
    frame = pl.DataFrame({"t": text}).with_columns(
        parts=pl.col("t").str.split_exact(".", 1),
        is_plain=pl.col("t").str.contains(r"^-?\d+(\.\d*)?$"),
    ).unnest("parts")
    frac = pl.col("field_1").fill_null("").str.slice(0, 3).str.pad_end(3, "0")
    exact = pl.col("field_0").cast(pl.Int64) * 1000 + frac.cast(pl.Int64) * pl.when(
        pl.col("field_0").str.starts_with("-")).then(-1).otherwise(1)
    approx = (pl.col("t").cast(pl.Float64, strict=False) * 1000).round().cast(pl.Int64)
    return frame.select(pl.when(pl.col("is_plain")).then(exact).otherwise(approx)).to_series()
