"""Exact medians in two passes (a spilled table's kernel durations): the same as polars' median per group,
whatever the values' spread, ties, group sizes (one value, even counts) and null group keys."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.analysis.breakdown.medians import exact

VALUES = st.one_of(st.integers(0, 16), st.integers(0, 10**7), st.integers(2**61, 2**62 - 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", None]), VALUES), min_size=1, max_size=200))
def test_exact_medians_equal_polars_medians(rows):
    frame = pl.DataFrame(rows, schema={"name": pl.String, "dur": pl.Int64}, orient="row")
    got = exact(frame.lazy(), "name", "dur").sort("name")
    want = frame.group_by("name").agg(median=pl.col("dur").median()).sort("name")
    assert got.equals(want)


def test_many_values_in_one_bucket():
    # 10,001 values within one bucket (1/2048 of their size): the median bucket holds them all, still exact.
    values = [10**9 + k for k in range(10_001)]
    frame = pl.DataFrame({"name": ["k"] * len(values), "dur": values[::-1]})
    assert exact(frame.lazy(), "name", "dur")["median"].item() == 10**9 + 5000
