"""Chrome-trace JSON (and torch.profiler/Kineto, which writes it) into the span table.

Kineto facts (checked on real files): ``ts``/``dur`` are µs whatever ``displayTimeUnit`` says; ``ts`` is
relative to ``baseTimeNanoseconds`` when the header has it, else absolute epoch µs; GPU events carry
``pid`` = device and ``tid`` = stream; the rank comes from ``distributedInfo.rank``, never from a pid.

Decoding the JSON is ``jsontrace``; pairing ``B``/``E`` and async ``b``/``e`` events is ``jsonpairs``.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from concurrent.futures import Executor
from functools import partial
from pathlib import Path

import polars as pl

from pipebubble import allocations, spans
from pipebubble.ingest import jsonpairs, jsontrace
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.jsoncolumns import ENGINE
from pipebubble.ingest.jsonevents import COLUMNS, MEMORY_PHASE

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
    header, events = decoded.header, decoded.events
    rank, rank_warning = _rank(header, path, position)
    skipped = _not_spans(decoded.phases) + decoded.skipped
    parts = list(decoded.spans)
    if any(decoded.phases[ph] for ph in PAIRED_PHASES):  # most traces have none to pair
        paired, unmatched = jsonpairs.paired_spans(events)
        skipped.update(unmatched)
        table, reasons = _to_spans(paired.lazy().with_columns(reason=pl.lit(None, pl.String)), str(path), rank,
                                   paired.height)
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
    limit = spans.TIME_LIMIT_NS
    ts = pl.col("ts_ns") + base
    events = events.lazy().with_columns(
        ts_ns=pl.when(ts.abs() < limit).then(ts),
        skip=pl.coalesce("skip", pl.when(ts.abs() >= limit).then(pl.lit("out_of_range"))),
    )
    rest_phases, memory_phase = _present(phases, (*PAIRED_PHASES, "M")), _present(phases, (MEMORY_PHASE,))
    complete = _complete_spans(events, only_complete=not (rest_phases or memory_phase))
    table, reasons = _to_spans(complete, source, rank, phases["X"] if phases is not None else None)
    plans = {"table": table.sort("start") if spill is not None else table, "reasons": reasons}
    if rest_phases:
        plans["rest"] = events.filter(pl.col("ph").is_in([*PAIRED_PHASES, "M"]))
    if memory_phase:
        plans["memory"], plans["memory_reasons"] = _allocator_events(events, source, rank)
    got = dict(zip(plans, pl.collect_all(list(plans.values()), engine=ENGINE), strict=True))
    table, written = got["table"], []
    if spill is not None:
        written = _write_part(table, spill)
        table = table.clear()
    skipped = Counter(dict(got["reasons"].iter_rows()))
    if memory_phase:
        skipped += Counter(dict(got["memory_reasons"].iter_rows()))
    rest = got["rest"] if rest_phases else pl.DataFrame(schema=COLUMNS)
    return rest, table, skipped, written, got.get("memory")


def _present(phases: Counter[str] | None, wanted: tuple[str, ...]) -> bool:
    """Whether a block counted any of the ``wanted`` phases (always, when its counts are not known)."""
    return phases is None or any(phases[ph] for ph in wanted)


def _allocator_events(events: pl.LazyFrame, source: str, rank: int) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The block's allocator events (phase "i", ``[memory]``) as rows of the allocator-event table, without
    running totals (``allocations.with_running_totals`` adds them over the whole file), and the count of
    those not kept by reason: a bad time (``skip``), no bytes (``memory_bad_value``), a GPU without an Int32
    device id (``device_out_of_range``). ``Device Type`` is c10's number (0 CPU, 1 CUDA); without one, a
    ``Device Id`` of -1 is host memory and any other a GPU's."""
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
    reasons = rows.filter(pl.col("reason").is_not_null()).group_by("reason").len()
    kept = rows.filter(pl.col("reason").is_null()).with_columns(
        device=pl.when(gpu).then(pl.col("mem_device")), rank=pl.lit(rank), source=pl.lit(source))
    kept = kept.with_columns(lane=allocations.lane(pl.lit(f"rank{rank}")))
    table = allocations.conform(kept.rename({"ts_ns": "ts", "mem_bytes": "bytes", "mem_allocated": "allocated",
                                             "mem_reserved": "reserved"}).drop("mem_type", "mem_device"))
    return table, reasons


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


def _complete_spans(events: pl.LazyFrame, only_complete: bool = False) -> pl.LazyFrame:
    """``X`` events as span rows, with the ``reason`` those without a valid time, and Kineto's own profile
    span, are not kept for (null for the others); ``only_complete``: every event is an ``X`` event."""
    rows = events if only_complete else events.filter(pl.col("ph") == "X")
    return rows.select(
        "cat", "name", "pid", "tid", "external_id", "correlation", start=pl.col("ts_ns"), end=_END, reason=_REASON
    )


def _to_spans(raw: pl.LazyFrame, source: str, rank: int, rows: int | None = None) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Span rows (``raw``: ``_ROW_COLUMNS``, a ``reason`` to skip, null to keep) to the span table:
    categories to kinds, GPU events to (device, stream), lanes named; and the count of rows not kept by
    reason (``reason``, ``len``), GPU events whose pid (the device) does not fit Int32 as
    ``device_out_of_range``. Everything but the reason is a function of category, name, pid and tid, which
    repeat heavily: it is worked out once per distinct four (the regexes, the lowercasing, the string
    formatting) and joined back, unless ``raw`` has fewer than ``_PER_ROW`` rows (``rows``, when known):
    then row by row, as the join costs a small file more than it saves. Both are lazy: collected together,
    they share one pass."""
    keys = ["cat", "name", "pid", "tid"]
    lane = (
        pl.when("on_device")
        .then(pl.format("rank{}/gpu{}", pl.lit(rank), pl.col("pid")))
        .otherwise(pl.format("rank{}/pid{}/tid{}", pl.lit(rank), pl.col("pid"), pl.col("tid")))
    )

    def looked(frame: pl.LazyFrame) -> pl.LazyFrame:
        return frame.with_columns(on_device=_ON_DEVICE).with_columns(kind=_KIND, lane=lane, off=_OFF_DEVICE)

    if rows is not None and rows < _PER_ROW:
        frame = looked(raw)
    else:
        frame = raw.join(looked(raw.select(keys).unique(keys)), on=keys, how="left", nulls_equal=True,
                         maintain_order="left")
    frame = frame.with_columns(reason=pl.coalesce("reason", pl.when("off").then(pl.lit("device_out_of_range"))))
    reasons = frame.filter(pl.col("reason").is_not_null()).group_by("reason").len()
    table = frame.filter(pl.col("reason").is_null()).with_columns(
        *_ON_GPU, source=pl.lit(source), rank=pl.lit(rank))
    return table.select(_SPAN_SCHEMA), reasons


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
