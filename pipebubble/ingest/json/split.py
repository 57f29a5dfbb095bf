"""Splitting a Chrome-trace JSON object into its header and the bytes of its ``traceEvents`` array.

The quick split finds the array's key near the start and its closing bracket near the end without parsing
the events (they are verified as their blocks decode); the full split decodes the whole document, and for
a document cut off mid-write keeps what precedes the array as the header. The header's own fields are
decoded and checked by ``header``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.json import mend
from pipebubble.ingest.json.header import header_dict

_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
#: A baseTimeNanoseconds written whole: its number ends where a comma, a brace or whitespace at the cut follows.
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(-?\d+)(?:\s*[,}]|\s+\Z)')
_NON_SPACE = re.compile(rb"\S")
_NOT_ASCII = bytes(range(0x80, 0x100))
_ANY = msgspec.json.Decoder(msgspec.Raw)
#: The events array's closing bracket is looked for this far from the end, among this many brackets; of
#: those ``,`` or ``}`` follows, so many have the text after them peeked at (this many bytes), and at most
#: so many of those are checked by decoding the header and the whole trailer.
_TRAILER_BYTES = 64 << 20
_CLOSE_SCANS = 1 << 16
_PEEKS, _PEEK_BYTES = 1024, 4096
_CLOSE_TRIES = 8


class _Header(msgspec.Struct):
    """Header fields kept raw: each is decoded and checked on its own (``header``)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")
    schemaVersion: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: msgspec.Raw = msgspec.Raw(b"")


_HEADER = msgspec.json.Decoder(_Header)


def split_quick(path: Path, data, start: int, end: int, below: int | None = None) -> tuple[tuple, int, int] | None:
    """Find ``traceEvents: [...]`` without parsing the whole document: the key near the start, the closing
    bracket near the end, checked by decoding the header and trailer around an empty array. The array's
    contents are verified as its blocks decode (``whole`` None marks it unverified).

    Writers other than torch put more after the array (metadata with arrays, strings full of brackets):
    a bracket after which the next few KB cannot be the document's rest is passed over without a decode.
    ``below``: only brackets before it (the one found before was not the array's end)."""
    match = _ARRAY_KEY.search(data, start, min(end, start + (64 << 20)))
    if match is None:
        return None
    floor = max(match.end(), end - _TRAILER_BYTES)
    brackets = itertools.islice(_brackets(data, floor, end, end if below is None else below), _PEEKS)
    for close in itertools.islice((c for c in brackets if _may_close(data, c, end)), _CLOSE_TRIES):
        text = b"".join((data[start : match.start()], b'"traceEvents": []', data[close + 1 : end]))
        try:
            return header_dict(path, _decode_header(text)), match.end(), close
        except msgspec.DecodeError as exc:
            if "truncated" not in str(exc):  # damage, or not the array's end: not a trailer cut off
                continue
        try:
            return _cut_trailer(path, data, start, match, close), match.end(), close
        except msgspec.DecodeError:
            continue
    return None


def _cut_trailer(path: Path, data, start: int, match: re.Match, close: int) -> tuple:
    """The header of a file cut off after its events array closed (in a trailer such as Kineto's, which
    holds traceName, displayTimeUnit and baseTimeNanoseconds): every event is there. A baseTimeNanoseconds
    written whole before the cut is kept; the warning says what was lost."""
    base = _BASE_TIME.search(data, close + 1, len(data))
    kept = b', "baseTimeNanoseconds": ' + base.group(1) if base else b""
    fields, warnings = header_dict(path, _decode_header(
        b"".join((data[start : match.start()], b'"traceEvents": []', kept, b"}"))))
    lost = f"{path}: trace cut off after its last event; {len(data) - close - 1} bytes after the events unreadable"
    if fields.get("base_time_ns") is None:
        lost += " (if they held its baseTimeNanoseconds, times stay on the profiler's own clock)"
    return fields, [*warnings, lost]


def _brackets(data, floor: int, end: int, stop: int) -> Iterator[int]:
    """Offsets of the ``]`` in ``data[floor:stop]`` that ``,`` or ``}`` follows, last first, among the last
    ``_CLOSE_SCANS`` of all."""
    for _ in range(_CLOSE_SCANS):
        close = data.rfind(b"]", floor, stop)
        if close < 0:
            return
        stop = close
        after = _NON_SPACE.search(data, close + 1, end)
        if after is not None and after.group() in (b",", b"}"):
            yield close


def _may_close(data, close: int, end: int) -> bool:
    """Whether the text after ``close`` may be what follows the events array: its first ``_PEEK_BYTES``
    read as the rest of an object, or as its rest cut off at the file's end right after a whole event."""
    stop = min(end, close + 1 + _PEEK_BYTES)
    rest = bytes(data[close + 1 : stop])
    if stop < end:
        rest = rest.rstrip(_NOT_ASCII)  # a character cut in two by the window is not damage
    text = b"".join((b'{"traceEvents":[]', rest))
    try:
        try:
            _ANY.decode(text)
        except RecursionError:  # nested past the decoder's limit: read its shape, the deep parts as null
            text = mend.flatten_deep(text, mend.MAX_DEPTH - 2)[0]
            _ANY.decode(text)
    except msgspec.DecodeError as exc:
        return (stop < end or _after_an_event(data, close)) and mend.is_truncation(exc, len(text) + 1)
    return True


def _after_an_event(data, close: int) -> bool:
    """Whether the ``]`` at ``close`` follows a whole event (or opens and closes an empty array): the only
    brackets after which a file cut off at its end may have its events whole and its trailer cut."""
    before = bytes(data[max(0, close - 64) : close]).rstrip()
    return before[-1:] in (b"}", b"[")


def _decode_header(text) -> _Header:
    """The header of a document (its events array may be emptied). Invalid UTF-8 and deep values are
    repaired only when decoding as it is fails, so a big document is not copied."""
    try:
        try:
            return _HEADER.decode(text)
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            fixed, replaced, _ = mend.fix_unicode(bytes(text))
            if not replaced:
                raise
            return _HEADER.decode(fixed)
    except RecursionError:
        flat = mend.flatten_deep(mend.fix_unicode(bytes(text))[0], mend.MAX_DEPTH - 2)[0]
        return _HEADER.decode(flat)


def split_object(path: Path, data, start: int, end: int) -> tuple[tuple, memoryview, int, bool]:
    """Header fields, the bytes inside ``traceEvents: [...]``, their offset in the file, and ``whole``:
    False for a cut-off file. A document damaged before its end is a TraceFormatError."""
    text = memoryview(data)[start:end]
    try:
        head = _decode_header(text)
    except msgspec.DecodeError as exc:
        if not mend.is_truncation(exc, len(text) + 1):
            offset = start + mend.error_offset(exc, len(text))
            raise TraceFormatError(path, f"malformed JSON at byte {offset}: {mend.one_line(exc)}") from None
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
