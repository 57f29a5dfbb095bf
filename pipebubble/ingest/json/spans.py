"""A block of Chrome-trace events as span-table rows: complete events to spans (kinds from categories and
names, GPU events to device and stream, lanes named), allocator events to the allocator-event table, and a
count of every event not kept, by reason. ``block_spans`` runs it for one block where the block was decoded;
``chrome.read_batch`` runs the same plans (``span_plans``) over a batch of small files at once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import polars as pl

from pipebubble import allocations, spans
from pipebubble.ingest.json.columns import ARG_FIELDS, ENGINE, MEMORY_PHASE
from pipebubble.ingest.json.events import COLUMNS

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
    # other accelerators' (libkineto's ActivityType names): an MTIA device's command-processor events are its
    # kernels, on the device (pid = device, tid = its queue); the host's runtime and driver calls
    "mtia_ccp_events": "kernel",
    "mtia_runtime": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
}
#: Categories whose events sit on a device (pid = device, tid = stream): a device lane each.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync",
                     "mtia_ccp_events")
#: Categories besides ``CATEGORY_KINDS``' that a Kineto trace's host writes and that are read as they are (CPU
#: work, or not kept): nothing to say of them. Any other category of a Kineto trace (an accelerator's events
#: not understood: ``hpu_op``, ``mtia_insight``, ``cuda_event`` ...) is read as CPU work, and said
#: (``chrome._result``'s warning, each category with its count).
HOST_CATEGORIES = ("trace", "overhead", "cpu_instant_event", "external_correlation", "cuda_profiler_range")
#: The prefix under which ``to_spans`` counts the events of a category not understood, among the counts of
#: events not kept (``chrome._result`` takes them out: they are kept, as CPU work).
FOREIGN = "category not understood: "
#: Kinds whose events sit on a GPU (pid = device, tid = stream).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync_gpu")
HOST_SYNC = r"(?i)synchronize"
#: Below this many complete events, a block's kinds and lanes are worked out row by row rather than once per
#: distinct category, name, pid and tid (measured: a join of them costs about as much at 4,000 rows).
_PER_ROW = 4096
#: Begin/end and async begin/end events: paired into spans after every block is decoded.
PAIRED_PHASES = ("B", "E", "b", "e")


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
    plans = span_plans(events, pl.lit(source), pl.lit(rank), pl.lit(base), phases)
    if spill is not None:
        plans["table"] = plans["table"].sort("start")
    got = dict(zip(plans, pl.collect_all(list(plans.values()), engine=ENGINE), strict=True))
    table, written = got["table"], []
    if spill is not None:
        written = write_part(table, spill)
        table = table.clear()
    skipped = Counter(dict(got["reasons"].iter_rows()))
    if "memory_reasons" in got:
        skipped += Counter(dict(got["memory_reasons"].iter_rows()))
    rest = got["rest"] if "rest" in got else pl.DataFrame(schema=COLUMNS)
    return rest, table, skipped, written, got.get("memory")


def span_plans(
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
    table, reasons = to_spans(complete, source, rank, phases["X"] if phases is not None else None, by)
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
    ``Device Id`` of -1 is host memory and any other a GPU's. The ``by`` columns are kept (``span_plans``)."""
    rows = events.filter(pl.col("ph") == "i")
    kind = pl.col("mem_type").replace_strict(allocations.DEVICE_TYPES, default=pl.format("type{}", pl.col("mem_type")),
                                             return_dtype=pl.String)
    kind = pl.when(pl.col("mem_type").is_null()).then(
        pl.when(pl.col("mem_device") == -1).then(pl.lit("cpu")).otherwise(pl.lit("cuda"))).otherwise(kind)
    rows = rows.with_columns(device_type=kind)
    gpu = pl.col("device_type") != "cpu"
    device = pl.col("mem_device")
    bad_device = gpu & (device.is_null() | (device < 0) | (device >= spans.INT32))
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
    kept = kept.drop(*ARG_FIELDS).rename(  # a span's argument columns: not the allocator's (``bytes`` is its own)
        {"ts_ns": "ts", "mem_bytes": "bytes", "mem_allocated": "allocated", "mem_reserved": "reserved"})
    return spans.conform(kept, {**allocations.SCHEMA, **{c: pl.Int32 for c in by}}), reasons


def write_part(table: pl.DataFrame, folder: str) -> list[str]:
    """One part of a spilled span table, sorted by start so a time window reads few row groups; lz4, as the
    cache's tables (twice zstd's size, half its time to write and to read back)."""
    if not table.height:
        return []
    part = Path(folder) / f"part-{uuid.uuid4().hex}.parquet"
    table.sort("start").write_parquet(part, row_group_size=256_000, compression="lz4")
    return [str(part)]


def _complete_spans(events: pl.LazyFrame, only_complete: bool = False, by: tuple[str, ...] = ()) -> pl.LazyFrame:
    """``X`` events as span rows, with the ``reason`` those without a valid time, and Kineto's own profile
    span, are not kept for (null for the others); ``only_complete``: every event is an ``X`` event."""
    rows = events if only_complete else events.filter(pl.col("ph") == "X")
    return rows.select(
        "cat", "name", "pid", "tid", "external_id", "correlation", *ARG_FIELDS, *by, start=pl.col("ts_ns"), end=_END,
        reason=_REASON,
    )


def to_spans(
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
        return frame.with_columns(on_device=_ON_DEVICE, foreign=_FOREIGN).with_columns(
            kind=_KIND, lane=lane, off=_OFF_DEVICE)

    if rows is not None and rows < _PER_ROW:
        frame = looked(raw)
    else:
        frame = raw.join(looked(raw.select(keys).unique(keys)), on=keys, how="left", nulls_equal=True,
                         maintain_order="left")
    frame = frame.with_columns(reason=pl.coalesce("reason", pl.when("off").then(pl.lit("device_out_of_range"))))
    counted = pl.coalesce("reason", pl.format(f"{FOREIGN}{{}}", "foreign"))  # kept, but said (``FOREIGN``)
    reasons = frame.filter(counted.is_not_null()).group_by(*by, counted.alias("reason")).len()
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
    return pl.col("cat").str.to_lowercase().is_in(DEVICE_CATEGORIES).fill_null(False)


def _foreign() -> pl.Expr:
    """An event's category where it is none of those understood (``CATEGORY_KINDS``, ``HOST_CATEGORIES``)."""
    known = pl.col("cat").str.to_lowercase().is_in([*CATEGORY_KINDS, *HOST_CATEGORIES])
    return pl.when(known.not_()).then(pl.col("cat"))


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
    return pl.col("on_device") & ((pl.col("pid") < -spans.INT32) | (pl.col("pid") >= spans.INT32)).fill_null(False)


def _on_gpu() -> list[pl.Expr]:
    """GPU events' pid and tid to device and stream (each reads the columns as they were)."""
    on = pl.when("on_device")
    return [on.then(pl.col("pid")).alias("device"), on.then(pl.col("tid")).alias("stream"),
            on.then(None).otherwise(pl.col("pid")).alias("pid"), on.then(None).otherwise(pl.col("tid")).alias("tid")]


def _span_schema() -> list[pl.Expr]:
    """``spans.conform`` for the columns ``to_spans`` gives, without resolving a plan's schema per block."""
    given = {*_ROW_COLUMNS, "kind", "lane", "device", "stream", "source", "rank"}
    return [(pl.col(c) if c in given else pl.lit(None)).cast(t).alias(c) for c, t in spans.SCHEMA.items()]


# Built once: a small file's plan costs more to build than to run.
_ROW_COLUMNS = ("cat", "name", "pid", "tid", "external_id", "correlation", *ARG_FIELDS, "start", "end", "reason")
_END = pl.col("ts_ns") + pl.col("dur_ns")
_KIND, _ON_DEVICE, _REASON, _OFF_DEVICE, _FOREIGN = _kind(), _on_device(), _reason(), _off_device(), _foreign()
_ON_GPU, _SPAN_SCHEMA = _on_gpu(), _span_schema()
