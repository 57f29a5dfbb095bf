"""Nsight Systems tables to span-table rows: pure, vectorised functions over polars frames.

Ids in an export are packed: ``globalPid``/``globalTid`` hold the pid in bits 24..47 and the tid in
bits 0..23 (Nsight Systems export docs, "Serialized process and thread identifiers"). Names are ids
into ``StringIds``. ``correlationId`` is unique only within a process, so every join on it also
matches the pid.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from pipebubble.spans import COMM_KERNELS, INT32, TIME_LIMIT_NS, conform, empty

I64 = pl.Int64
_ID_BITS = 1 << 24

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"

# CUpti_ActivityMemcpyKind and CUpti_ActivitySynchronizationType (cupti_activity.h). Hard-coded because
# exports before 2023 carry no ENUM_* tables, and the values have been stable since CUDA 10.
MEMCPY_KINDS = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA",
    6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP",
}  # fmt: skip
#: A copy's source and destination memory (``srcKind``, ``dstKind``) are numbered by the export's own
#: ENUM_CUDA_MEM_KIND table (Nsight's numbering, not CUPTI's: ``0`` is Pageable, ``1`` Pinned, ``2`` Device in
#: 2026 exports); an export without it says no host memory, which is then never guessed.
MEM_KINDS = "ENUM_CUDA_MEM_KIND"
SYNC_KINDS = {0: "Unknown sync", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}

# ENUM_NSYS_EVENT_TYPE ids: ranges exported as one row with start and end.
NVTX_RANGES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange and their NVTXT-imported twins
NVTX_MARKS = (34, 65)
NVTX_DOMAIN_CREATE = 75

DEVICE_COLS = {c: I64 for c in ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")}
COLUMNS = {
    KERNEL: DEVICE_COLS | {"demangledName": I64, "shortName": I64},
    MEMCPY: DEVICE_COLS | {"copyKind": I64, "bytes": I64, "srcKind": I64, "dstKind": I64},
    MEMSET: DEVICE_COLS | {"bytes": I64},
    GRAPH: DEVICE_COLS | {"graphId": I64, "graphExecId": I64},
    RUNTIME: {"start": I64, "end": I64, "globalTid": I64, "correlationId": I64, "nameId": I64},
    SYNC: DEVICE_COLS | {"syncType": I64},
    NVTX: {
        "start": I64, "end": I64, "eventType": I64, "rangeId": I64, "text": pl.String,
        "globalTid": I64, "endGlobalTid": I64, "textId": I64, "domainId": I64,
        "jsonText": pl.String, "binaryData": pl.Binary,  # payloads (``ranks`` reads NCCL's ranks from them)
    },
}  # fmt: skip


def pid_of(col: str) -> pl.Expr:
    return (pl.col(col) // _ID_BITS) % _ID_BITS


def tid_of(col: str) -> pl.Expr:
    return pl.col(col) % _ID_BITS


def lookup(col: str | pl.Expr, strings: pl.DataFrame) -> pl.Expr:
    """Resolve a ``StringIds`` reference; unknown ids become null."""
    expr = pl.col(col) if isinstance(col, str) else col
    return expr.replace_strict(strings["id"], strings["value"], default=None, return_dtype=pl.String)


def keep(frame: pl.DataFrame, cond: pl.Expr, reason: str, skipped: Counter[str]) -> pl.DataFrame:
    """Rows where ``cond`` holds; the others are counted under ``reason``."""
    kept = frame.filter(cond.fill_null(False))
    if frame.height - kept.height:
        skipped[reason] += frame.height - kept.height
    return kept


def _valid_time() -> pl.Expr:
    return pl.col("start").is_not_null() & pl.col("end").is_not_null() & (pl.col("end") >= pl.col("start"))


def _time_in_range() -> pl.Expr:
    """Start and end strictly within +-``TIME_LIMIT_NS`` (rows already known to have both)."""
    bounds = (-TIME_LIMIT_NS, TIME_LIMIT_NS)
    return pl.col("start").is_between(*bounds, closed="none") & pl.col("end").is_between(*bounds, closed="none")


def _fits_int32(col: str) -> pl.Expr:
    """A null, or a value that fits the span table's Int32 columns."""
    return pl.col(col).is_null() | pl.col(col).is_between(-INT32, INT32, closed="left")


def valid_rows(frame: pl.DataFrame, bad_reason: str, skipped: Counter[str], *required: str) -> pl.DataFrame:
    """Rows with a start <= end and every ``required`` id, counted under ``bad_reason`` when not; then rows
    whose times lie beyond +-``TIME_LIMIT_NS`` (or ``deviceId`` beyond Int32), counted as ``out_of_range``."""
    cond = _valid_time()
    for col in required:
        cond = cond & pl.col(col).is_not_null()
    frame = keep(frame, cond, bad_reason, skipped)
    in_range = _time_in_range()
    if "deviceId" in frame.columns:
        in_range = in_range & _fits_int32("deviceId")
    return keep(frame, in_range, "out_of_range", skipped)


def device_spans(frame: pl.DataFrame, kind: pl.Expr, name: pl.Expr, skipped: Counter[str]) -> pl.DataFrame:
    """GPU activity rows (kernel, memcpy, memset, graph launch) on lane ``pid{pid}/gpu{device}``; a copy's or
    memset's ``bytes`` where its table has them."""
    if frame.is_empty():  # a table the export lacks or that holds no rows
        return empty()
    frame = valid_rows(frame, "gpu_bad_row", skipped, "globalPid")
    out = frame.select(
        pid_of("globalPid").alias("pid"),
        pl.col("deviceId").alias("device"),
        pl.col("streamId").alias("stream"),
        kind.alias("kind"),
        name.alias("name"),
        "start",
        "end",
        pl.col("correlationId").alias("correlation"),
        *(["bytes"] if "bytes" in frame.columns else []),
    )
    return conform(out.with_columns(lane=pl.format("pid{}/gpu{}", "pid", pl.col("device").fill_null(0))))


def kernels(frame: pl.DataFrame, strings: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    # The demangled name carries templates (what profilers show); shortName is the fallback of older exports.
    frame = frame.with_columns(name=pl.coalesce(lookup("demangledName", strings), lookup("shortName", strings)))
    names = frame["name"].unique().drop_nulls()  # few distinct names: the communication rule runs once on each
    comm = names.filter(names.str.contains(COMM_KERNELS))
    kind = pl.when(pl.col("name").is_in(comm.implode())).then(pl.lit("comm")).otherwise(pl.lit("kernel"))
    return device_spans(frame, kind, pl.col("name"), skipped)


def memcpys(frame: pl.DataFrame, skipped: Counter[str], memory_kinds: pl.DataFrame | None = None) -> pl.DataFrame:
    """Copies named as Kineto names them: ``Memcpy HtoD (Pageable -> Device)`` where ``memory_kinds`` (the
    export's ``MEM_KINDS`` table: id, label) names both ends, else ``Memcpy HtoD``."""
    kind_name = pl.col("copyKind").replace_strict(MEMCPY_KINDS, default="Unknown", return_dtype=pl.String)
    name = pl.concat_str(pl.lit("Memcpy "), kind_name)
    if memory_kinds is not None and memory_kinds.height:
        known = memory_kinds.drop_nulls().filter(pl.col("label") != "Unknown")
        src, dst = (pl.col(c).replace_strict(known["id"], known["label"], default=None, return_dtype=pl.String)
                    for c in ("srcKind", "dstKind"))
        name = pl.when(src.is_not_null() & dst.is_not_null()).then(pl.format("{} ({} -> {})", name, src, dst)
                                                                   ).otherwise(name)
    return device_spans(frame, pl.lit("memcpy"), name, skipped)


def memsets(frame: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    return device_spans(frame, pl.lit("memset"), pl.lit("Memset"), skipped)


def graph_launches(frame: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    # With graph-level tracing nsys records one row per graph launch and no rows for its kernels:
    # the launch is busy time, or graph-heavy jobs show false bubbles.
    graph = pl.coalesce("graphId", "graphExecId").cast(pl.String).fill_null("?")
    return device_spans(frame, pl.lit("kernel"), pl.concat_str(pl.lit("cudaGraphLaunch graph "), graph), skipped)


def _cpu_lane() -> pl.Expr:
    return pl.format("pid{}/cpu/{}", "pid", "tid").alias("lane")


def runtime_calls(frame: pl.DataFrame, strings: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    """CUDA runtime/driver calls on their thread's lane; ``_v7000``-style ABI suffixes are dropped."""
    frame = valid_rows(frame, "runtime_bad_row", skipped, "globalTid")
    out = frame.select(
        pid_of("globalTid").alias("pid"),
        tid_of("globalTid").alias("tid"),
        pl.lit("runtime").alias("kind"),
        lookup("nameId", strings).str.replace(r"_v\d+$", "").alias("name"),
        "start",
        "end",
        pl.col("correlationId").alias("correlation"),
    )
    return conform(out.with_columns(_cpu_lane()))


def syncs(frame: pl.DataFrame, runtime: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    """Synchronisation records carry only the process: their thread is that of the API call they belong to."""
    frame = valid_rows(frame, "sync_bad_row", skipped, "globalPid")
    calls = runtime.select("pid", "tid", "correlation").unique(["pid", "correlation"], keep="first")
    out = frame.select(
        pid_of("globalPid").alias("pid"),
        pl.lit("sync").alias("kind"),
        pl.col("syncType").replace_strict(SYNC_KINDS, default="Unknown sync", return_dtype=pl.String).alias("name"),
        "start",
        "end",
        pl.col("correlationId").alias("correlation"),
    ).join(calls, on=["pid", "correlation"], how="left")
    out = keep(out, pl.col("tid").is_not_null(), "sync_without_call", skipped)
    return conform(out.with_columns(_cpu_lane()))


def nvtx_ranges(frame: pl.DataFrame, strings: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    """NVTX push/pop and start/end ranges as ``annotation`` spans on the thread that opened them.

    A start/end range may end on another thread (``endGlobalTid``); it stays on its opening thread's
    lane, like Nsight's own timeline shows it.
    """
    etype = pl.col("eventType")
    frame = keep(frame, ~etype.is_in(NVTX_MARKS), "nvtx_mark", skipped)
    frame = keep(frame, etype != NVTX_DOMAIN_CREATE, "nvtx_domain", skipped)
    frame = keep(frame, etype.is_in(NVTX_RANGES), "nvtx_other", skipped)
    frame = valid_rows(frame, "nvtx_unmatched", skipped)
    gtid = pl.coalesce("globalTid", "endGlobalTid")
    out = frame.select(
        (gtid // _ID_BITS % _ID_BITS).alias("pid"),
        (gtid % _ID_BITS).alias("tid"),
        pl.lit("annotation").alias("kind"),
        pl.coalesce(pl.col("text"), lookup("textId", strings)).alias("name"),
        "start",
        "end",
    )
    out = keep(out, pl.col("tid").is_not_null(), "nvtx_no_thread", skipped)
    return conform(out.with_columns(_cpu_lane()))


def nvtx_domains(frame: pl.DataFrame, strings: pl.DataFrame) -> dict[int, str]:
    """Domain id -> name, from the ``NvtxDomainCreate`` rows."""
    rows = frame.filter(pl.col("eventType") == NVTX_DOMAIN_CREATE).select(
        "domainId", pl.coalesce(pl.col("text"), lookup("textId", strings)).alias("name")
    )
    return {d: n for d, n in rows.iter_rows() if d is not None and n is not None}
