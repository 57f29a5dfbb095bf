"""GPU annotations (Kineto's ``gpu_user_annotation`` ranges: ``kind == "gpu_annotation"`` on a device lane, and
a profiler step's copy there, which ingest keeps as ``step``) and the GPU operations that lie within them
(``report.launches``' definitions).

Each name's ranges are merged per lane and stream (``intervals.merge``); the operations a merged range holds
are found by position, not by a join of every range with every operation: on a stream sorted by start, the
operations starting inside a range are one run of positions (the first at or after its start, the last at or
before its end), of which those that also end inside it are kept. The rows made are as many as the
(range, operation) pairs there are, no more.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.spans import GPU_WORK

#: per annotation name: ranges, union length, sum of lengths, the operations within and their time
NAMES = {"name": pl.String, "count": pl.UInt32, "gpu_ns": pl.Int64, "sum_ns": pl.Int64,
         "kernel_count": pl.UInt32, "kernel_ns": pl.Int64}
#: per (annotation name, operation name) within it
KERNELS = {"name": pl.String, "kernel": pl.String, "count": pl.UInt32, "total": pl.Int64}
RANGES = ("gpu_annotation", "step")  # on a device lane: a user range or a profiler step as the GPU lived it
_ON = ["lane", "_stream"]  # a range's operations: on its own lane and stream (a null stream is one of its own)


def annotations(spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(``NAMES``, ``KERNELS``) of ``spans``' GPU annotations; both empty without any."""
    if not spans["kind"].is_in(RANGES).any():  # told from the column, not by a query
        return pl.DataFrame(schema=NAMES), pl.DataFrame(schema=KERNELS)
    on_gpu = pl.col("device").is_not_null()
    ranges = spans.filter(on_gpu & pl.col("kind").is_in(RANGES)).select(
        "lane", "name", "start", "end", _stream=pl.col("stream").fill_null(-1))
    if ranges.is_empty():
        return pl.DataFrame(schema=NAMES), pl.DataFrame(schema=KERNELS)
    merged = merge(ranges, [*_ON, "name"])
    ops = spans.filter(on_gpu & pl.col("kind").is_in(GPU_WORK)).select(
        "lane", "start", "end", kernel="name", _stream=pl.col("stream").fill_null(-1))
    within = _within(merged, ops)
    kernels = within.group_by("name", "kernel").agg(count=pl.len(), total=(pl.col("end") - pl.col("start")).sum())
    per_name = ranges.group_by("name").agg(count=pl.len(), sum_ns=(pl.col("end") - pl.col("start")).sum())
    unions = merged.group_by("name").agg(gpu_ns=(pl.col("end") - pl.col("start")).sum())
    held = kernels.group_by("name").agg(kernel_count=pl.col("count").sum(), kernel_ns=pl.col("total").sum())
    names = per_name.join(unions, on="name", nulls_equal=True).join(held, on="name", how="left", nulls_equal=True)
    names = names.with_columns(pl.col("kernel_count").fill_null(0), pl.col("kernel_ns").fill_null(0))
    return names.select(*NAMES).cast(NAMES), kernels.select(*KERNELS).cast(KERNELS)  # type: ignore[arg-type]


def _within(merged: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each (merged range, operation it holds): the range's name, the operation's ``kernel``, start, end."""
    ops = ops.sort(*_ON, "start").with_columns(i=pl.int_range(pl.len()).over(_ON))
    starts = ops.select(*_ON, "i", at="start")
    pieces = merged.select(*_ON, "name", s="start", e="end")
    asof = {"right_on": "at", "by": _ON, "check_sortedness": False}
    first = pieces.sort("s").join_asof(starts.sort("at"), left_on="s", strategy="forward", **asof)
    last = first.rename({"i": "lo"}).drop("at").sort("e").join_asof(starts.sort("at"), left_on="e",
                                                                     strategy="backward", **asof)
    spans = last.rename({"i": "hi"}).filter(pl.col("lo").is_not_null() & (pl.col("hi") >= pl.col("lo")))
    pairs = spans.select(*_ON, "name", "e", i=pl.int_ranges("lo", pl.col("hi") + 1)).explode("i")
    return pairs.join(ops, on=[*_ON, "i"]).filter(pl.col("end") <= pl.col("e")).select("name", "kernel", "start",
                                                                                        "end")
