"""Chrome-trace JSON (and torch.profiler/Kineto, which writes it) into the span table.

Kineto facts (checked on real files): ``ts``/``dur`` are µs whatever ``displayTimeUnit`` says; ``ts`` is
relative to ``baseTimeNanoseconds`` when the header has it, else absolute epoch µs; GPU events carry
``pid`` = device and ``tid`` = stream; the rank comes from ``distributedInfo.rank``, never from a pid.

Decoding the JSON is ``trace``; pairing ``B``/``E`` and async ``b``/``e`` events is ``pairs``.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import polars as pl

from pipebubble import allocations, spans
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.json import pairs
from pipebubble.ingest.json import trace as jsontrace
from pipebubble.ingest.json.columns import ENGINE
from pipebubble.ingest.json.events import COLUMNS, MEMORY_PHASE

# Category -> kind. Old Kineto names (Kernel, Memcpy, Runtime) included; matching is case-insensitive.
CATEGORY_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "hip_runtime": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "annotation",  # Python stack frames label time; they are not work of their own
}
#: Kinds whose events sit on a GPU (pid = device, tid = stream).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync_gpu")
HOST_SYNC = r"(?i)synchronize"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NOT_SPANS = {
    "s": "flow",
    "t": "flow",
    "f": "flow",
    "C": "counter",
    "M": "metadata",
    "i": "instant",
    "I": "instant",
    "n": "instant",
    "R": "instant",
    "O": "object",
    "N": "object",
    "D": "object",
    "P": "sample",
    "<not an object>": "not_an_event",
}
_INT32 = 2**31
#: Below this many complete events, a block's kinds and lanes are worked out row by row rather than once per
#: distinct category, name, pid and tid (measured: a join of them costs about as much at 4,000 rows).
_PER_ROW = 4096
#: Begin/end and async begin/end events: paired into spans after every block is decoded.
PAIRED_PHASES = ("B", "E", "b", "e")


def read(
    path: Path,
    position: int = 0,
    pool: Executor | None = None,
    scratch: Path | None = None,
    spill: Path | None = None,
) -> FileResult:
    """Read one Chrome/Kineto JSON trace (``.json`` or ``.json.gz``); ``pool`` decodes blocks in parallel,
    ``scratch`` holds a big trace's gunzipped text meanwhile. Complete events become spans where their
    block was decoded; only B/E, async and metadata events (few) come back here to be paired and named.
    With ``spill``, spans go to Parquet files in that folder instead of memory (``meta["spill"]``)."""

    def finish(header: dict) -> jsontrace.Finish:
        rank, base = _rank(header, path, position)[0], header.get("base_time_ns") or 0
        return partial(block_spans, source=str(path), rank=rank, base=base, spill=str(spill) if spill else None)

    with jsontrace.opened(path, scratch) as trace:
        decoded = jsontrace.decode(path, trace.data, pool, finish, trace.disk)
        gzip_warning = trace.warning
    return _result(path, position, decoded, gzip_warning, spill)


@dataclass
class Pending:
    """A small trace decoded, its spans not yet made: ``read_batch`` makes a batch's in one plan."""

    path: Path
    position: int
    decoded: jsontrace.Decoded  # ``events``: a plan of the file's kept events
    gzip_warning: str | None = None


def decode_pending(path: Path, position: int = 0) -> Pending:
    """``read``'s first half for a small trace (in memory, on this core): the file decoded, each block's
    events left a plan for ``read_batch`` to run with the other files' (a small file's fixed cost is its
    queries). Raises what ``read`` raises for the same file."""
    with jsontrace.opened(path) as trace:
        decoded = jsontrace.decode(path, trace.data, None, lambda header: _deferred)
        return Pending(path, position, decoded, trace.warning)


def _deferred(
    events: pl.DataFrame | pl.LazyFrame, phases: Counter[str] | None = None
) -> tuple[pl.LazyFrame, None, Counter, list[str], None]:
    """A block's work put off (``decode_pending``): its events as a plan, nothing made of them yet."""
    return events.lazy(), None, Counter(), [], None


def read_batch(files: list[Pending]) -> list[FileResult]:
    """Each decoded file as ``read`` gives it. Their spans, counts of events not kept, allocator events and
    events left to pair or name come from one plan over all their events (``_span_plans``, each file's
    source, rank and base looked up by its place in the batch), split by file; what only some files have
    (pairs, names, allocator totals) is done for those alone."""
    if not files:
        return []
    events = pl.concat([f.decoded.events.lazy().with_columns(pl.lit(k, pl.Int32).alias(_FILE))
                        for k, f in enumerate(files)], how="vertical").collect(engine=ENGINE)  # run once, not per plan
    phases = sum((f.decoded.phases for f in files), Counter())
    ranks = [_rank(f.decoded.header, f.path, f.position)[0] for f in files]
    each = partial(_of_file, pl.col(_FILE))
    plans = _span_plans(events, each([str(f.path) for f in files], pl.String), each(ranks, pl.Int64),
                        each([f.decoded.header.get("base_time_ns") or 0 for f in files], pl.Int64), phases, (_FILE,))
    got = dict(zip(plans, pl.collect_all(list(plans.values()), engine=ENGINE), strict=True))
    tables, rests = _by_file(got["table"], len(files)), _by_file(got.get("rest"), len(files))
    memory = _by_file(got.get("memory"), len(files))
    skipped = [Counter() for _ in files]
    for reasons in (got["reasons"], got.get("memory_reasons")):
        for k, reason, n in reasons.iter_rows() if reasons is not None else ():
            skipped[k][reason] += n
    no_rest = pl.DataFrame(schema=COLUMNS)
    return [
        _result(f.path, f.position, replace(f.decoded, events=no_rest if rest is None else rest, spans=[table],
                                            skipped=skip, memory=[mem] if mem is not None and mem.height else []),
                f.gzip_warning)
        for f, table, rest, mem, skip in zip(files, tables, rests, memory, skipped, strict=True)
    ]


#: The column a batch's plan tells its files apart by: each file's place in the batch.
_FILE = "file"


def _of_file(file: pl.Expr, values: list, dtype: pl.DataType) -> pl.Expr:
    """Each row's value of its file (``values``, by place in the batch)."""
    return pl.lit(pl.Series(values, dtype=dtype)).gather(file)


def _by_file(frame: pl.DataFrame | None, files: int) -> list[pl.DataFrame | None]:
    """A batch's rows split by file (``_FILE`` dropped): each file's are one run, in file order, as every
    plan keeps its rows' order; None for every file without ``frame``."""
    if frame is None:
        return [None] * files
    counts = dict(frame.drop_in_place(_FILE).value_counts().iter_rows())
    rows = [counts.get(k, 0) for k in range(files)]
    return [frame.slice(start, n) for start, n in zip(itertools.accumulate(rows, initial=0), rows, strict=False)]


def _result(
    path: Path, position: int, decoded: jsontrace.Decoded, gzip_warning: str | None, spill: Path | None = None
) -> FileResult:
    """A decoded file whose blocks' spans are made: its B/E and async events paired, its names read, its
    parts put together (and spilled, with ``spill``)."""
    header, events = decoded.header, decoded.events
    rank, rank_warning = _rank(header, path, position)
    skipped = _not_spans(decoded.phases) + decoded.skipped
    parts = list(decoded.spans)
    if any(decoded.phases[ph] for ph in PAIRED_PHASES):  # most traces have none to pair
        paired, unmatched = pairs.paired_spans(events)
        skipped.update(unmatched)
        table, reasons = _to_spans(paired.lazy().with_columns(reason=pl.lit(None, pl.String)), pl.lit(str(path)),
                                   pl.lit(rank), paired.height)
        paired_spans, reasons = pl.collect_all([table, reasons], engine=ENGINE)
        skipped.update(Counter(dict(reasons.iter_rows())))
        parts.append(paired_spans)
    table = pl.concat(parts, how="vertical") if parts else spans.empty()
    memory = allocations.with_running_totals(pl.concat(decoded.memory)) if decoded.memory else None
    spilled = {}
    if spill is not None:
        _write_part(table, str(spill))
        table, spilled = (
            table.clear(),
            {"spill": str(spill), "spans": _spilled_rows(spill)},
        )
    warnings = [w for w in (gzip_warning, rank_warning) if w] + decoded.warnings + _repair_warnings(path, decoded)
    if decoded.unread_bytes:
        warnings.append(
            f"{path}: trace cut off; read up to its last whole event, {decoded.unread_bytes} bytes unreadable"
        )
    process_names, thread_names = _names(events) if decoded.phases["M"] else ({}, {})
    meta = {
        **header,
        "rank": rank,
        "unread_bytes": decoded.unread_bytes,
        "process_names": process_names,
        "thread_names": thread_names,
        **spilled,
    }
    fmt = "kineto" if header.get("kineto") else "chrome"
    return FileResult(str(path), table, decoded.phases.total(), skipped, warnings, meta, fmt, memory)


def _repair_warnings(path: Path, decoded: jsontrace.Decoded) -> list[str]:
    """One line per kind of repair the JSON text needed before it could be read."""
    out = []
    if decoded.repairs["utf8"]:
        out.append(f"{path}: {decoded.repairs['utf8']} invalid UTF-8 sequences or lone surrogates replaced by U+FFFD")
    if decoded.repairs["deep"]:
        out.append(f"{path}: values nested too deep to decode were replaced by null")
    return out


def _rank(header: dict, path: Path, position: int) -> tuple[int, str | None]:
    """``distributedInfo.rank`` (checked to fit Int32 when the header was read), else a ``rank-N``/``rankN``
    file name, else the file's position; a file name whose rank does not fit Int32 is ignored, with a
    warning."""
    if header.get("rank") is not None:
        return header["rank"], None
    match = _RANK_IN_NAME.search(path.name)
    if match is None:
        return position, None
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) <= 10 and int(digits) < _INT32:
        return int(digits), None
    return position, f"{path}: rank in the file name does not fit Int32; using the file's position {position}"


def block_spans(
    events: pl.DataFrame | pl.LazyFrame,
    source: str,
    rank: int,
    base: int,
    spill: str | None = None,
    phases: Counter[str] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, Counter, list[str], pl.DataFrame | None]:
    """One block's complete events (a frame, or a plan for it) as spans (written to a Parquet file in
    ``spill`` instead, when given); the events to pair or name later (with ``base`` added), the count of
    events not kept, the file written and the allocator events (None when there are none). One lazy plan,
    run once for all (a small file's fixed cost is its queries); ``phases``, the block's counts, leave out
    the parts for phases it has none of (None: any may be present).

    ``ts_ns`` and ``base`` both lie strictly within ±2**62, so their sum cannot overflow; a sum beyond the
    limit marks the event ``out_of_range``."""
    plans = _span_plans(events, pl.lit(source), pl.lit(rank), pl.lit(base), phases)
    if spill is not None:
        plans["table"] = plans["table"].sort("start")
    got = dict(zip(plans, pl.collect_all(list(plans.values()), engine=ENGINE), strict=True))
    table, written = got["table"], []
    if spill is not None:
        written = _write_part(table, spill)
        table = table.clear()
    skipped = Counter(dict(got["reasons"].iter_rows()))
    if "memory_reasons" in got:
        skipped += Counter(dict(got["memory_reasons"].iter_rows()))
    rest = got["rest"] if "rest" in got else pl.DataFrame(schema=COLUMNS)
    return rest, table, skipped, written, got.get("memory")


def _span_plans(
    events: pl.DataFrame | pl.LazyFrame,
    source: pl.Expr,
    rank: pl.Expr,
    base: pl.Expr,
    phases: Counter[str] | None,
    by: tuple[str, ...] = (),
) -> dict[str, pl.LazyFrame]:
    """``block_spans``' plans, not yet run: ``table`` and ``reasons`` always, ``rest`` (the events to pair
    or name) and ``memory`` and ``memory_reasons`` where ``phases`` may hold such events. ``source``,
    ``rank`` and ``base`` are each row's (literals for one file's block; for a batch of files, looked up by
    file); the ``by`` columns (a batch's file) stay in every plan, counts included, so each file's rows can
    be told apart."""
    limit = spans.TIME_LIMIT_NS
    ts = pl.col("ts_ns") + base
    events = events.lazy().with_columns(
        ts_ns=pl.when(ts.abs() < limit).then(ts),
        skip=pl.coalesce("skip", pl.when(ts.abs() >= limit).then(pl.lit("out_of_range"))),
    )
    rest_phases, memory_phase = _present(phases, (*PAIRED_PHASES, "M")), _present(phases, (MEMORY_PHASE,))
    complete = _complete_spans(events, not (rest_phases or memory_phase), by)
    table, reasons = _to_spans(complete, source, rank, phases["X"] if phases is not None else None, by)
    plans = {"table": table, "reasons": reasons}
    if rest_phases:
        plans["rest"] = events.filter(pl.col("ph").is_in([*PAIRED_PHASES, "M"]))
    if memory_phase:
        plans["memory"], plans["memory_reasons"] = _allocator_events(events, source, rank, by)
    return plans


def _present(phases: Counter[str] | None, wanted: tuple[str, ...]) -> bool:
    """Whether a block counted any of the ``wanted`` phases (always, when its counts are not known)."""
    return phases is None or any(phases[ph] for ph in wanted)


def _allocator_events(
    events: pl.LazyFrame, source: pl.Expr, rank: pl.Expr, by: tuple[str, ...] = ()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The block's allocator events (phase "i", ``[memory]``) as rows of the allocator-event table, without
    running totals (``allocations.with_running_totals`` adds them over the whole file), and the count of
    those not kept by reason: a bad time (``skip``), no bytes (``memory_bad_value``), a GPU without an Int32
    device id (``device_out_of_range``). ``Device Type`` is c10's number (0 CPU, 1 CUDA); without one, a
    ``Device Id`` of -1 is host memory and any other a GPU's. The ``by`` columns are kept (``_span_plans``)."""
    rows = events.filter(pl.col("ph") == "i")
    kind = pl.col("mem_type").replace_strict(allocations.DEVICE_TYPES, default=pl.format("type{}", pl.col("mem_type")),
                                             return_dtype=pl.String)
    kind = pl.when(pl.col("mem_type").is_null()).then(
        pl.when(pl.col("mem_device") == -1).then(pl.lit("cpu")).otherwise(pl.lit("cuda"))).otherwise(kind)
    rows = rows.with_columns(device_type=kind)
    gpu = pl.col("device_type") != "cpu"
    bad_device = gpu & (pl.col("mem_device").is_null() | (pl.col("mem_device") < 0) | (pl.col("mem_device") >= _INT32))
    reason = pl.coalesce(
        "skip",
        pl.when(pl.col("ts_ns").is_null()).then(pl.lit("bad_time")),
        pl.when(pl.col("mem_bytes").is_null()).then(pl.lit("memory_bad_value")),
        pl.when(bad_device).then(pl.lit("device_out_of_range")),
    )
    rows = rows.with_columns(reason=reason)
    reasons = rows.filter(pl.col("reason").is_not_null()).group_by(*by, "reason").len()
    kept = rows.filter(pl.col("reason").is_null()).with_columns(
        device=pl.when(gpu).then(pl.col("mem_device")), rank=rank, source=source)
    kept = kept.with_columns(lane=allocations.lane(pl.format("rank{}", rank)))
    kept = kept.rename({"ts_ns": "ts", "mem_bytes": "bytes", "mem_allocated": "allocated", "mem_reserved": "reserved"})
    return spans.conform(kept, {**allocations.SCHEMA, **{c: pl.Int32 for c in by}}), reasons


def _spilled_rows(folder: Path) -> int:
    """Rows in the parts written to a spill folder (none when the trace has no span)."""
    written = sorted(Path(folder).glob("part-*.parquet"))
    return pl.scan_parquet(written).select(pl.len()).collect().item() if written else 0


def _write_part(table: pl.DataFrame, folder: str) -> list[str]:
    """One part of a spilled span table, sorted by start so a time window reads few row groups; lz4, as the
    cache's tables (twice zstd's size, half its time to write and to read back)."""
    if not table.height:
        return []
    part = Path(folder) / f"part-{uuid.uuid4().hex}.parquet"
    table.sort("start").write_parquet(part, row_group_size=256_000, compression="lz4")
    return [str(part)]


def _not_spans(phases: Counter[str]) -> Counter[str]:
    """Every phase that never becomes a span, counted by what it is."""
    skipped: Counter[str] = Counter()
    for ph, n in phases.items():
        if ph not in ("X", "B", "E", "b", "e", MEMORY_PHASE):
            skipped[_NOT_SPANS.get(ph, f"phase {ph!r}")] += n
    return skipped


def _complete_spans(events: pl.LazyFrame, only_complete: bool = False, by: tuple[str, ...] = ()) -> pl.LazyFrame:
    """``X`` events as span rows, with the ``reason`` those without a valid time, and Kineto's own profile
    span, are not kept for (null for the others); ``only_complete``: every event is an ``X`` event."""
    rows = events if only_complete else events.filter(pl.col("ph") == "X")
    return rows.select(
        "cat", "name", "pid", "tid", "external_id", "correlation", *by, start=pl.col("ts_ns"), end=_END,
        reason=_REASON,
    )


def _to_spans(
    raw: pl.LazyFrame, source: pl.Expr, rank: pl.Expr, rows: int | None = None, by: tuple[str, ...] = ()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Span rows (``raw``: ``_ROW_COLUMNS``, a ``reason`` to skip, null to keep) to the span table:
    categories to kinds, GPU events to (device, stream), lanes named; and the count of rows not kept by
    reason (``reason``, ``len``), GPU events whose pid (the device) does not fit Int32 as
    ``device_out_of_range``. Everything but the reason is a function of category, name, pid and tid, which
    repeat heavily: it is worked out once per distinct four (the regexes, the lowercasing, the string
    formatting) and joined back, unless ``raw`` has fewer than ``_PER_ROW`` rows (``rows``, when known):
    then row by row, as the join costs a small file more than it saves. Both are lazy: collected together,
    they share one pass. ``source`` and ``rank`` are each row's; ``rank`` may read only the ``by`` columns
    (a batch's file), which are kept in both."""
    keys = ["cat", "name", "pid", "tid", *by]
    lane = (
        pl.when("on_device")
        .then(pl.format("rank{}/gpu{}", rank, pl.col("pid")))
        .otherwise(pl.format("rank{}/pid{}/tid{}", rank, pl.col("pid"), pl.col("tid")))
    )

    def looked(frame: pl.LazyFrame) -> pl.LazyFrame:
        return frame.with_columns(on_device=_ON_DEVICE).with_columns(kind=_KIND, lane=lane, off=_OFF_DEVICE)

    if rows is not None and rows < _PER_ROW:
        frame = looked(raw)
    else:
        frame = raw.join(looked(raw.select(keys).unique(keys)), on=keys, how="left", nulls_equal=True,
                         maintain_order="left")
    frame = frame.with_columns(reason=pl.coalesce("reason", pl.when("off").then(pl.lit("device_out_of_range"))))
    reasons = frame.filter(pl.col("reason").is_not_null()).group_by(*by, "reason").len()
    table = frame.filter(pl.col("reason").is_null()).with_columns(*_ON_GPU, source=source, rank=rank)
    return table.select(*_SPAN_SCHEMA, *by), reasons


def _kind() -> pl.Expr:
    """Each event's kind: its category's (``CATEGORY_KINDS``, else ``cpu_op``), then steps, communication and
    syncs by name. A category is looked up by its place among the known ones (an Enum): a dict's
    ``replace_strict`` costs a small file's plan a quarter of a millisecond to set up."""
    known = pl.col("cat").str.to_lowercase().cast(pl.Enum(list(CATEGORY_KINDS)), strict=False)
    mapped = pl.lit(pl.Series(list(CATEGORY_KINDS.values()), dtype=pl.String)).gather(known.to_physical())
    mapped = mapped.fill_null(pl.lit("cpu_op"))
    return (
        pl.when(pl.col("name").str.starts_with("ProfilerStep#"))
        .then(pl.lit("step"))
        .when((mapped == "kernel") & pl.col("name").str.contains(spans.COMM_KERNELS))
        .then(pl.lit("comm"))
        .when((mapped == "annotation") & pl.col("name").str.contains(spans.COLLECTIVE_RANGES))
        .then(pl.lit("comm"))
        .when((mapped == "runtime") & pl.col("name").str.contains(HOST_SYNC))
        .then(pl.lit("sync"))
        .otherwise(mapped)
    )


def _on_device() -> pl.Expr:
    on = (
        pl.col("cat")
        .str.to_lowercase()
        .is_in(["kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"])
    )
    return on.fill_null(False)


def _reason() -> pl.Expr:
    """Why an ``X`` event is not kept (null: kept). Start and duration are each below 2**62, so their sum
    cannot overflow; an end beyond the limit is ``out_of_range``."""
    return pl.coalesce(
        "skip",
        pl.when(pl.col("ts_ns").is_null() | pl.col("dur_ns").is_null() | (pl.col("dur_ns") < 0)).then(
            pl.lit("bad_time")
        ),
        pl.when(_END >= spans.TIME_LIMIT_NS).then(pl.lit("out_of_range")),
        pl.when(pl.col("cat") == "Trace").then(pl.lit("profiler_trace")),  # Kineto's own whole-profile span
    )


def _off_device() -> pl.Expr:
    """A GPU event whose pid (its device) does not fit Int32."""
    return pl.col("on_device") & ((pl.col("pid") < -_INT32) | (pl.col("pid") >= _INT32)).fill_null(False)


def _on_gpu() -> list[pl.Expr]:
    """GPU events' pid and tid to device and stream (each reads the columns as they were)."""
    on = pl.when("on_device")
    return [on.then(pl.col("pid")).alias("device"), on.then(pl.col("tid")).alias("stream"),
            on.then(None).otherwise(pl.col("pid")).alias("pid"), on.then(None).otherwise(pl.col("tid")).alias("tid")]


def _span_schema() -> list[pl.Expr]:
    """``spans.conform`` for the columns ``_to_spans`` gives, without resolving a plan's schema per block."""
    given = {*_ROW_COLUMNS, "kind", "lane", "device", "stream", "source", "rank"}
    return [(pl.col(c) if c in given else pl.lit(None)).cast(t).alias(c) for c, t in spans.SCHEMA.items()]


# Built once: a small file's plan costs more to build than to run.
_ROW_COLUMNS = ("cat", "name", "pid", "tid", "external_id", "correlation", "start", "end", "reason")
_END = pl.col("ts_ns") + pl.col("dur_ns")
_KIND, _ON_DEVICE, _REASON, _OFF_DEVICE = _kind(), _on_device(), _reason(), _off_device()
_ON_GPU, _SPAN_SCHEMA = _on_gpu(), _span_schema()


def _names(events: pl.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """Process names by pid and thread names by ``pid/tid``, from the metadata events (the last of each
    wins), in one query."""
    process = pl.col("name") == "process_name"
    ids = [pl.col(c).cast(pl.String) for c in ("pid", "tid")]
    rows = (
        events.lazy()
        .filter(
            (pl.col("ph") == "M")
            & pl.col("name").is_in(["process_name", "thread_name"])
            & pl.col("arg_name").is_not_null()
        )
        .select(process=process, key=pl.when(process).then(ids[0]).otherwise(pl.concat_str(ids, separator="/")),
                value="arg_name")
        .unique(["process", "key"], keep="last", maintain_order=True)
        .collect(engine=ENGINE)
    )
    names: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for is_process, key, value in rows.iter_rows():
        names[0 if is_process else 1][key] = value
    return names
