"""The reduce's shortcuts give what the plain definitions give: a group's union length in one sorted pass
(``intervals.unions``) is the length of its merged intervals (``intervals.merge``); the step windows and the
stage table of work already clipped are those of the work before; a schedule's keys and a split replay's
halves are the ones written out action by action."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.analysis.intervals import merge, unions
from pipebubble.analysis.pipeline import metrics as pm
from pipebubble.analysis.schedule.replay import StageTimes, action_duration, simulate
from pipebubble.analysis.schedule.schedules import Action, Schedule, make_schedule, numbered

SCHEMA = {"g": pl.Int32, "h": pl.String, "start": pl.Int64, "end": pl.Int64}


def by_merge(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group: the merged intervals' total length, first start and last end."""
    lengths = merge(frame, by).group_by(by).agg(ns=(pl.col("end") - pl.col("start")).sum())
    edges = frame.group_by(by).agg(start=pl.col("start").min(), end=pl.col("end").max())
    return lengths.join(edges, on=by, nulls_equal=True).sort(by, nulls_last=True)


intervals = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", None]), st.integers(-50, 100), st.integers(0, 40)),
    min_size=1, max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_unions_are_the_merged_lengths(rows):
    frame = pl.DataFrame([(g, h, s, s + d) for g, h, s, d in rows], schema=SCHEMA, orient="row")
    for by in (["g"], ["h"], ["g", "h"]):
        expected = by_merge(frame, by)
        got = unions(frame, by).sort(by, nulls_last=True).select(expected.columns)
        assert got.equals(expected), by


def test_unions_of_nothing_and_of_times_too_far_apart_to_move():
    empty = pl.DataFrame(schema=SCHEMA)
    assert unions(empty, ["g"]).columns == ["g", "ns", "start", "end"]
    far = pl.DataFrame([(0, "a", -(2**61), 0), (0, "a", -5, 2**61), (1, "a", 3, 9)], schema=SCHEMA, orient="row")
    assert unions(far, ["g"]).sort("g").equals(by_merge(far, ["g"]))


def work(p: int = 3, m: int = 4, steps: int = 2) -> pl.DataFrame:
    """Passes of ``p`` stages (two kernels each, overlapping), communication and input work before each step."""
    rows = []
    for k in range(steps):
        base = k * 1_000_000
        rows.append((0, "rank0/gpu0", "compute", base, base + 500, None, None, None, k))  # outside the passes
        for s in range(p):
            for j in range(m):
                for phase, at in (("forward", 1_000 + 100 * (s + j)), ("backward", 50_000 + 200 * (p - s + j))):
                    t = base + at * 10
                    rows.append((s, f"rank{s}/gpu0", "compute", t, t + 600, phase, j, 0, k))
                    rows.append((s, f"rank{s}/gpu0", "compute", t + 400, t + 900, phase, j, 0, k))
            rows.append((s, f"rank{s}/gpu0", "comm", base + 900_000, base + 2_000_000, None, None, None, k))
    schema = {"stage": pl.Int32, "lane": pl.String, "role": pl.String, "start": pl.Int64, "end": pl.Int64,
              "phase": pl.String, "microbatch": pl.Int32, "chunk": pl.Int32, "step": pl.Int32}
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_a_stage_table_of_clipped_work_with_its_windows_is_the_table_of_the_work():
    raw = pm.complete_steps(work())
    wins = pm.windows(raw)
    assert wins["window_start"].to_list() == [10_000, 1_010_000]  # passes alone define the windows
    clipped = pm.clip_to_windows(raw, wins)
    assert pm.windows(clipped).equals(wins)
    assert pm.stage_step_table(clipped, wins).equals(pm.stage_step_table(raw))
    assert pm.detect_schedule(clipped, pm.microbatch_counts(clipped)) == pm.detect_schedule(clipped)


def test_windows_without_passes_and_steps_some_stage_missed():
    bare = work().with_columns(phase=pl.lit(None, pl.String))
    wins = pm.windows(bare)
    assert wins["window_start"].to_list() == [0, 1_000_000]  # every compute span, without passes
    cut = work().filter(~((pl.col("step") == 1) & (pl.col("stage") == 2)))
    assert pm.complete_steps(cut)["step"].unique().to_list() == [0]


def test_numbered_keys_of_hand_written_and_unknown_actions():
    built = make_schedule("1f1b", 3, 4)
    own = Schedule("1f1b", 3, 4, 1, tuple(tuple(Action(a.phase, a.microbatch) for a in o) for o in built.orders))
    assert numbered(own) == numbered(built)
    unknown = Schedule("1f1b", 3, 4, 1, (built.orders[0], built.orders[1], built.orders[2][:-1] + (Action("B", 9),)))
    assert numbered(unknown) is None


def test_a_split_replay_without_weight_halves_the_backward():
    times = StageTimes(((10, 11),) * 2, ((7, 8),) * 2)
    plan = make_schedule("zero_bubble", 2, 2)
    assert [action_duration(plan, times, 0, Action(ph, 0)) for ph in "FBW"] == [10, 4, 3]
    assert [action_duration(plan, times, 1, Action(ph, 1)) for ph in "FBW"] == [11, 4, 4]
    assert simulate(plan, times).busy_ns == (10 + 11 + 7 + 8,) * 2
