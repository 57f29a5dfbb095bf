"""Interval logic against a naive Python sweep, on hand-made and generated intervals."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.analysis.intervals import gaps, merge, union_stats

intervals = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 10_000), st.integers(0, 500)), max_size=60
)


def frame(rows):
    return pl.DataFrame([(g, s, s + d) for g, s, d in rows], schema=["g", "start", "end"], orient="row")


def naive_merge(items):
    out = []
    for s, e in sorted(items):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


def test_hand_computed_union():
    spans = frame([("a", 0, 10), ("a", 5, 10), ("a", 30, 5), ("a", 35, 0), ("b", 100, 1)])
    stats = {r["g"]: r for r in union_stats(spans, ["g"]).iter_rows(named=True)}
    assert stats["a"]["busy_ns"] == 15 + 5 and stats["a"]["window_start_ns"] == 0
    assert stats["a"]["window_end_ns"] == 35 and stats["a"]["idle_ns"] == 15
    assert stats["b"]["busy_ns"] == 1 and stats["b"]["idle_ns"] == 0
    assert gaps(spans, ["g"]).rows() == [("a", 15, 30)]


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_merge_equals_naive(rows):
    merged = merge(frame(rows), ["g"]) if rows else None
    for group in {g for g, _, _ in rows}:
        expected = naive_merge([(s, s + d) for g, s, d in rows if g == group])
        got = [(s, e) for g, s, e in merged.rows() if g == group]
        assert got == expected


keyed_rows = st.lists(
    st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 9), st.integers(0, 10_000), st.integers(0, 500)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(keyed_rows)
def test_big_frames_keyed_by_group_number_merge_the_same(rows):
    """A frame big enough to be sorted by a number per group (strings, nulls and a second key) gives the same
    rows in the same order as the plain sort."""
    from pipebubble.analysis import intervals

    table = pl.DataFrame([(g, k, s, s + d) for g, k, s, d in rows], schema=["g", "k", "start", "end"], orient="row")
    keys = (["g", "k"], ["g"], ["k"], [])  # several keys; one with nulls; one without (numbered apart); none
    plain = [merge(table, by) for by in keys]
    keyed_at = intervals._FLAT_ROWS
    intervals._FLAT_ROWS = 0
    try:
        assert [merge(table, by).rows() for by in keys] == [m.rows() for m in plain]
    finally:
        intervals._FLAT_ROWS = keyed_at


huge = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-(2**61), 2**61), st.integers(0, 2**60)), max_size=30
)


@pytest.mark.parametrize("cases", [intervals, huge], ids=["narrow", "too wide for one running maximum"])
def test_big_frames_merge_with_one_running_maximum_or_per_group(cases, monkeypatch):
    """Merged as a big frame is (one cumulative pass; a window per group where moved times could overflow):
    the naive sweep's answer."""
    from pipebubble.analysis import intervals as iv

    monkeypatch.setattr(iv, "_FLAT_ROWS", 0)

    @settings(max_examples=200, deadline=None)
    @given(cases)
    def check(rows):
        merged = merge(frame(rows), ["g"]) if rows else None
        for group in {g for g, _, _ in rows}:
            expected = naive_merge([(s, s + d) for g, s, d in rows if g == group])
            assert [(s, e) for g, s, e in merged.rows() if g == group] == expected

    check()


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_busy_plus_idle_is_window_and_gaps_fill_the_rest(rows):
    if not rows:
        return
    spans = frame(rows)
    stats = union_stats(spans, ["g"])
    gap_total = dict(gaps(spans, ["g"]).group_by("g").agg((pl.col("end") - pl.col("start")).sum()).rows())
    for r in stats.iter_rows(named=True):
        window = r["window_end_ns"] - r["window_start_ns"]
        assert r["busy_ns"] + r["idle_ns"] == window
        assert 0 <= r["busy_ns"] <= window
        assert gap_total.get(r["g"], 0) == r["idle_ns"]


def test_empty_and_single():
    empty = frame([])
    assert merge(empty, ["g"]).is_empty() and union_stats(empty, ["g"]).is_empty() and gaps(empty, ["g"]).is_empty()
    one = frame([("a", 5, 3)])
    assert union_stats(one, ["g"]).select("busy_ns", "idle_ns").row(0) == (3, 0)


def test_windowed_lane_table_equals_in_memory():
    """The out-of-core lane table (time windows, clipped spans) gives the same numbers as the in-memory one."""
    from conftest import shared

    from pipebubble.analysis.lanes import lane_table, lane_table_windowed
    from pipebubble.ingest import load

    spans = load([shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")], use_cache=False).spans
    whole = lane_table(spans)
    for rows in (1_000, 7_777, 10**9):
        assert lane_table_windowed(spans.lazy(), rows).equals(whole)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=400), st.integers(1, 50), st.integers(0, 10**6))
def test_time_edges_cut_windows_of_about_the_rows_asked(starts, rows, length):
    """Every start lies in one window; at most a bin (1/64 of a window's share of the time) more than a
    window's share of the rows start in one, however the starts bunch (all at one instant: one window)."""
    from collections import Counter

    from pipebubble.analysis.intervals import _EDGE_BINS, _EDGE_BINS_MAX, time_edges

    spans = pl.DataFrame({"start": starts}).with_columns(end=pl.col("start") + length)
    n, edges = time_edges(spans.lazy(), rows)
    assert n == len(starts) and edges == sorted(set(edges))
    assert edges[0] == min(starts) and edges[-1] == max(max(starts), max(starts) + length) + 1
    counts = [sum(a <= s < b for s in starts) for a, b in zip(edges, edges[1:], strict=False)]
    assert sum(counts) == n
    k = -(-n // rows)
    width = -(-(max(starts) - min(starts) + 1) // min(_EDGE_BINS_MAX, _EDGE_BINS * k))
    bin_rows = max(Counter((s - min(starts)) // width for s in starts).values())
    assert max(counts) <= -(-n // k) + bin_rows
    assert time_edges(spans.lazy().filter(pl.col("start") < 0), rows) == (0, [])
