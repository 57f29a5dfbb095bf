"""Operators' launch delays: each launched GPU operation's delay (its start − its launching call's start, never
below 0) under the operator that launched it, the innermost CPU operator open on the launching thread at the
call's start (``report.launches``' definitions).

The innermost open operator is ``launches.innermost``'s.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.launches import innermost

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


def sums(rows: pl.LazyFrame, counted: bool) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(``SUMS``, ``COUNTS``) of ``launched``'s rows; ``counted``: with the value counts (else empty)."""
    d = pl.col("d")
    per = rows.group_by("operator").agg(count=pl.len(), total=d.sum(), max=d.max(), median=d.median(),
                                        kernel_total=pl.col("dur").sum(), over=(d > pl.col("dur")).sum())
    values = rows.group_by("operator", "d").agg(n=pl.len()) if counted else pl.LazyFrame(schema=COUNTS)
    return per.select(*SUMS).cast(SUMS), values.select(*COUNTS).cast(COUNTS)  # type: ignore[arg-type]
