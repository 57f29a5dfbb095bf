"""Interval arithmetic over span tables, vectorised: union per group, gaps between merged intervals.

The sweep is the classic one (sort by start; a new merged interval begins where a start passes the running
maximum of the ends before it), written as polars expressions so it runs over millions of spans.
"""

from __future__ import annotations

import polars as pl


def merge(frame: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Merged (union) intervals per group: columns ``by`` + ``start``, ``end``, sorted. Pieces are contiguous
    after the sort, so the k-th row that opens a piece pairs with the k-th row that closes one (no group-by).

    The running maximum of the ends is a window per group; in a big frame, one cumulative pass over the
    whole frame instead (``_flat``)."""
    if frame.is_empty():
        return frame.select(*by, start, end).clear()
    ordered, group = _ordered(frame.select(*by, start, end), by, start)
    flat = _flat(ordered, group, start, end) if ordered.height >= _KEYED_ROWS else None
    if flat is not None:
        reach, opens = flat
    else:
        reach = pl.col(end).cum_max().over(group)
        opens = (pl.col(start) > reach.shift(1).over(group)).fill_null(True)
    ordered = ordered.with_columns(reach=reach, opens=opens)
    closes = pl.col("opens").shift(-1).fill_null(True)
    heads = ordered.filter("opens").select(*by, start)
    tails = ordered.filter(closes).select(pl.col("reach").alias(end))
    return heads.with_columns(tails[end])


#: Moved times stay below this (int64 holds 2**63).
_FLAT_LIMIT = 2**62


def _flat(ordered: pl.DataFrame, group: list[str], start: str, end: str) -> tuple[pl.Expr, pl.Expr] | None:
    """The running maximum of the ends (``reach``) and the rows that open a piece, in one cumulative pass
    over a frame sorted by ``group`` then ``start``: each group's times are moved into a range of their own,
    above every earlier group's (group number × the frame's time width), so no group sees another's ends.
    None where the moved times could overflow, or a time is missing."""
    number = _number(group)
    lo, hi, last, missing = ordered.select(
        lo=pl.col(start).min(), hi=pl.col(end).max(), last=number.max(),
        missing=pl.col(start).null_count() + pl.col(end).null_count(),
    ).row(0)
    if missing or (last + 2) * (hi - lo + 1) >= _FLAT_LIMIT:
        return None
    offset = number * (hi - lo + 1) - lo  # group g's times land in [g·width, (g+1)·width)
    running = (pl.col(end) + offset).cum_max()
    return running - offset, (pl.col(start) + offset > running.shift(1)).fill_null(True)


def _number(group: list[str]) -> pl.Expr:
    """Each row's group number in a frame sorted by ``group``: 0, 1, ... in order (keys compared null-safely);
    a keyed frame's ``_group`` is that number already."""
    if group == [_GROUP]:
        return pl.col(_GROUP).cast(pl.Int64)
    if not group:
        return pl.lit(0, pl.Int64)
    changed = pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift(1)) for c in group)
    return changed.fill_null(False).cast(pl.Int64).cum_sum()


#: Above this many rows, string group keys are sorted once per distinct value, not once per row.
_KEYED_ROWS = 10_000
_GROUP = "_group"  # the number a keyed frame's groups get


def _ordered(frame: pl.DataFrame, by: list[str], start: str) -> tuple[pl.DataFrame, list[str]]:
    """``frame`` sorted by ``by`` then ``start``, and the columns that tell its groups apart. A big frame
    grouped by strings (lane names) gets one integer per group, numbered in the groups' own sort order, and
    is sorted by that instead: the same order, without comparing strings row by row."""
    if frame.height < _KEYED_ROWS or all(frame.schema[c] != pl.String for c in by):
        return frame.sort(*by, start), by
    groups = frame.select(by).unique().sort(by).with_row_index(_GROUP)
    keyed = frame.join(groups, on=by, how="left", nulls_equal=True)
    return keyed.sort(_GROUP, start), [_GROUP]


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
