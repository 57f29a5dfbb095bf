"""Exact medians per group in two passes that hold a few values per group, not every value: how a spilled
table's kernel durations get their medians within the memory budget.

Pass one counts each group's values per bucket of a key that orders values as they are (the bit length,
then the top 12 bits: buckets 1/2048 of their value wide) and finds the buckets that hold the middle
ranks; pass two reads only the values in those buckets, and the median lies halfway between the two
middle values, computed as ``Expr.median`` computes it (to the last bit).
"""

from __future__ import annotations

import polars as pl

_TOP = 12  # bits of a value kept in its bucket's key


def _bucket(value: str) -> pl.Expr:
    """A key that orders non-negative Int64 values as they are: their bit length, then their top bits."""
    v = pl.col(value)
    length = (64 - v.bitwise_leading_zeros()).cast(pl.Int64)
    shift = (length - _TOP).clip(lower_bound=0)
    return length * (1 << _TOP) + (v // (pl.lit(2, pl.Int64).pow(shift))).cast(pl.Int64)


def exact(values: pl.LazyFrame, by: str, value: str) -> pl.DataFrame:
    """``by``, ``median``: the exact median of ``value`` (non-negative Int64) per group of ``values``. Names
    (``by`` of strings) are grouped as categories: a streaming group-by keyed by strings holds several times
    as much."""
    named = values.collect_schema()[by] == pl.String
    if named:
        values = values.with_columns(pl.col(by).cast(pl.Categorical))
    found = _exact(values, by, value)
    return found.with_columns(pl.col(by).cast(pl.String)) if named else found


def _exact(values: pl.LazyFrame, by: str, value: str) -> pl.DataFrame:
    counts = values.group_by(by, bucket=_bucket(value)).agg(n=pl.len()).collect(engine="streaming")
    counts = counts.sort(by, "bucket").with_columns(
        after=pl.col("n").cum_sum().over(by), total=pl.col("n").sum().over(by)
    )
    ranks = []
    for name, rank in (("low", (pl.col("total") - 1) // 2), ("high", pl.col("total") // 2)):
        # The bucket holding the rank-th value (0-based) of each group: the first whose running count passes it.
        held = counts.filter(pl.col("after") > rank).group_by(by).agg(pl.all().sort_by("bucket").first())
        ranks.append(held.select(by, "bucket", which=pl.lit(name), at=rank - (pl.col("after") - pl.col("n"))))
    wanted = pl.concat(ranks)
    inside = values.with_columns(bucket=_bucket(value)).join(
        wanted.select(by, "bucket").unique().lazy(), on=[by, "bucket"], how="semi", nulls_equal=True
    )
    picked = inside.select(by, "bucket", value).collect(engine="streaming").sort(by, "bucket", value)
    picked = picked.with_columns(at=pl.int_range(pl.len()).over(by, "bucket").cast(pl.Int64))
    middle = wanted.join(picked, on=[by, "bucket", "at"], how="left", nulls_equal=True)
    v = pl.col(value).cast(pl.Float64)
    low, high = v.filter(pl.col("which") == "low").first(), v.filter(pl.col("which") == "high").first()
    return middle.group_by(by).agg(median=low + (high - low) * 0.5)  # as polars interpolates
