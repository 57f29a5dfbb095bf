"""Decode Chrome-trace JSON (torch.profiler/Kineto writes this format too) into columns.

The ``traceEvents`` array is cut into blocks at event boundaries and each block is decoded with a typed
msgspec decoder that reads only the fields we use; a block's Python objects are dropped as soon as its
columns are built, so memory stays near the size of the file. A file cut off mid-write is read up to its
last whole event.
"""

from __future__ import annotations

import gzip
import mmap
import re
import tempfile
import zlib
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
from pipebubble.ingest.jsonevents import COLUMNS, decode_block

BLOCK_BYTES = 16 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


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
        yield Opened(*_gunzip(path))
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=scratch, suffix=".json") as out:
        warning = _gunzip_to(path, out)
        out.flush()
        yield Opened(mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ), warning, Path(out.name))


def _gunzip(path: Path) -> tuple[bytes, str | None]:
    raw = path.read_bytes()
    try:
        return gzip.decompress(raw), None
    except (EOFError, zlib.error, OSError):
        pass
    try:  # a stream cut short: what it holds, up to the cut
        data = zlib.decompressobj(wbits=31).decompress(raw)
    except zlib.error as exc:
        raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None
    if not data:
        raise TraceFormatError(path, "corrupt gzip data (nothing could be decompressed)")
    return data, _cut_warning(path, len(data))


def _gunzip_to(path: Path, out) -> str | None:
    """Stream-gunzip ``path`` into ``out`` in bounded memory; a warning when the stream was cut short."""
    inflate, written = zlib.decompressobj(wbits=31), 0
    with open(path, "rb") as fh:
        try:
            while chunk := fh.read(8 << 20):
                piece = inflate.decompress(chunk)
                out.write(piece)
                written += len(piece)
                while inflate.unused_data and inflate.eof:  # concatenated gzip members
                    rest, inflate = inflate.unused_data, zlib.decompressobj(wbits=31)
                    piece = inflate.decompress(rest)
                    out.write(piece)
                    written += len(piece)
        except zlib.error as exc:
            if not written:
                raise TraceFormatError(path, f"corrupt gzip data ({exc})") from None
            return _cut_warning(path, written)
    if not written:
        raise TraceFormatError(path, "corrupt gzip data (nothing could be decompressed)")
    return None if inflate.eof else _cut_warning(path, written)


def _cut_warning(path: Path, size: int) -> str:
    return f"{path}: gzip stream cut off after {size} bytes of JSON"


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
    a plain file holding exactly ``data``, for workers to read their blocks from."""
    found = _NON_SPACE.search(data)
    start = found.start() if found else len(data)
    first = data[start : start + 1]
    if not first:
        raise TraceFormatError(path, "empty file")
    if first not in (b"[", b"{"):
        raise TraceFormatError(path, "not a JSON trace (expected '{' or '[' at the start)")
    if first == b"[":
        end = _content_end(data)
        whole = data[end - 1 : end] == b"]"
        return _decoded(path, data, {}, start + 1, end - 1 if whole else len(data), whole, pool, finish, disk)
    quick = _split_quick(data)
    if quick is not None:
        try:
            return _decoded(path, data, *quick, None, pool, finish, disk)
        except _Unverified:
            pass  # the quick split guessed the array's end wrong: validate the whole document instead
    header, region, whole = _split_object(path, data)
    return _decoded(path, region, header, 0, len(region), whole, None, finish)


def _content_end(data) -> int:
    """Length of ``data`` without trailing whitespace (looking only at its tail)."""
    end = len(data)
    while end > 0:
        tail = data[max(0, end - 4096) : end].rstrip()
        if tail:
            return max(0, end - 4096) + len(tail)
        end -= 4096
    return 0


class _Unverified(Exception):
    """A quickly located ``traceEvents`` array did not decode to its end."""


def _decoded(
    path: Path, data, header: dict, start: int, end: int, whole: bool | None, pool, finish, disk=None
) -> Decoded:
    """Decode ``data[start:end]``, the inside of the events array."""
    on_disk = (disk, start) if pool is not None and disk is not None else None
    fn = finish(header) if finish else None
    blocks = _decode_region(path, memoryview(data)[start:end], whole, pool, on_disk, fn)
    unread = blocks.pop() if blocks and isinstance(blocks[-1], int) else 0
    phases: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for block in blocks:
        phases.update(block.phases)
        skipped.update(block.skipped)
    frames = [b.events for b in blocks]
    events = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=COLUMNS)
    spans = [b.spans for b in blocks if b.spans is not None]
    return Decoded(events, phases, header, unread, spans, skipped)


def _split_quick(data: bytes) -> tuple[dict[str, Any], int, int] | None:
    """Find ``traceEvents: [...]`` without parsing the whole document: the key near the start, the closing
    bracket near the end, checked by decoding the header and trailer around an empty array. The array's
    contents are verified as its blocks decode (``whole`` None marks it unverified)."""
    match = _ARRAY_KEY.search(data, 0, min(len(data), 64 << 20))
    if match is None:
        return None
    end, floor = len(data), max(match.end(), len(data) - (1 << 20))
    for _ in range(4):
        close = data.rfind(b"]", floor, end)
        if close < 0:
            return None
        try:
            head = _HEADER.decode(b"".join((data[: match.start()], b'"traceEvents": []', data[close + 1 :])))
            return _header_dict(head), match.end(), close
        except _DECODE_ERRORS:
            end = close
    return None


def _split_object(path: Path, data: bytes) -> tuple[dict[str, Any], memoryview, bool]:
    """Header fields and the bytes inside ``traceEvents: [...]``; ``whole`` is False for a cut-off file."""
    try:
        head = _HEADER.decode(data)
    except _DECODE_ERRORS:
        head = None
    if head is not None:
        raw = memoryview(head.traceEvents)
        if not raw.nbytes:
            raise TraceFormatError(path, "JSON object without a 'traceEvents' array")
        if raw[:1] != b"[" or raw[-1:] != b"]":
            raise TraceFormatError(path, "'traceEvents' is not an array")
        return _header_dict(head), raw[1:-1], True
    match = _ARRAY_KEY.search(data)
    if match is None:
        raise TraceFormatError(path, "not valid JSON and no 'traceEvents' array found")
    try:
        head = _HEADER.decode(data[: match.start()] + b'"traceEvents": []}')
    except _DECODE_ERRORS:
        head = _Header()
    return _header_dict(head), memoryview(data)[match.end() :], False


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


def _decode_region(
    path: Path, region: memoryview, whole: bool | None, pool: Executor | None, on_disk: tuple | None, fn
) -> list:
    """Decode the array body block by block: the blocks, then the count of unreadable bytes when there are
    any.

    A block that fails to decode usually means its boundary sat inside a string or nested value: it is
    joined to the next block and tried again. In a cut-off file (``whole`` False) the last block is read up
    to its last whole event.
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
        results = [_try_block(b"".join((b"[", region[a:b], b"]")), fn) for a, b in cuts]
    blocks: list = []
    i = 0
    while i < len(cuts):
        if not isinstance(results[i], Exception):
            blocks.append(results[i])
            i += 1
            continue
        start, j = cuts[i][0], i
        while isinstance(results[i], Exception) and j + 1 < len(cuts) and j - i < _MAX_EXTENSIONS:
            j += 1
            results[i] = _try_block(b"".join((b"[", region[start : cuts[j][1]], b"]")), fn)
        if not isinstance(results[i], Exception):
            blocks.append(results[i])
            i = j + 1
            continue
        if whole is None:
            raise _Unverified
        if isinstance(results[i], msgspec.ValidationError):
            raise TraceFormatError(path, f"trace events of the wrong shape: {results[i]}")
        if whole or j + 1 < len(cuts):
            raise TraceFormatError(path, f"malformed trace events after byte {start}: {results[i]}")
        end = cuts[j][1]
        good = _last_whole_prefix(region, start, end, _error_offset(results[i], end - start))
        if good is None:
            raise TraceFormatError(path, f"malformed trace event after byte {start}: {results[i]}")
        if good > start:
            blocks.append(_block(b"".join((b"[", region[start:good], b"]")), fn))
        return [*blocks, len(region) - good]
    return blocks


def _try_file_block(path: str, offset: int, length: int, fn: Finish | None = None) -> Block | Exception:
    """A worker reads its own block from the file: only offsets cross the process boundary."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return _try_block(b"".join((b"[", fh.read(length), b"]")), fn)


def _try_block(block: bytes, fn: Finish | None = None) -> Block | Exception:
    try:
        return _block(block, fn)
    except msgspec.DecodeError as exc:  # ValidationError included
        return exc


def _block(block: bytes, fn: Finish | None) -> Block:
    events, phases = decode_block(block)
    if fn is None:
        return Block(events, phases)
    rest, spans, skipped = fn(events)
    return Block(rest, phases, spans, skipped)


def _cuts(region: memoryview) -> list[tuple[int, int]]:
    """(start, end) of blocks of about BLOCK_BYTES, each ending at a possible event boundary."""
    cuts, pos, end = [], 0, len(region)
    while pos < end and _NON_SPACE.search(region, pos):
        cut = _next_boundary(region, pos + BLOCK_BYTES, end)
        cuts.append((pos, cut))
        pos = cut + 1
    return cuts


_MAX_EXTENSIONS = 8
_NON_SPACE = re.compile(rb"\S")
_MAX_TAIL_TRIES = 64
_BYTE = re.compile(r"\(byte (\d+)\)")


def _error_offset(exc: msgspec.DecodeError, length: int) -> int:
    """Where in the block body the decoder gave up (the end, for truncated input)."""
    match = _BYTE.search(str(exc))
    return min(length, int(match.group(1))) if match else length


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


def _last_whole_prefix(region: memoryview, pos: int, cut: int, failed_at: int) -> int | None:
    """The end of the longest run of whole events in ``region[pos:cut]`` before the decoder failed."""
    text = region[pos:cut].tobytes()
    ends = [m.start() + 1 for m in _BOUNDARY.finditer(text, 0, failed_at + 1)]
    closing = text.rfind(b"}", 0, failed_at + 1)
    candidates = sorted({*ends[-_MAX_TAIL_TRIES:], closing + 1} - {0}, reverse=True)
    for end in candidates[:_MAX_TAIL_TRIES]:
        try:
            _PROBE.decode(b"[" + text[:end] + b"]")
            return pos + end
        except _DECODE_ERRORS:
            continue
    return pos if text.lstrip()[:1] in (b"{", b"") else None
