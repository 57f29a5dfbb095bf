"""Busy and idle per lane (ARCHITECTURE.md, "lanes").

GPU lanes come twice: one per (rank or process, device), the union of its kernel, memcpy, memset and comm
work over all streams, and one per stream. CPU lanes (one per thread) count top-level spans of work
(operators, runtime calls, syncs, host-side communication); annotations and steps are labels, not work,
and nested spans are never counted twice because the busy time is a union.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE, time_edges, union_stats
from pipebubble.spans import CPU_WORK, GPU_WORK

LANE_COLUMNS = [
    "lane",
    "kind",
    "rank",
    "pid",
    "tid",
    "device",
    "stream",
    "busy_ns",
    "idle_ns",
    "window_start_ns",
    "window_end_ns",
]
_KEYS = ["lane", "rank", "pid", "tid", "device", "stream"]


def lane_table(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per lane, GPU device lanes first, then their streams, then CPU threads. Each level is merged
    by its own keys (a device's or thread's lane; a stream's lane and stream), one number per row to sort
    by; a lane's other attributes are the same on all its spans."""
    gpu = pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)
    cpu = pl.col("device").is_null() & pl.col("kind").is_in(CPU_WORK)
    work, cols = spans.lazy().filter(pl.col("lane").is_not_null()), [*_KEYS, "start", "end"]
    on_gpu, on_cpu = pl.collect_all([work.filter(gpu).select(cols), work.filter(cpu).select(cols)], engine=ENGINE)
    streams = on_gpu.filter(pl.col("stream").is_not_null())
    levels = [
        _level(on_gpu, ["lane"], stream=pl.lit(None, pl.Int64), kind=pl.lit("gpu")),
        _level(streams, ["lane", "stream"], lane=pl.format("{}/stream{}", "lane", "stream"), kind=pl.lit("gpu")),
        _level(on_cpu, ["lane"], kind=pl.lit("cpu")),
    ]
    return sort_lanes(pl.concat(levels, how="diagonal_relaxed"))


def _level(rows: pl.DataFrame, by: list[str], **named: pl.Expr) -> pl.LazyFrame:
    """One level's lanes: the union of ``rows`` per group ``by``, with each group's first other attributes,
    then the columns ``named``."""
    stats = union_stats(rows.select(*by, "start", "end"), by)
    attrs = rows.lazy().group_by(by).agg(pl.col(k).first() for k in _KEYS if k not in by)
    return stats.lazy().join(attrs, on=by).with_columns(**named)


def sort_lanes(table: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """GPU device lanes first, then their streams, then CPU threads; by rank, process, device, stream, thread."""
    order = pl.when(pl.col("kind") == "cpu").then(2).when(pl.col("stream").is_null()).then(0).otherwise(1)
    ordered = table.lazy().sort(order, "rank", "pid", "device", "stream", "tid", "lane", nulls_last=True)
    return ordered.select(LANE_COLUMNS).collect(engine=ENGINE)


def lane_table_windowed(spans: pl.LazyFrame, rows_per_window: int = 1_000_000) -> pl.DataFrame:
    """``lane_table`` of a span table too big for memory, read in time windows of about ``rows_per_window``
    spans starting in each (``intervals.time_edges``). Exact: spans are clipped to each window, the union of
    clipped spans adds up over disjoint windows, and clipping moves no lane's first or last busy instant."""
    columns = ["lane", "kind", "rank", "pid", "tid", "device", "stream", "start", "end"]
    gpu = pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)
    work = spans.select(columns).filter(gpu | (pl.col("device").is_null() & pl.col("kind").is_in(CPU_WORK)))
    n, edges = time_edges(work, rows_per_window)
    if not n:
        return lane_table(work.collect())
    pieces = []
    for a, b in zip(edges, edges[1:], strict=False):
        inside = (pl.col("start") < b) & ((pl.col("end") > a) | (pl.col("start") >= a))
        window = work.filter(inside).with_columns(
            pl.col("start").clip(lower_bound=a), pl.col("end").clip(upper_bound=b)
        )
        pieces.append(lane_table(window.collect()))
    keys = ["lane", "kind", "rank", "pid", "tid", "device", "stream"]
    total = (
        pl.concat(pieces)
        .group_by(keys, maintain_order=True)
        .agg(pl.col("busy_ns").sum(), pl.col("window_start_ns").min(), pl.col("window_end_ns").max())
    )
    return sort_lanes(
        total.with_columns(idle_ns=pl.col("window_end_ns") - pl.col("window_start_ns") - pl.col("busy_ns"))
    )
