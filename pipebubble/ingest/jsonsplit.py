"""Splitting a Chrome-trace JSON object into its header and the bytes of its ``traceEvents`` array.

The quick split finds the array's key near the start and its closing bracket near the end without parsing
the events (they are verified as their blocks decode); the full split decodes the whole document, and for
a document cut off mid-write keeps what precedes the array as the header. The header's own fields are
decoded and checked by ``jsonheader``.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import jsonbytes
from pipebubble.ingest.jsonheader import header_dict

_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _Header(msgspec.Struct):
    """Header fields kept raw: each is decoded and checked on its own (``jsonheader``)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")
    schemaVersion: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: msgspec.Raw = msgspec.Raw(b"")


_HEADER = msgspec.json.Decoder(_Header)


def split_quick(path: Path, data, start: int, end: int) -> tuple[tuple, int, int] | None:
    """Find ``traceEvents: [...]`` without parsing the whole document: the key near the start, the closing
    bracket near the end, checked by decoding the header and trailer around an empty array. The array's
    contents are verified as its blocks decode (``whole`` None marks it unverified)."""
    match = _ARRAY_KEY.search(data, start, min(end, start + (64 << 20)))
    if match is None:
        return None
    stop, floor = end, max(match.end(), end - (1 << 20))
    for _ in range(4):
        close = data.rfind(b"]", floor, stop)
        if close < 0:
            return None
        text = b"".join((data[start : match.start()], b'"traceEvents": []', data[close + 1 : end]))
        try:
            head = _decode_header(text)
            return header_dict(path, head), match.end(), close
        except msgspec.DecodeError:
            stop = close
    return None


def _decode_header(text) -> _Header:
    """The header of a document (its events array may be emptied). Invalid UTF-8 and deep values are
    repaired only when decoding as it is fails, so a big document is not copied."""
    try:
        try:
            return _HEADER.decode(text)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            fixed, replaced, _ = jsonbytes.fix_unicode(bytes(text))
            if not replaced:
                raise
            return _HEADER.decode(fixed)
    except RecursionError:
        flat = jsonbytes.flatten_deep(jsonbytes.fix_unicode(bytes(text))[0], jsonbytes.MAX_DEPTH - 2)[0]
        return _HEADER.decode(flat)


def split_object(path: Path, data, start: int, end: int) -> tuple[tuple, memoryview, int, bool]:
    """Header fields, the bytes inside ``traceEvents: [...]``, their offset in the file, and ``whole``:
    False for a cut-off file. A document damaged before its end is a TraceFormatError."""
    text = memoryview(data)[start:end]
    try:
        head = _decode_header(text)
    except msgspec.DecodeError as exc:
        if not jsonbytes.is_truncation(exc, len(text) + 1):
            offset = start + jsonbytes.error_offset(exc, len(text))
            raise TraceFormatError(path, f"malformed JSON at byte {offset}: {jsonbytes.one_line(exc)}") from None
        head = None
    match = _ARRAY_KEY.search(data, start, end)
    if head is not None:
        raw = memoryview(head.traceEvents)
        if not raw.nbytes:
            raise TraceFormatError(path, "JSON object without a 'traceEvents' array")
        if raw[:1] != b"[" or raw[-1:] != b"]":
            raise TraceFormatError(path, "'traceEvents' is not an array")
        return header_dict(path, head), raw[1:-1], match.end() if match else 0, True
    if match is None:
        raise TraceFormatError(path, "JSON cut off before any 'traceEvents' array")
    try:
        head = _decode_header(data[start : match.start()] + b'"traceEvents": []}')
    except msgspec.DecodeError:
        head = _Header()
    return header_dict(path, head), memoryview(data)[match.end() : end], match.end(), False
