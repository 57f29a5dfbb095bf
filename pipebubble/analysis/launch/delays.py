"""Operators' launch delays: each launched GPU operation's delay (its start − its launching call's start, never
below 0) under the operator that launched it, the innermost CPU operator open on the launching thread at the
call's start (``report.launches``' definitions).

The innermost open operator is found by depth, not by testing every operator of the thread: a thread's
operators nest, so the one open at depth k at an instant is the last one of depth k to start before it. A
sweep over the operators' starts (+1) and ends (−1) gives each operator its depth and each call the number of
operators open at its start (n); the call's operator is the last of depth n − 1 to start at or before it.
"""

from __future__ import annotations

import polars as pl

#: per operator (null: none open at the call), one file's sums and its own exact median
SUMS = {"operator": pl.String, "count": pl.UInt32, "total": pl.Int64, "max": pl.Int64, "median": pl.Float64,
        "kernel_total": pl.Int64, "over": pl.UInt32}
#: per operator, the delays' value counts (for exact medians over several files)
COUNTS = {"operator": pl.String, "d": pl.Int64, "n": pl.UInt32}


def launched(ops: pl.LazyFrame, cpu: pl.LazyFrame) -> pl.LazyFrame:
    """operator, d (the delay), dur (the operation's duration): one row per launched operation of ``ops``
    (at_lane, at: its launching call's thread and start; start, end: the operation's)."""
    probe = ops.select("at_lane", "at", d=(pl.col("start") - pl.col("at")).clip(lower_bound=0),
                       dur=pl.col("end") - pl.col("start"))
    return innermost(probe, cpu).select("operator", "d", "dur")


def innermost(calls: pl.LazyFrame, cpu: pl.LazyFrame) -> pl.LazyFrame:
    """``calls`` (at_lane, at, and any other columns, in no set order) with ``operator``: the name of the
    innermost CPU operator open at each call's start (``at``) on its thread (``at_lane``); null where none is."""
    lanes = calls.select(lane="at_lane").unique()
    ops = cpu.filter(pl.col("kind") == "cpu_op").join(lanes, on="lane", how="semi").select("lane", "name", "start",
                                                                                            "end")
    # ends before starts at one instant (an operator that ends as another begins does not hold it), an outer
    # operator's start before an inner one's that begins with it
    events = pl.concat([
        ops.select("lane", t="start", delta=pl.lit(1, pl.Int64), tie=-pl.col("end")),
        ops.select("lane", t="end", delta=pl.lit(-1, pl.Int64), tie=pl.lit(None, pl.Int64)),
    ]).sort("lane", "t", "delta", "tie").with_columns(open=pl.col("delta").cum_sum().over("lane"))
    depths = events.filter(pl.col("delta") == 1).select("lane", start="t", depth=pl.col("open") - 1, end=-pl.col("tie"))
    named = depths.join(ops.unique(["lane", "start", "end"], keep="first"), on=["lane", "start", "end"], how="left")
    probe = calls.rename({"at_lane": "lane"}).sort("at")
    opened = probe.join_asof(events.select("lane", "t", "open").sort("t"), left_on="at", right_on="t", by="lane",
                             strategy="backward", check_sortedness=False)
    opened = opened.with_columns(depth=(pl.col("open") - 1).fill_null(-1))  # -1: no operator open (no match)
    found = opened.join_asof(named.select("lane", "depth", "name", op_start="start", op_end="end").sort("op_start"),
                             left_on="at", right_on="op_start", by=["lane", "depth"], strategy="backward",
                             check_sortedness=False)
    held = pl.when(pl.col("op_end") > pl.col("at")).then(pl.col("name"))
    return found.with_columns(operator=held).drop("open", "depth", "name", "op_start", "op_end", "t", strict=False)


def sums(rows: pl.LazyFrame, counted: bool) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(``SUMS``, ``COUNTS``) of ``launched``'s rows; ``counted``: with the value counts (else empty)."""
    d = pl.col("d")
    per = rows.group_by("operator").agg(count=pl.len(), total=d.sum(), max=d.max(), median=d.median(),
                                        kernel_total=pl.col("dur").sum(), over=(d > pl.col("dur")).sum())
    values = rows.group_by("operator", "d").agg(n=pl.len()) if counted else pl.LazyFrame(schema=COUNTS)
    return per.select(*SUMS).cast(SUMS), values.select(*COUNTS).cast(COUNTS)  # type: ignore[arg-type]
