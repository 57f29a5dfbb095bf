"""The launch queue per stream and the launch delays per operator, on hand-counted timelines."""

from __future__ import annotations

import polars as pl
import pytest

from pipebubble import spans
from pipebubble.analysis.launch import launch_part, queue_series, summary

GPU, CPU = "rank0/gpu0", "rank0/pid7/tid1"


def table(rows: list[tuple]) -> pl.DataFrame:
    """Spans of rank 0 from (kind, name, start, end, stream, correlation) rows: a stream puts a row on the GPU,
    none on the host thread."""
    frame = pl.DataFrame(rows, schema=["kind", "name", "start", "end", "stream", "correlation"], orient="row")
    on_gpu = pl.col("stream").is_not_null()
    return spans.conform(frame.with_columns(
        source=pl.lit("t"), rank=pl.lit(0), pid=pl.when(~on_gpu).then(pl.lit(7)), tid=pl.when(~on_gpu).then(pl.lit(1)),
        device=pl.when(on_gpu).then(pl.lit(0)), lane=pl.when(on_gpu).then(pl.lit(GPU)).otherwise(pl.lit(CPU))))


def launch(corr: int, at: int, start: int, end: int, stream: int = 7, name: str = "k") -> list[tuple]:
    """A kernel on ``stream`` over [start, end) and the call that launched it at ``at`` (1 ns long)."""
    return [("runtime", "cudaLaunchKernel", at, at + 1, None, corr), ("kernel", name, start, end, stream, corr)]


#: Stream 7, counted by hand (+1 at a launch, −1 at an end): k1 launched at 0 runs [5,10), k2 at 1 runs
#: [10,20), k3 at 2 runs [20,30), k4 at 12 runs [30,40), k5 at 45 runs [46,50). The queue:
#:   [0,1) 1, [1,2) 2, [2,10) 3, [10,12) 2, [12,20) 3, [20,30) 2, [30,40) 1, [40,45) 0, [45,50) 1; window 50 ns.
STREAM_7 = [*launch(1, 0, 5, 10), *launch(2, 1, 10, 20), *launch(3, 2, 20, 30), *launch(4, 12, 30, 40),
            *launch(5, 45, 46, 50)]
#: Stream 9: one kernel launched at 100 running [101, 104): queue 1 for 4 ns, window 4 ns.
STREAM_9 = launch(6, 100, 101, 104, stream=9)


def test_queue_series_matches_the_hand_count():
    series = queue_series(table(STREAM_7))
    assert series.select("at_ns", "queue").rows() == [(0, 1), (1, 2), (2, 3), (10, 2), (12, 3), (20, 2), (30, 1),
                                                      (40, 0), (45, 1), (50, 0)]


def test_queue_summary_matches_the_hand_count():
    part = launch_part(table(STREAM_7 + STREAM_9), alone=True)
    seven, nine = summary.launch_queues([part])
    # held: 1 → 1+10+5 = 16 ns; 2 → 1+2+10 = 13; 3 → 8+8 = 16; 0 → 5; window 50
    assert (seven.stream, seven.launches, seven.window_ns, seven.max) == (7, 5, 50, 3)
    assert seven.mean == pytest.approx((1 * 16 + 2 * 13 + 3 * 16) / 50)
    assert (seven.at_max_ns, seven.empty_ns, seven.full_ns) == (16, 5, 0)
    # time-weighted: at or under 1 for 21/50 (0 and 1), under 2 for 34/50, under 3 for all
    assert (seven.p50, seven.p95) == (2, 3)
    assert (nine.stream, nine.launches, nine.window_ns, nine.max, nine.mean, nine.p50, nine.empty_ns) == (
        9, 1, 4, 1, 1.0, 1, 0)


def test_a_kernel_without_its_launch_is_never_queued():
    rows = [*STREAM_9, ("kernel", "untraced", 200, 210, 9, None)]
    (nine,) = summary.launch_queues([launch_part(table(rows), alone=True)])
    assert (nine.launches, nine.window_ns) == (1, 4)


def test_launch_delays_per_innermost_operator():
    """Operators nest on the thread: ``outer`` [0,100) holds ``inner`` [10,20) and the calls at 12 (inside
    inner) and 30 (outer only); a call at 150 is under no operator."""
    rows = [("cpu_op", "outer", 0, 100, None, None), ("cpu_op", "inner", 10, 20, None, None),
            *launch(1, 12, 40, 45),  # delay 28 > kernel 5
            *launch(2, 30, 45, 95),  # delay 15 < kernel 50
            *launch(3, 150, 151, 160)]  # delay 1 < kernel 9, no operator
    delays = {d.operator: d for d in summary.launch_delays([launch_part(table(rows), alone=True)])}
    assert set(delays) == {"inner", "outer", None}
    inner, outer, none = delays["inner"], delays["outer"], delays[None]
    assert (inner.count, inner.total_ns, inner.max_ns, inner.median_ns, inner.kernel_mean_ns, inner.over_share) == (
        1, 28, 28, 28.0, 5.0, 1.0)
    assert (outer.count, outer.total_ns, outer.kernel_mean_ns, outer.over_share) == (1, 15, 50.0, 0.0)
    assert (none.count, none.total_ns) == (1, 1)
    assert [d.operator for d in summary.launch_delays([launch_part(table(rows), alone=True)])] == [
        "inner", "outer", None]  # most total delay first


def test_operators_that_touch_do_not_nest_and_medians_combine_exactly():
    """``a`` [0,10) then ``b`` [10,20) on the thread: the call at 10 is ``b``'s. Two files' parts give the median
    of all their delays, not of their medians."""
    first = [("cpu_op", "a", 0, 10, None, None), ("cpu_op", "b", 10, 20, None, None), *launch(1, 10, 14, 15),
             *launch(2, 11, 21, 22), *launch(3, 12, 42, 43)]  # b: delays 4, 10, 30
    second = [("cpu_op", "b", 0, 10, None, None), *launch(1, 1, 3, 4)]  # b: delay 2
    parts = [launch_part(table(rows), alone=False) for rows in (first, second)]
    (b,) = summary.launch_delays(parts)
    assert (b.operator, b.count, b.total_ns, b.max_ns, b.median_ns) == ("b", 4, 46, 30, 7.0)
