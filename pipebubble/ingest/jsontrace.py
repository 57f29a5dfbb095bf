"""Decode Chrome-trace JSON (torch.profiler/Kineto writes this format too) into columns.

The ``traceEvents`` array is cut into blocks at event boundaries and each block is decoded with a typed
msgspec decoder that reads only the fields we use; a block's Python objects are dropped as soon as its
columns are built, so memory stays near the size of the file. A file cut off mid-write is read up to its
last whole event.
"""

from __future__ import annotations

import mmap
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import gunzip, jsonbytes
from pipebubble.ingest.jsonevents import COLUMNS, BlockError, decode_block
from pipebubble.ingest.jsonheader import header_dict

BLOCK_BYTES = 16 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _Header(msgspec.Struct):
    """Header fields kept raw: each is decoded and checked on its own (``jsonheader``)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: msgspec.Raw = msgspec.Raw(b"")
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw(b"")
    schemaVersion: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: msgspec.Raw = msgspec.Raw(b"")


_HEADER = msgspec.json.Decoder(_Header)
_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
_PROBE = msgspec.json.Decoder(list[msgspec.Raw])  # syntax only: is this prefix whole events?


@dataclass
class Block:
    """One decoded block: its event columns (what ``finish`` left of them), phase counts, and what ``finish``
    made of it in the process that decoded it (spans, counts of events not kept)."""

    events: pl.DataFrame
    phases: Counter[str]
    spans: pl.DataFrame | None = None
    skipped: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)


#: Per-block work run where the block was decoded: events in, (events left, spans, skipped counts) out.
Finish = Callable[[pl.DataFrame], tuple[pl.DataFrame, pl.DataFrame, Counter]]


@dataclass
class Decoded:
    """Raw event columns of one file plus its header and what could not be read."""

    events: pl.DataFrame
    phases: Counter[str] = field(default_factory=Counter)
    header: dict[str, Any] = field(default_factory=dict)
    unread_bytes: int = 0
    spans: list[pl.DataFrame] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)


#: Gzipped traces bigger than this are gunzipped to a scratch file rather than into memory.
GUNZIP_TO_DISK = 16 << 20


@dataclass
class Opened:
    """A trace's JSON text (``data``), a warning when a gzip stream was cut short, and ``disk``: a plain file
    holding exactly ``data`` (the trace itself, or its gunzipped copy) that workers can read blocks from."""

    data: bytes | mmap.mmap
    warning: str | None = None
    disk: Path | None = None


@contextmanager
def opened(path: Path, scratch: Path | None = None) -> Iterator[Opened]:
    """Open a trace for decoding. A plain file is memory-mapped (pages are read as blocks decode, never
    copied into this process's memory); a big gzipped one is gunzipped in a stream into ``scratch`` (never
    beside the input) and mapped the same way; a small one is gunzipped in memory."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
        if not magic:
            yield Opened(b"")
            return
        if magic != b"\x1f\x8b":
            # Not closed explicitly: views of the map may outlive decoding (e.g. in a kept exception); it
            # closes when the last one goes.
            yield Opened(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), None, path)
            return
    if scratch is None or path.stat().st_size < GUNZIP_TO_DISK:
        yield Opened(*gunzip.in_memory(path))
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=scratch, suffix=".json") as out:
        warning = gunzip.inflate(path, gunzip.file_chunks(path), out.write)
        out.flush()
        yield Opened(mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ), warning, Path(out.name))


def decode(
    path: Path,
    data: bytes,
    pool: Executor | None = None,
    finish: Callable[[dict], Finish | None] | None = None,
    disk: Path | None = None,
) -> Decoded:
    """Split ``data`` into header and event blocks and decode the blocks (on ``pool`` when given: its
    workers read their blocks from the file itself, so only offsets cross process boundaries). ``finish``
    makes, from the header, per-block work to run where each block is decoded (it must pickle). ``disk``:
    a plain file holding exactly ``data``, for workers to read their blocks from.

    A file that ends properly (``]`` or ``]}`` last) but does not parse is a TraceFormatError naming the
    byte where parsing failed, whatever the block size; a file that ends mid-event is read up to its last
    whole event (``unread_bytes``), unless it is also damaged before its end."""
    found = _NON_SPACE.search(data)
    start = found.start() if found else len(data)
    first = data[start : start + 1]
    if not first:
        raise TraceFormatError(path, "empty file")
    if first not in (b"[", b"{"):
        raise TraceFormatError(path, "not a JSON trace (expected '{' or '[' at the start)")
    end = _content_end(data)
    if first == b"[":
        whole = end - start >= 2 and data[end - 1 : end] == b"]"
        return _decoded(path, data, ({}, []), start + 1, end - 1 if whole else end, whole, pool, finish, disk)
    quick = _split_quick(path, data, start, end)
    if quick is not None:
        try:
            return _decoded(path, data, *quick, None, pool, finish, disk)
        except _Unverified:
            pass  # the quick split guessed the array's end wrong: validate the whole document instead
    header, region, offset, whole = _split_object(path, data, start, end)
    return _decoded(path, region, header, 0, len(region), whole, None, finish, None, offset)


def _content_end(data) -> int:
    """Length of ``data`` without trailing whitespace (looking only at its tail)."""
    end = len(data)
    while end > 0:
        tail = bytes(data[max(0, end - 4096) : end]).rstrip()
        if tail:
            return max(0, end - 4096) + len(tail)
        end -= 4096
    return 0


class _Unverified(Exception):
    """A quickly located ``traceEvents`` array did not decode to its end."""


def _decoded(
    path: Path, data, header: tuple, start: int, end: int, whole: bool | None, pool, finish, disk=None, at=None
) -> Decoded:
    """Decode ``data[start:end]``, the inside of the events array (at byte ``at`` of the file, default
    ``start``)."""
    fields, warnings = header
    on_disk = (disk, start) if pool is not None and disk is not None else None
    fn = finish(fields) if finish else None
    region = memoryview(data)[start:end]
    blocks = _decode_region(path, region, start if at is None else at, whole, pool, on_disk, fn)
    unread = blocks.pop() if blocks and isinstance(blocks[-1], int) else 0
    phases: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    for block in blocks:
        phases.update(block.phases)
        skipped.update(block.skipped)
        repairs.update(block.repairs)
    frames = [b.events for b in blocks]
    events = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=COLUMNS)
    spans = [b.spans for b in blocks if b.spans is not None]
    return Decoded(events, phases, fields, unread, spans, skipped, repairs, warnings)


def _split_quick(path: Path, data, start: int, end: int) -> tuple[tuple, int, int] | None:
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


def _split_object(path: Path, data, start: int, end: int) -> tuple[tuple, memoryview, int, bool]:
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


def _decode_region(
    path: Path, region: memoryview, at: int, whole: bool | None, pool: Executor | None, on_disk: tuple | None, fn
) -> list:
    """Decode the array body (at byte ``at`` of the file) block by block: the blocks, then the count of
    unreadable bytes when there are any.

    A block that fails to decode usually means its boundary sat inside a string or nested value: it is
    joined to the next blocks (twice as many each try, up to the end) and tried again. What still fails is
    damage (a TraceFormatError naming its byte) unless the file is cut off (``whole`` False) and the
    failure is its end: then it is read up to its last whole event.
    """
    cuts = _cuts(region)
    if pool is not None and on_disk is not None and len(cuts) > 1:
        disk, base = on_disk
        jobs = [pool.submit(_try_file_block, str(disk), base + a, b - a, fn) for a, b in cuts]
        results: list = [None] * len(cuts)
        # While the workers start, this process decodes from the far end the blocks none has taken yet.
        for j in reversed(range(len(cuts))):
            if not jobs[j].cancel():
                break
            a, b = cuts[j]  # read, not mapped: mapped pages would stay in this process's memory
            results[j] = _try_file_block(str(disk), base + a, b - a, fn)
        results = [r if r is not None else job.result() for r, job in zip(results, jobs, strict=True)]
    else:
        results = [_try_block(_wrapped(region, a, b), fn) for a, b in cuts]
    blocks: list = []
    i = 0
    while i < len(cuts):
        start, j, step = cuts[i][0], i, 1
        while isinstance(results[i], BlockError) and j + 1 < len(cuts):
            j, step = min(len(cuts) - 1, j + step), step * 2
            results[i] = _try_block(_wrapped(region, start, cuts[j][1]), fn)
        if not isinstance(results[i], BlockError):
            blocks.append(results[i])
            i = j + 1
            continue
        if whole is None:
            raise _Unverified
        error, end = results[i], cuts[j][1]
        if whole or not error.truncated:
            first = _NON_SPACE.search(region, start).start()
            where = at + (end if error.offset is None else first + max(0, error.offset - 1))
            raise TraceFormatError(path, f"malformed JSON at byte {where}: {error.message}")
        good = _last_whole_prefix(region, start, end)
        if good is None:
            raise TraceFormatError(path, f"malformed trace event at byte {at + start}")
        if good > start:
            blocks.append(_block(_wrapped(region, start, good), fn))
        # unread: from the first byte of the partial event, whichever block it was found in
        return [*blocks, len(region) - _SEPARATOR.match(region, good).end()]
    return blocks


def _wrapped(region: memoryview, start: int, end: int) -> bytes:
    """``region[start:end]`` as a JSON array, without the whitespace around it (which may be most of it)."""
    found = _NON_SPACE.search(region, start, end)
    if found is None:
        return b"[]"
    return b"".join((b"[", region[found.start() : _content_end(region[:end])], b"]"))


def _try_file_block(path: str, offset: int, length: int, fn: Finish | None = None) -> Block | BlockError:
    """A worker reads its own block from the file: only offsets cross the process boundary."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        text = fh.read(length)
    return _try_block(_wrapped(memoryview(text), 0, len(text)), fn)


def _try_block(block: bytes, fn: Finish | None = None) -> Block | BlockError:
    try:
        return _block(block, fn)
    except BlockError as exc:
        return exc


def _block(block: bytes, fn: Finish | None) -> Block:
    decoded = decode_block(block)
    if fn is None:
        return Block(decoded.frame, decoded.phases, repairs=decoded.repairs)
    rest, spans, skipped = fn(decoded.frame)
    return Block(rest, decoded.phases, spans, skipped, decoded.repairs)


def _cuts(region: memoryview) -> list[tuple[int, int]]:
    """(start, end) of blocks of about BLOCK_BYTES, each ending at a possible event boundary."""
    cuts, pos, end = [], 0, len(region)
    while pos < end and (found := _NON_SPACE.search(region, pos)):
        pos = found.start()
        cut = _next_boundary(region, pos + BLOCK_BYTES, end)
        cuts.append((pos, cut))
        pos = cut + 1
    return cuts


_NON_SPACE = re.compile(rb"\S")
_SEPARATOR = re.compile(rb"\s*,?\s*")
_MAX_TAIL_TRIES = 64


def _next_boundary(region: memoryview, target: int, end: int) -> int:
    """Offset of the comma after the first ``}`` at or past ``target`` that may end an event, else ``end``."""
    window = 1 << 20
    while target < end:
        chunk = region[target : min(end, target + window)].tobytes()
        match = _BOUNDARY.search(chunk)
        if match:
            return target + chunk.index(b",", match.start())
        target += window - 64
    return end


def _last_whole_prefix(region: memoryview, pos: int, cut: int) -> int | None:
    """The end of the longest run of whole events in ``region[pos:cut]``, whose end is cut off.

    The last few possible event ends are tried first (the usual cut: mid-way through the last event).
    When none reads, the damage is further back: the event ends found by following strings and brackets
    are searched by halving, so the same prefix is found whatever block the search starts in."""
    text = region[pos:cut].tobytes()
    ends = [m.start() + 1 for m in _BOUNDARY.finditer(text)]
    closing = text.rfind(b"}")
    candidates = sorted({*ends[-_MAX_TAIL_TRIES:], closing + 1} - {0}, reverse=True)
    for end in candidates[:_MAX_TAIL_TRIES]:
        if _syntax_ok(b"[" + text[:end] + b"]"):
            return pos + end
    below = [end for end in jsonbytes.event_ends(text) if end < min(candidates, default=len(text) + 1)]
    low, high = 0, len(below)  # below[:low] read, below[high:] do not
    while low < high:
        mid = (low + high) // 2
        if _syntax_ok(b"[" + text[: below[mid]] + b"]"):
            low = mid + 1
        else:
            high = mid
    if low:
        return pos + below[low - 1]
    return pos if text.lstrip()[:1] in (b"{", b"") else None


def _syntax_ok(text: bytes) -> bool:
    """Whether ``text`` is valid JSON (deep values included)."""
    text = jsonbytes.fix_unicode(text)[0]
    try:
        try:
            _PROBE.decode(text)
        except RecursionError:
            _PROBE.decode(jsonbytes.flatten_deep(text)[0])
        return True
    except _DECODE_ERRORS:
        return False
