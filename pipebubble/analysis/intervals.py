"""Interval arithmetic over span tables, vectorised: union per group, gaps between merged intervals.

The sweep is the classic one (sort by start; a new merged interval begins where a start passes the running
maximum of the ends before it), written as polars expressions so it runs over millions of spans.
"""

from __future__ import annotations

import polars as pl


def merge(frame: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Merged (union) intervals per group: columns ``by`` + ``start``, ``end``, sorted. Pieces are contiguous
    after the sort, so the k-th row that opens a piece pairs with the k-th row that closes one (no group-by)."""
    if frame.is_empty():
        return frame.select(*by, start, end).clear()
    ordered, group = _ordered(frame.select(*by, start, end), by, start)
    reach = pl.col(end).cum_max().over(group)
    opens = (pl.col(start) > reach.shift(1).over(group)).fill_null(True)
    ordered = ordered.with_columns(reach=reach).with_columns(opens=opens)
    closes = pl.col("opens").shift(-1).fill_null(True)
    heads = ordered.filter("opens").select(*by, start)
    tails = ordered.filter(closes).select(pl.col("reach").alias(end))
    return heads.with_columns(tails[end])


#: Above this many rows, string group keys are sorted once per distinct value, not once per row.
_KEYED_ROWS = 10_000


def _ordered(frame: pl.DataFrame, by: list[str], start: str) -> tuple[pl.DataFrame, list[str]]:
    """``frame`` sorted by ``by`` then ``start``, and the columns that tell its groups apart. A big frame
    grouped by strings (lane names) gets one integer per group, numbered in the groups' own sort order, and
    is sorted by that instead: the same order, without comparing strings row by row."""
    if frame.height < _KEYED_ROWS or all(frame.schema[c] != pl.String for c in by):
        return frame.sort(*by, start), by
    groups = frame.select(by).unique().sort(by).with_row_index("_group")
    keyed = frame.join(groups, on=by, how="left", nulls_equal=True)
    return keyed.sort("_group", start), ["_group"]


def union_stats(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group: ``busy_ns`` (length of the union), ``window_start_ns``/``window_end_ns`` (first and last
    busy instant) and ``idle_ns`` = window − busy."""
    merged = merge(frame, by)
    return merged.group_by(by, maintain_order=True).agg(
        busy_ns=(pl.col("end") - pl.col("start")).sum(),
        window_start_ns=pl.col("start").min(),
        window_end_ns=pl.col("end").max(),
    ).with_columns(idle_ns=pl.col("window_end_ns") - pl.col("window_start_ns") - pl.col("busy_ns"))


def gaps(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Idle gaps between merged intervals per group: ``by`` + ``start``, ``end`` (positive lengths only)."""
    merged = merge(frame, by)
    return (
        merged.with_columns(gap_start=pl.col("end").shift(1).over(by))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select(*by, start=pl.col("gap_start"), end=pl.col("start"))
    )


def top_level(frame: pl.DataFrame, by: str = "lane", *, keep_overhanging: bool = False) -> pl.DataFrame:
    """The top-level spans of each ``by`` group (a CPU thread's operators, not the calls nested inside them),
    ordered by group, start, and longest first at equal starts.

    A span is top-level when it starts at or after the end of every span before it. With
    ``keep_overhanging``, a span that starts inside an earlier one but ends after it is kept too: a CPU
    stage's work (``work._cpu_work``) wants every stretch of work no other span covers, while a launch's
    context (``labels._launch_context``) wants disjoint operators to look the launch up in. Lanes need
    neither: their busy time is a union, so nesting never counts twice.
    """
    ordered = frame.sort(by, "start", pl.col("end"), descending=[False, False, True])
    reach = pl.col("end").cum_max().shift(1).over(by)
    top = (pl.col("start") >= reach).fill_null(True)
    return ordered.filter(top | (pl.col("end") > reach) if keep_overhanging else top)
