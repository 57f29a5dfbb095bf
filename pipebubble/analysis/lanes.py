"""Busy and idle per lane (ARCHITECTURE.md, "lanes").

GPU lanes come twice: one per (rank or process, device), the union of its kernel, memcpy, memset and comm
work over all streams, and one per stream. CPU lanes (one per thread) count top-level spans of work
(operators, runtime calls, syncs, host-side communication); annotations and steps are labels, not work,
and nested spans are never counted twice because the busy time is a union.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import union_stats
from pipebubble.spans import GPU_WORK

CPU_WORK = ("cpu_op", "runtime", "sync", "comm")
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
    """One row per lane, GPU device lanes first, then their streams, then CPU threads."""
    gpu = spans.filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK))
    cpu = spans.filter(pl.col("device").is_null() & pl.col("kind").is_in(CPU_WORK))
    devices = _stats(gpu, ["lane"], "gpu", order=0).with_columns(stream=pl.lit(None, pl.Int64))
    streams = _stats(gpu, ["lane", "stream"], "gpu", order=1).with_columns(
        lane=pl.format("{}/stream{}", "lane", "stream")
    )
    threads = _stats(cpu, ["lane"], "cpu", order=2)
    table = pl.concat([devices, streams, threads], how="diagonal")
    return table.sort("order", "rank", "pid", "device", "stream", "tid", "lane", nulls_last=True).select(LANE_COLUMNS)


def _stats(frame: pl.DataFrame, keys: list[str], kind: str, order: int) -> pl.DataFrame:
    """Union per lane (and stream); the lane's other attributes are the same on all its spans."""
    stats = union_stats(frame.select(*keys, "start", "end"), keys)
    attrs = frame.group_by(keys).agg(pl.col(k).first() for k in _KEYS[1:] if k not in keys)
    return stats.join(attrs, on=keys).with_columns(kind=pl.lit(kind), order=pl.lit(order))
