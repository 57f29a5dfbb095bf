"""The ``traceEvents`` array body cut into blocks at possible event boundaries, each block decoded (in a
process pool when given: workers read their block from the file, so only offsets cross), and a file cut
off mid-write read up to its last whole event.

Blocks are cut at a ``},{`` whose following text reads as events (a short probe decode): on one line
``},{`` also sits between nested objects and inside strings. A cut that still lands inside an event (a
nested value longer than the probe) makes a block that fails to decode: it is joined to the next ones and
tried again, so the result never depends on the block size or the layout. The block size comes from the
caller (``trace.BLOCK_BYTES``, read at call time).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import polars as pl

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.json import mend
from pipebubble.ingest.json.events import BlockError, decode_block

NON_SPACE = re.compile(rb"\S")
_SEPARATOR = re.compile(rb"\s*,?\s*")
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_MAX_TAIL_TRIES = 64
#: A possible cut is checked by decoding this much of the text after it, and at most this many possible
#: cuts past a block's target are checked before the first one is taken as it is.
_PROBE_BYTES = 64 << 10
_PROBE_TRIES = 16
_NOT_ASCII = bytes(range(0x80, 0x100))
_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError)
_PROBE = msgspec.json.Decoder(list[msgspec.Raw])  # syntax only: is this prefix whole events?


@dataclass
class Block:
    """One decoded block: its event columns (what ``finish`` left of them), phase counts, and what ``finish``
    made of it in the process that decoded it (spans, counts of events not kept, the files it wrote)."""

    events: pl.DataFrame | pl.LazyFrame
    phases: Counter[str]
    spans: pl.DataFrame | None = None
    skipped: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    written: list[str] = field(default_factory=list)
    memory: pl.DataFrame | None = None


#: Per-block work run where the block was decoded, called as ``fn(events, phases=...)``: the events (a frame,
#: or a plan for it to run) and the block's phase counts in; (events left, spans, skipped counts, files
#: written: a spilled block's Parquet part, allocator events or None) out. Work put off for a batch of files
#: (``chrome.decode_pending``) gives the events back as a plan, and no spans.
Finish = Callable[..., tuple[pl.DataFrame, pl.DataFrame, Counter, list[str], pl.DataFrame | None]]


class Unverified(Exception):
    """A quickly located ``traceEvents`` array did not decode to its end."""


def content_end(data) -> int:
    """Length of ``data`` without trailing whitespace (looking only at its tail)."""
    end = len(data)
    while end > 0:
        tail = bytes(data[max(0, end - 4096) : end]).rstrip()
        if tail:
            return max(0, end - 4096) + len(tail)
        end -= 4096
    return 0


def decode_region(
    path: Path,
    region: memoryview,
    at: int,
    whole: bool | None,
    pool: Executor | None,
    on_disk: tuple | None,
    fn,
    block_bytes: int,
) -> list:
    """Decode the array body (at byte ``at`` of the file) in blocks of about ``block_bytes``: the blocks,
    then the count of unreadable bytes when there are any.

    A block that fails to decode usually means its boundary sat inside a string or nested value: it is
    joined to the next blocks (twice as many each try, up to the end) and tried again. What still fails is
    damage (a TraceFormatError naming its byte) unless the file is cut off (``whole`` False) and the
    failure is its end: then it is read up to its last whole event. ``whole`` None (the array was located
    without being verified) raises Unverified instead.
    """
    cuts = _cuts(region, block_bytes)
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
            _discard(results[i + 1 : j + 1])  # decoded alone too, before the join
            i = j + 1
            continue
        if whole is None:
            _discard(results)  # every block kept so far is among them
            raise Unverified
        error, end = results[i], cuts[j][1]
        if whole or not error.truncated:
            first = NON_SPACE.search(region, start).start()
            where = at + (end if error.offset is None else first + max(0, error.offset - 1))
            raise TraceFormatError(path, f"malformed JSON at byte {where}: {error.message}")
        good = _last_whole_prefix(region, start, end)
        if good is None:
            raise TraceFormatError(path, f"malformed trace event at byte {at + start}")
        _discard(results[i + 1 : j + 1])
        if good > start:
            blocks.append(_block(_wrapped(region, start, good), fn))
        # unread: from the first byte of the partial event, whichever block it was found in
        return [*blocks, len(region) - _SEPARATOR.match(region, good).end()]
    return blocks


def _wrapped(region: memoryview, start: int, end: int) -> bytes:
    """``region[start:end]`` as a JSON array, without the whitespace around it (which may be most of it)."""
    found = NON_SPACE.search(region, start, end)
    if found is None:
        return b"[]"
    return b"".join((b"[", region[found.start() : content_end(region[:end])], b"]"))


def _try_file_block(path: str, offset: int, length: int, fn: Finish | None = None) -> Block | BlockError:
    """A worker reads its own block from the file: only offsets cross the process boundary. The text is read
    straight in between the array's brackets (whitespace inside them is still JSON), so it is not copied
    again; a block that does not decode that way is decoded as ``_wrapped`` gives it, so whether it reads,
    and where its error is, never depend on the process that decoded it."""
    buffer = bytearray(length + 2)
    with open(path, "rb") as fh:
        fh.seek(offset)
        got = fh.readinto(memoryview(buffer)[1 : length + 1])
    buffer[0], buffer[got + 1] = ord("["), ord("]")
    del buffer[got + 2 :]
    result = _try_block(buffer, fn)
    if not isinstance(result, BlockError):
        return result
    text = memoryview(buffer)[1 : got + 1]
    return _try_block(_wrapped(text, 0, len(text)), fn)


def _try_block(block: bytes | bytearray, fn: Finish | None = None) -> Block | BlockError:
    try:
        return _block(block, fn)
    except BlockError as exc:
        return exc


def _block(block: bytes | bytearray, fn: Finish | None) -> Block:
    decoded = decode_block(block, lazy=fn is not None)
    if fn is None:
        return Block(decoded.frame, decoded.phases, repairs=decoded.repairs)
    rest, spans, skipped, written, memory = fn(decoded.frame, phases=decoded.phases)
    return Block(rest, decoded.phases, spans, skipped, decoded.repairs, written, memory)


def _discard(results: list) -> None:
    """Blocks decoded but not used (read again joined to the block before them, or all of them when the
    document is decoded again another way): the files they wrote go, so no span is written twice."""
    for result in results:
        for written in getattr(result, "written", ()):
            Path(written).unlink(missing_ok=True)


def _cuts(region: memoryview, block_bytes: int) -> list[tuple[int, int]]:
    """(start, end) of blocks of about ``block_bytes``, each ending at a possible event boundary."""
    cuts, pos, end = [], 0, len(region)
    while pos < end and (found := NON_SPACE.search(region, pos)):
        pos = found.start()
        cut = _next_boundary(region, pos + block_bytes, end)
        cuts.append((pos, cut))
        pos = cut + 1
    return cuts


def _next_boundary(region: memoryview, target: int, end: int) -> int:
    """Offset of the comma of the first ``},{`` at or past ``target`` after which the text reads as events,
    else of the first ``},{`` found there, else ``end``."""
    candidates = _separators(region, target, end)
    first = next(candidates, end)
    for comma in itertools.islice(itertools.chain([first], candidates), _PROBE_TRIES):
        if comma == end or _starts_events(region, comma + 1, end):
            return comma
    return first


def _separators(region: memoryview, target: int, end: int) -> Iterator[int]:
    """The comma's offset of every ``},{`` (whitespace allowed) at or past ``target``, in order, found a
    window at a time (windows overlap, so a separator across two is found once, in the second)."""
    window, overlap = 1 << 20, 64
    while target < end:
        stop = min(end, target + window)
        chunk = region[target:stop].tobytes()
        last = len(chunk) if stop == end else len(chunk) - overlap
        for match in _BOUNDARY.finditer(chunk):
            if match.start() >= last:
                break
            yield target + chunk.index(b",", match.start())
        target += last


def _starts_events(region: memoryview, pos: int, end: int) -> bool:
    """Whether ``region[pos:]`` reads as the start of the events array's rest (as a block's text must):
    whole events, then at most a cut-off one, within ``_PROBE_BYTES``. A ``},{`` between nested objects
    or inside a string is followed by text that does not: a bracket closing what the probe never opened,
    a key where a value belongs. Text is repaired as a block's would be; text too deep to probe counts as
    events (the block decode decides)."""
    stop = min(end, pos + _PROBE_BYTES)
    text = region[pos:stop].tobytes()
    if stop < end:
        text = text.rstrip(_NOT_ASCII)  # a character cut in two by the window is not damage
    probe = mend.fix_unicode(b"".join((b"[", text, b"]" if stop == end else b"")))[0]
    try:
        _PROBE.decode(probe)
    except RecursionError:
        return True
    except _DECODE_ERRORS as exc:
        return mend.is_truncation(exc, len(probe) + (stop < end))
    return True


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
    below = [end for end in mend.event_ends(text) if end < min(candidates, default=len(text) + 1)]
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
    text = mend.fix_unicode(text)[0]
    try:
        try:
            _PROBE.decode(text)
        except RecursionError:
            _PROBE.decode(mend.flatten_deep(text)[0])
        return True
    except _DECODE_ERRORS:
        return False
