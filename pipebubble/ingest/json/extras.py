"""Each event's own arguments and the trace's flow arrows, for ``pipebubble export`` only.

The span table keeps what the analysis computes with (ARCHITECTURE: arguments beyond its columns stay out of
the hot path). The export draws more, so it reads the JSON traces once more, here: the ``args`` object of every
complete, begin and async-begin event (kept as its JSON text: shapes, types, ids) and every flow event (``ph``
``s``/``t``/``f`` with its ``id`` and, for ``f``, ``bp``). Times go through ingest's own conversion
(``columns``) and the header's ``baseTimeNanoseconds``, so an event finds its span by source, thread, name,
start and end. Nsight reports carry nothing beyond the span columns; the export links their runtime calls and
GPU work by correlation id, as any trace's where its file draws no flow for them.

A block that does not decode (a file cut off mid-write, damage ingest already warned about) only loses its
events' arguments and flows here: the export goes on with the spans.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import msgspec
import polars as pl

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.json import mend
from pipebubble.ingest.json import trace as jsontrace
from pipebubble.ingest.json.blocks import NON_SPACE, content_end
from pipebubble.ingest.json.columns import build_frame, exact_ts
from pipebubble.ingest.json.split import split_object, split_quick
from pipebubble.options import Scale

#: Bytes of JSON text decoded at a time (a block's Python objects are dropped once its columns are built).
BLOCK_BYTES = 16 << 20
#: Bytes of trace files above which several are read on the executor's workers.
PARALLEL_BYTES = 64 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_TAIL_TRIES = 64
_NO_RAW = msgspec.Raw(b"")
ARGS_PHASES = ("X", "B", "b")
FLOW_PHASES = ("s", "t", "f")

ARGS_SCHEMA = {"source": pl.String, "ph": pl.String, "cat": pl.String, "pid": pl.Int64, "tid": pl.Int64,
               "name": pl.String, "start": pl.Int64, "end": pl.Int64, "args": pl.String}
FLOW_SCHEMA = {"source": pl.String, "ph": pl.String, "cat": pl.String, "id": pl.String, "pid": pl.Int64,
               "tid": pl.Int64, "ts": pl.Int64, "bp": pl.String}


@dataclass
class Extras:
    """``args``: one row per event with arguments or a category (``ARGS_SCHEMA``; ``end`` null for begin
    events). ``flows``: one row per flow event (``FLOW_SCHEMA``). ``warnings``: one line per file whose extras
    could not all be read."""

    args: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=ARGS_SCHEMA))
    flows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLOW_SCHEMA))
    warnings: list[str] = field(default_factory=list)


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = _NO_RAW  # its text: ingest reads epoch µs with a fraction exactly from it
    dur: float | None = None
    id: int | str | None = None
    bp: str | None = None
    args: msgspec.Raw = _NO_RAW


_EVENTS = msgspec.json.Decoder(list[_Event])
_ONE = msgspec.json.Decoder(_Event)
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def sources(spans: pl.DataFrame, files: list[Path]) -> dict[str, Path]:
    """The JSON trace file behind each ``source`` of the span table: the same path, else the same file resolved
    (a cached table names a file as it was first read), else the one file of that name."""
    by_path = {str(f): f for f in files}
    resolved = {f.resolve(): f for f in files}
    by_name: dict[str, list[Path]] = {}
    for f in files:
        by_name.setdefault(f.name, []).append(f)
    out: dict[str, Path] = {}
    for source in spans["source"].unique().drop_nulls().to_list():
        found = by_path.get(source) or resolved.get(Path(source).resolve())
        if found is None and len(by_name.get(Path(source).name, [])) == 1:
            found = by_name[Path(source).name][0]
        if found is not None and _is_json(found):
            out[source] = found
    return out


def _is_json(path: Path) -> bool:
    from pipebubble.ingest import readers

    return path.is_file() and readers.reader_for(path).name == "json"


def read(files: dict[str, Path], scale: Scale | None = None) -> Extras:
    """The arguments and flow events of each JSON trace (``{source: path}``), named by their source. Many
    bytes of traces are read on ``scale``'s executor, as ingest reads them; a few in this process (a pool's
    start would cost more than it saves)."""
    jobs = sorted(files.items())
    if not jobs:
        return Extras()
    names = [source for source, _ in jobs]
    work = [(str(path), i) for i, (_, path) in enumerate(jobs)]
    if len(jobs) > 1 and sum(_size(p) for _, p in jobs) > PARALLEL_BYTES:
        from pipebubble import executor

        done = executor.each(work, _read_job, scale or Scale(), names=names)
    else:
        done = [_read_job(path, i, names=names) for path, i in work]
    warnings = [line for (path, _), (_, _, lost, deep) in zip(work, done, strict=True)
                for line in _warnings(path, lost, deep)]
    return Extras(pl.concat([d[0] for d in done]), pl.concat([d[1] for d in done]), warnings)


def _warnings(path: str, lost: int, deep: bool) -> list[str]:
    """What one file's extras lost; a deep value is said in ingest's words (the export says each line once)."""
    return ([f"{path}: values nested too deep to decode were replaced by null"] if deep else []) + (
        [f"{path}: {lost} bytes of events unreadable: their arguments and flows left out"] if lost else [])


def _read_job(path: str, position: int, names: list[str], workers: int = 1) -> tuple:
    """One executor job: the file at ``path``, named ``names[position]``; a big gzipped one is gunzipped
    into a scratch folder of its own. A file that cannot be read again (changed or gone since ingest read it)
    loses its extras, not the export."""
    try:
        with tempfile.TemporaryDirectory(prefix="pipebubble-export-") as scratch:
            return _read(Path(path), names[position], Path(scratch))
    except (TraceFormatError, OSError):
        return pl.DataFrame(schema=ARGS_SCHEMA), pl.DataFrame(schema=FLOW_SCHEMA), _size(Path(path)), False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_file(path: Path, source: str, scratch: Path | None = None) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """One JSON trace's argument rows, flow rows and the bytes of events that could not be read (beyond the
    partial last event of a file cut off mid-write)."""
    return _read(path, source, scratch)[:3]


def _read(path: Path, source: str, scratch: Path | None) -> tuple[pl.DataFrame, pl.DataFrame, int, bool]:
    """``read_file``'s rows and bytes, and whether values nested too deep were replaced by null."""
    with jsontrace.opened(path, scratch) as trace:
        for region, base, last in _events_regions(path, trace.data):
            frames, lost, deep = _read_region(region)
            if lost.bytes and not last:
                continue
            unread = 0 if lost.tail else lost.bytes
            if not frames:
                break
            events = pl.concat(frames).with_columns(source=pl.lit(source), ts_ns=pl.col("ts_ns") + base)
            return _args(events), _flows(events), unread, deep
    return pl.DataFrame(schema=ARGS_SCHEMA), pl.DataFrame(schema=FLOW_SCHEMA), unread, deep


def _read_region(region: memoryview) -> tuple[list[pl.DataFrame], _Lost, bool]:
    frames, lost, deep = [], _Lost(0, True), False
    for block in _decoded(region):
        if isinstance(block, _Lost):
            lost = block
            continue
        events, flattened = block
        deep |= flattened
        if events:
            frames.append(_frame(events))
    return frames, lost, deep


def _events_regions(path: Path, data) -> Iterator[tuple[memoryview, int, bool]]:
    """The bytes inside the ``traceEvents`` array (or the top-level array), the header's time base, and
    whether no other guess follows. As in ingest, the quick split (the array's key near the start, its closing
    bracket near the end) comes first; when its region does not decode to the end (other arrays follow the
    events), the whole document is split."""
    found = NON_SPACE.search(data)
    start, end = (found.start() if found else len(data)), content_end(data)
    view = memoryview(data)
    if data[start : start + 1] == b"[":
        yield view[start + 1 : end - 1 if data[end - 1 : end] == b"]" else end], 0, True
        return
    quick = split_quick(path, data, start, end)
    if quick is not None:
        (header, _), first, close = quick
        yield view[first:close], header.get("base_time_ns") or 0, False
    (header, _), region, _, _ = split_object(path, data, start, end)
    yield region, header.get("base_time_ns") or 0, True


class _Lost(NamedTuple):
    """Bytes of events that did not decode; ``tail``: only the end of a file cut off mid-write (ingest
    already warns of it)."""

    bytes: int
    tail: bool


def _decoded(region: memoryview) -> Iterator[tuple[list[_Event], bool] | _Lost]:
    """The region's events, a block at a time; a block that fails to decode is joined to the next (its cut
    fell inside a string). The last block of a file cut off mid-write is read up to its last whole event; the
    bytes that never decode are given as their count."""
    pos, size = 0, BLOCK_BYTES
    while pos < len(region):
        cut = _boundary(region, pos + size)
        events = _decode(b"".join((b"[", region[pos:cut], b"]")))
        if events is not None:
            yield events
            pos, size = cut + 1, BLOCK_BYTES
        elif cut < len(region):
            size *= 2
        else:
            yield from _tail(region, pos)
            return


def _tail(region: memoryview, pos: int) -> Iterator[tuple[list[_Event], bool] | _Lost]:
    """The whole events before the end of ``region[pos:]``, found by trying its last event boundaries."""
    text = bytes(region[pos:])
    for match in list(_BOUNDARY.finditer(text))[::-1][:_TAIL_TRIES]:
        events = _decode(b"".join((b"[", text[: match.start() + 1], b"]")))
        if events is not None:
            yield events
            yield _Lost(len(text) - match.start() - 1, True)
            return
    yield _Lost(len(text), False)


def _boundary(region: memoryview, target: int) -> int:
    """Offset of the comma after the first ``}`` at or past ``target`` that may end an event, else the end."""
    match = _BOUNDARY.search(region, target) if target < len(region) else None
    if match is None:
        return len(region)
    return match.start() + bytes(region[match.start() : match.end()]).index(b",")


def _decode(block: bytes) -> tuple[list[_Event], bool] | None:
    """A block's events and whether values nested too deep for the decoder were replaced by null first (as
    ingest decodes them: ``mend.flatten_deep``); None when it is not JSON even with its text repaired."""
    for text in (block, None):
        if text is None:
            text = mend.fix_unicode(block)[0]
        try:
            try:
                return _events(text), False
            except RecursionError:
                return _events(mend.flatten_deep(text)[0]), True
        except msgspec.DecodeError:
            continue
    return None


def _events(text: bytes) -> list[_Event]:
    """The events of a JSON array; with an event of unexpected types, read event by event (those are left
    out). A value nested too deep raises RecursionError, from either decoder."""
    try:
        return _EVENTS.decode(text)
    except msgspec.ValidationError:
        pass
    events = []
    for raw in _RAWS.decode(text):
        try:
            events.append(_ONE.decode(raw))
        except (msgspec.DecodeError, RecursionError):
            pass
    return events


def _frame(events: list[_Event]) -> pl.DataFrame:
    """The kept events' columns, their times and ids converted exactly as ingest converts them."""
    kept = [e for e in events if e.ph in ARGS_PHASES or e.ph in FLOW_PHASES]
    texts = [bytes(e.ts) for e in kept]
    ts = pl.Series([t.decode("utf-8", "replace") for t in texts], dtype=pl.String).cast(pl.Float64, strict=False)
    n = len(kept)
    frame = build_frame({
        "ph": [e.ph for e in kept], "cat": [e.cat for e in kept], "name": [e.name for e in kept],
        "pid": [e.pid for e in kept], "tid": [e.tid for e in kept], "ts": ts, "dur": [e.dur for e in kept],
        "id": [None if e.id is None else str(e.id) for e in kept], "external_id": [None] * n,
        "correlation": [None] * n, "arg_name": [None] * n,
    })
    if frame["big"].any():
        frame = exact_ts(frame, texts)
    return frame.drop("big").with_columns(
        bp=pl.Series([e.bp for e in kept], dtype=pl.String),
        args=pl.Series([_args_text(e.args) for e in kept], dtype=pl.String),
    )


def _args_text(raw: msgspec.Raw) -> str | None:
    """An event's ``args`` as JSON text; None when absent, empty or not an object."""
    text = bytes(raw)
    if len(text) < 3 or text[:1] != b"{":
        return None
    return text.decode("utf-8", "replace")


def _args(events: pl.DataFrame) -> pl.DataFrame:
    rows = events.filter(pl.col("ph").is_in(ARGS_PHASES) & (pl.col("args").is_not_null() | pl.col("cat").is_not_null())
                         & pl.col("skip").is_null() & pl.col("ts_ns").is_not_null())
    end = pl.when(pl.col("ph") == "X").then(pl.col("ts_ns") + pl.col("dur_ns"))
    return rows.select("source", "ph", "cat", "pid", "tid", "name", start="ts_ns", end=end, args="args")


def _flows(events: pl.DataFrame) -> pl.DataFrame:
    rows = events.filter(pl.col("ph").is_in(FLOW_PHASES) & pl.col("id").is_not_null() & pl.col("skip").is_null()
                         & pl.col("ts_ns").is_not_null())
    return rows.select("source", "ph", "cat", "id", "pid", "tid", ts="ts_ns", bp="bp")
