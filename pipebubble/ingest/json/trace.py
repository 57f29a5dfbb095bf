"""Decode Chrome-trace JSON (torch.profiler/Kineto writes this format too) into columns.

The ``traceEvents`` array is cut into blocks at event boundaries and each block is decoded with a typed
msgspec decoder that reads only the fields we use; a block's Python objects are dropped as soon as its
columns are built, so memory stays near the size of the file. A file cut off mid-write is read up to its
last whole event.

This module is the entry point: opening a trace (memory-mapped, or gunzipped by ``gunzip``) and putting the
pieces together. Splitting the header from the events is ``split``; cutting the events into blocks,
decoding them and recovering a cut-off end is ``blocks``; one block's events to columns is
``events``. The knobs ``BLOCK_BYTES`` and ``GUNZIP_TO_DISK`` live here and are read at call time.
"""

from __future__ import annotations

import mmap
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from pipebubble import budget
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import gunzip
from pipebubble.ingest.json.blocks import NON_SPACE, Finish, Unverified, content_end, decode_region
from pipebubble.ingest.json.events import COLUMNS
from pipebubble.ingest.json.split import split_object, split_quick

__all__ = ["BLOCK_BYTES", "GUNZIP_TO_DISK", "Decoded", "Finish", "Opened", "decode", "opened"]

#: Bytes of JSON text per decode block, at most (read at call time, so patching it here takes effect; a
#: smaller memory budget makes blocks smaller: ``budget.block_bytes``). A block has a fixed cost (its queries,
#: its spilled part's Parquet columns): on 2 cores 16 MB took 8% less CPU than 8 MB on a 400 MB trace in
#: either layout and 14% less wall time on a 2.5 GB one; 32 MB gained nothing more.
BLOCK_BYTES = 16 << 20
#: Gzipped traces bigger than this are gunzipped to a scratch file rather than into memory.
GUNZIP_TO_DISK = 16 << 20


@dataclass
class Decoded:
    """Raw event columns of one file plus its header and what could not be read; ``events`` is a plan of
    them all when each block's work was put off (``chrome.decode_pending``)."""

    events: pl.DataFrame | pl.LazyFrame
    phases: Counter[str] = field(default_factory=Counter)
    header: dict[str, Any] = field(default_factory=dict)
    unread_bytes: int = 0
    spans: list[pl.DataFrame] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    memory: list[pl.DataFrame] = field(default_factory=list)  # each block's allocator events


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


#: Guesses of the events array's end the quick split makes before the whole document is validated (a guess
#: is wrong where a ``]`` inside the trailer, in a string or a nested array, reads as the array's end: the
#: rest after it parses as an object's rest, or as one cut off at the file's end).
QUICK_TRIES = 3


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
    found = NON_SPACE.search(data)
    start = found.start() if found else len(data)
    first = data[start : start + 1]
    if not first:
        raise TraceFormatError(path, "empty file")
    if first not in (b"[", b"{"):
        raise TraceFormatError(path, "not a JSON trace (expected '{' or '[' at the start)")
    end = content_end(data)
    if first == b"[":
        whole = end - start >= 2 and data[end - 1 : end] == b"]"
        return _decoded(path, data, ({}, []), start + 1, end - 1 if whole else end, whole, pool, finish, disk)
    below = None
    for _ in range(QUICK_TRIES):
        quick = split_quick(path, data, start, end, below)
        if quick is None:
            break
        try:
            return _decoded(path, data, *quick, None, pool, finish, disk)
        except Unverified:
            below = quick[2]  # the quick split guessed the array's end wrong: try the brackets before it
    # none of them: validate the whole document instead
    header, region, offset, whole = split_object(path, data, start, end)
    return _decoded(path, region, header, 0, len(region), whole, None, finish, None, offset)


def _decoded(
    path: Path, data, header: tuple, start: int, end: int, whole: bool | None, pool, finish, disk=None, at=None
) -> Decoded:
    """Decode ``data[start:end]``, the inside of the events array (at byte ``at`` of the file, default
    ``start``)."""
    fields, warnings = header
    on_disk = (disk, start) if pool is not None and disk is not None else None
    fn = finish(fields) if finish else None
    region = memoryview(data)[start:end]
    block = budget.block_bytes(BLOCK_BYTES)  # smaller where the memory budget holds no bigger
    blocks = decode_region(path, region, start if at is None else at, whole, pool, on_disk, fn, block)
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
    memory = [b.memory for b in blocks if b.memory is not None and b.memory.height]
    return Decoded(events, phases, fields, unread, spans, skipped, repairs, warnings, memory)
