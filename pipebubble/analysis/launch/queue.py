"""The launch queue of each GPU stream: at every instant, the operations on it whose launching call has begun
on the host and that have not yet ended on the GPU (``report.launches``' definitions; HolisticTraceAnalysis
counts the same, "queue length", from the same two instants).

The series is a sweep: +1 at each launch's start, −1 at each operation's end, summed per instant and
accumulated per stream; the summary weighs each length by how long it held.
"""

from __future__ import annotations

import polars as pl

from pipebubble.report.launches import FULL_QUEUE

KEYS = ["lane", "rank", "stream"]
SERIES = {"lane": pl.String, "rank": pl.Int32, "stream": pl.Int64, "at_ns": pl.Int64, "queue": pl.Int64}
SUMMARY = {"lane": pl.String, "rank": pl.Int32, "stream": pl.Int64, "launches": pl.UInt32, "window_ns": pl.Int64,
           "max": pl.Int64, "mean": pl.Float64, "p50": pl.Int64, "p95": pl.Int64, "at_max_ns": pl.Int64,
           "empty_ns": pl.Int64, "full_ns": pl.Int64}


def series(ops: pl.LazyFrame) -> pl.LazyFrame:
    """``SERIES``: one row per change of a stream's queue, its length from ``at_ns`` until the next row (the
    last row, the stream's last end, is 0). ``ops``: lane, rank, stream, ``at`` (the launching call's start;
    null: launch not traced, left out), end. An operation that ends before its call began (clocks that
    disagree) is left out: it was never queued."""
    ops = _queued(ops)
    events = pl.concat([ops.select(*KEYS, at_ns="at", delta=pl.lit(1, pl.Int64)),
                        ops.select(*KEYS, at_ns="end", delta=pl.lit(-1, pl.Int64))])
    steps = events.group_by(*KEYS, "at_ns").agg(pl.col("delta").sum()).sort(*KEYS, "at_ns", nulls_last=True)
    steps = steps.with_columns(queue=pl.col("delta").cum_sum().over(KEYS))
    return steps.filter(pl.col("delta") != 0).select(*SERIES).cast(SERIES)  # type: ignore[arg-type]


def _queued(ops: pl.LazyFrame) -> pl.LazyFrame:
    return ops.filter(pl.col("at").is_not_null() & (pl.col("end") >= pl.col("at")))


def summary(ops: pl.LazyFrame) -> pl.LazyFrame:
    """``SUMMARY``: per stream of ``ops`` (as ``series`` takes them) with a window longer than 0, its queue
    summarised over its window (``report.launches.LaunchQueue``)."""
    steps = series(ops).with_columns(dur=(pl.col("at_ns").shift(-1).over(KEYS) - pl.col("at_ns")).fill_null(0))
    queue, dur = pl.col("queue"), pl.col("dur")
    window = dur.sum()
    stats = steps.group_by(KEYS).agg(
        window_ns=window,
        max=queue.max(),
        mean=(queue * dur).sum() / window,
        p50=_weighted(0.5),
        p95=_weighted(0.95),
        at_max_ns=dur.filter(queue == queue.max()).sum(),
        empty_ns=dur.filter(queue == 0).sum(),
        full_ns=dur.filter(queue >= FULL_QUEUE).sum(),
    ).filter(pl.col("window_ns") > 0)
    counts = _queued(ops).group_by(KEYS).agg(launches=pl.len())
    joined = stats.join(counts, on=KEYS, nulls_equal=True)
    return joined.select(*SUMMARY).cast(SUMMARY).sort("lane", "stream", nulls_last=True)  # type: ignore[arg-type]


def _weighted(q: float) -> pl.Expr:
    """The least queue length the stream stays at or under for a share ``q`` of its window."""
    order = pl.col("queue")
    held = pl.col("dur").sort_by(order).cum_sum()
    return order.sort().filter(held >= q * pl.col("dur").sum()).first()
