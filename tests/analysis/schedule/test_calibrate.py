"""The calibrated replay: hand-offs, set-up and tails measured from the stage work, so that replaying the
detected schedule meets the measured step (hand-computed timelines, synthetic traces, the bundled samples
and the real CPU pipelines)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import write_pipeline

from pipebubble.analysis.pipeline import metrics as pm
from pipebubble.analysis.pipeline.report import combine
from pipebubble.analysis.pipeline.work import WORK_COLUMNS
from pipebubble.analysis.registry import stages_part
from pipebubble.analysis.schedule import calibrate, schedules, whatif
from pipebubble.errors import StageSpecError
from pipebubble.ingest import find_traces, read_file
from pipebubble.options import Options

MS = 1_000_000
SCHEMA = dict(zip(WORK_COLUMNS, [pl.Int32, pl.String, pl.String, pl.Int64, pl.Int64, pl.String, pl.Int32,
                                 pl.Int32, pl.Int32], strict=True))
PHASE = {"F": "forward", "B": "backward", "W": "weight"}


def frame(rows: list[tuple]) -> pl.DataFrame:
    """Work rows (stage, phase or None for other compute, micro-batch, start ms, end ms), step 0."""
    return pl.DataFrame(
        [(s, f"stage{s}", "compute", a * MS, b * MS, PHASE.get(ph, ph), j, s, 0) for s, ph, j, a, b in rows],
        schema=SCHEMA, orient="row",
    )


def prepared(work: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """As the report prepares it: complete steps cut to their windows; and the mean step (window) time."""
    work = pm.complete_steps(work)
    wins = pm.windows(work)
    steps = wins.height
    return pm.clip_to_windows(work, wins), int((wins["window_end"] - wins["window_start"]).sum()) // steps


def from_simulation(sim: whatif.Simulation, steps: int = 1, tail: tuple[int, ...] = ()) -> pl.DataFrame:
    """A work table from a simulated timeline: every pass one compute span (chunk = virtual stage), steps
    repeated one after another, and ``tail[s]`` ns of other compute after stage s's last pass."""
    p = sim.schedule.stages
    rows = []
    for k in range(steps):
        shift = k * (sim.step_time_ns + 10 * MS)
        for row in sim.actions:
            for t in row:
                a = t.action
                rows.append((t.stage, f"stage{t.stage}", "compute", t.start_ns + shift, t.end_ns + shift,
                             PHASE[a.phase], a.microbatch, a.chunk * p + t.stage, k))
            if row and tail and tail[row[0].stage]:
                end = row[-1].end_ns + shift
                rows.append((row[0].stage, f"stage{row[0].stage}", "compute", end, end + tail[row[0].stage],
                             "other", None, None, k))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def trace_work(folder: Path) -> tuple[pl.DataFrame, int, tuple, int]:
    """The stage work of a trace folder as the report's reduce builds it, its p, detected schedule and
    measured step time."""
    files = find_traces([folder])
    options = replace(Options(), files=len(files))
    parts = [stages_part(r.spans, options, r.meta) for r in (read_file(f, use_cache=False) for f in files)]
    names, work, _, _ = combine([p for p in parts if p is not None])
    work, step = prepared(work)
    return work, len(names), pm.detect_schedule(work), step


def calibrated(work: pl.DataFrame, p: int, detected: tuple, step: int) -> calibrate.Calibration:
    schedule, chunks, m = detected
    times = calibrate.replay_times(work, p, m)
    assert times is not None
    return calibrate.calibration(times, schedule, chunks, step, work)


# --- hand-computed timelines ----------------------------------------------------------------------------


def test_two_stages_with_a_known_hop_replay_exactly() -> None:
    """1F1B, p=2, m=2: stage 0 F=2, B=3 ms; stage 1 F=4, B=6 ms; every hand-off takes 1 ms.
    s0: F0 0-2, F1 2-4, B0 14-17 (s1's B0 ends 13, + 1), B1 24-27. s1: F0 3-7, B0 7-13, F1 13-17, B1 17-23."""
    work, step = prepared(frame([
        (0, "F", 0, 0, 2), (0, "F", 1, 2, 4), (0, "B", 0, 14, 17), (0, "B", 1, 24, 27),
        (1, "F", 0, 3, 7), (1, "B", 0, 7, 13), (1, "F", 1, 13, 17), (1, "B", 1, 17, 23),
    ]))
    assert step == 27 * MS
    times = calibrate.replay_times(work, 2, 2)
    assert times.forward == ((2 * MS, 2 * MS), (4 * MS, 4 * MS)) and times.backward[1] == (6 * MS, 6 * MS)
    # Measured where the stage waited (s1's F0, s0's B0 and B1) or could have (s1's F1: its own B0 hid it);
    # never measured (into stage 0's forward, the last stage's backward): the mean of those measured.
    assert times.hop == (((MS, MS), (MS, MS)), ((MS, MS), (MS, MS)))
    assert times.setup == (((0, 0), (0, 0)), ((0, 0), (0, 0)), None) and times.tail_ns == (0, 0)
    cal = calibrate.calibration(times, "1f1b", 1, step, work)
    assert (cal.replayed_step_ns, cal.error, cal.note) == (27 * MS, 0.0, None)
    # The plain pass times replay 25 ms: 7.4 % short, which the note says.
    plain = calibrate.calibration(times.passes_only(), "1f1b", 1, step)
    assert plain.replayed_step_ns == 25 * MS and plain.error == pytest.approx(-2 / 27)
    assert plain.note.startswith("replay 25.00 ms is 7.4 % shorter than the measured 27.00 ms step (")


def test_setup_and_tail_come_from_the_stage_s_other_work() -> None:
    """GPipe, p=2, m=2, F=2, B=3 ms, hand-offs 1 ms. Stage 1 computes something else for 1 ms before B0
    (7-8) and for 2 ms after its last pass (14-16). s0: F0 0-2, F1 2-4, B0 12-15, B1 15-18.
    s1: F0 3-5, F1 5-7, B0 8-11, B1 11-14. The step is 18 ms."""
    work, step = prepared(frame([
        (0, "F", 0, 0, 2), (0, "F", 1, 2, 4), (0, "B", 0, 12, 15), (0, "B", 1, 15, 18),
        (1, "F", 0, 3, 5), (1, "F", 1, 5, 7), (1, None, None, 7, 8), (1, "B", 0, 8, 11), (1, "B", 1, 11, 14),
        (1, None, None, 14, 16),
    ]))
    times = calibrate.replay_times(work, 2, 2)
    assert times.setup[1] == ((0, 0), (MS, 0)) and times.setup[0] == ((0, 0), (0, 0))
    assert times.tail_ns == (0, 2 * MS)
    assert times.hop == (((MS, MS), (MS, MS)), ((MS, MS), (MS, MS)))
    sim = whatif.simulate(schedules.gpipe(2, 2), times)
    assert [(str(t.action), t.start_ns // MS, t.end_ns // MS) for t in sim.actions[1]] == [
        ("F0", 3, 5), ("F1", 5, 7), ("B0", 8, 11), ("B1", 11, 14)
    ]
    assert sim.step_time_ns == step == 18 * MS
    assert sim.busy_ns == (10 * MS, 10 * MS)  # set-up and tail occupy the stage but are not pass work


def test_a_stage_off_the_schedule_s_order_is_named() -> None:
    """Stage 0 runs all its forwards first (GPipe's order) while stage 1 runs 1F1B's: detected as 1F1B,
    whose replay cannot follow stage 0, and the note says so."""
    odd = schedules.Schedule("1f1b", 2, 4, 1, (schedules.gpipe(2, 4).orders[0], schedules.one_f_one_b(2, 4).orders[1]))
    times = whatif.StageTimes(((MS,) * 4, (MS,) * 4), ((8 * MS,) * 4, (2 * MS,) * 4))
    work, step = prepared(from_simulation(whatif.simulate(odd, times)))
    assert pm.detect_schedule(work) == ("1f1b", 1, 4)
    cal = calibrated(work, 2, ("1f1b", 1, 4), step)
    assert (cal.replayed_step_ns, step) == (38 * MS, 36 * MS)
    assert cal.note == (
        "replay 38.00 ms is 5.6 % longer than the measured 36.00 ms step (stage 0 ran passes in another order "
        "than 1f1b's); speed-ups are against the measured step"
    )


def test_steps_whose_critical_passes_differ_are_said_to() -> None:
    """GPipe, p=2, m=4, two steps: stage 0 is the slow one (F = B = 9 ms, stage 1 1 ms) in the first, stage 1
    in the second; each step takes 74 ms (flow shop: 10 + 3·9 for the forwards, as much for the backwards).
    Each replays exactly on its own; the mean times (5 ms everywhere) replay 50 ms, and the note says why."""
    plan = schedules.gpipe(2, 4)
    slow, fast = (9 * MS,) * 4, (MS,) * 4
    one = whatif.simulate(plan, whatif.StageTimes((slow, fast), (slow, fast)))
    two = whatif.simulate(plan, whatif.StageTimes((fast, slow), (fast, slow)))
    second = from_simulation(two).with_columns(
        step=pl.lit(1, pl.Int32), start=pl.col("start") + 100 * MS, end=pl.col("end") + 100 * MS
    )
    work, step = prepared(pl.concat([from_simulation(one), second]))
    cal = calibrated(work, 2, ("gpipe", 1, 4), step)
    assert (cal.replayed_step_ns, step) == (50 * MS, 74 * MS)
    assert "(each of the 2 steps replayed alone meets its own time within 1 %, but the passes" in cal.note


# --- synthetic traces, through the readers ------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule, chunks, weight, p2p, spin",
    [
        ("gpipe", 1, None, 0, 5_000),
        ("1f1b", 1, None, 3_000, 0),
        ("1f1b", 1, None, 3_000, 5_000),
        ("interleaved_1f1b", 2, None, 2_000, 0),
        ("zero_bubble", 1, 10_000, 2_000, 0),
    ],
)
def test_synthetic_runs_with_communication_replay_exactly(tmp_path, schedule, chunks, weight, p2p, spin) -> None:
    forward = (10_000, 12_000, 9_000, 15_000)
    backward = forward if weight else tuple(2 * f for f in forward)
    times = whatif.StageTimes(
        tuple((f,) * 8 for f in forward), tuple((b,) * 8 for b in backward),
        tuple((weight,) * 8 for _ in forward) if weight else None, p2p,
    )
    sim = whatif.simulate(schedules.make_schedule(schedule, 4, 8, chunks), times)
    work, p, detected, step = trace_work(write_pipeline(tmp_path, sim, spin_before_forward=spin))
    assert detected == (schedule, chunks, 8) and step == sim.step_time_ns
    replay = calibrate.replay_times(work, p, 8)
    assert {v for row in replay.hop[0][1:] for v in row} == {p2p}  # the spinning receive is not the hop
    assert replay.setup[0] == tuple((0,) * 8 for _ in range(4))
    cal = calibrate.calibration(replay, schedule, chunks, step, work)
    assert cal.error == 0.0 and cal.note is None
    plain = calibrate.calibration(replay.passes_only(), schedule, chunks, step)
    assert (plain.error < 0) == (p2p > 0)


@st.composite
def timelines(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]))
    p, m = draw(st.integers(2, 4)), draw(st.integers(1, 6))
    v = draw(st.integers(2, 3)) if name == "interleaved_1f1b" else 1
    try:
        plan = schedules.make_schedule(name, p, m, v)
    except StageSpecError:  # interleaved rounds that do not divide m
        plan, v = schedules.make_schedule("1f1b", p, m), 1
    ns = st.integers(v, 60 * v)
    grid = st.lists(st.lists(ns, min_size=m, max_size=m).map(tuple), min_size=p, max_size=p).map(tuple)
    small = st.lists(st.lists(st.integers(0, 40), min_size=m, max_size=m).map(tuple), min_size=p,
                     max_size=p).map(tuple)
    weight = draw(grid) if plan.split_backward else None  # a zero-bubble trace has its W passes
    times = whatif.StageTimes(
        draw(grid), draw(grid), weight, 0, (draw(small), draw(small)),
        (draw(small), draw(small), draw(small) if weight else None),
    )
    tail = tuple(draw(st.lists(st.integers(0, 30), min_size=p, max_size=p)))
    return plan, times, tail, draw(st.integers(1, 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines())
def test_any_simulated_timeline_replays_exactly(case) -> None:
    """Whatever the pass times, hand-offs, set-up and tails, the calibrated replay of a timeline the
    simulator made is that timeline's step, to the nanosecond (steps repeated alike)."""
    plan, times, tail, steps = case
    sim = whatif.simulate(plan, times)
    work, step = prepared(from_simulation(sim, steps, tail))
    replay = calibrate.replay_times(work, plan.stages, plan.microbatches)
    assert replay is not None
    assert whatif.simulate(plan, replay).step_time_ns == step


# --- the bundled samples and the real CPU pipelines ---------------------------------------------------


@pytest.mark.parametrize("name", ["pipeline_1f1b", "pipeline_1f1b_imbalanced", "pipeline_gpipe"])
def test_bundled_samples_replay_within_tolerance(name) -> None:
    work, p, detected, step = trace_work(ROOT / "sample_traces" / name)
    schedule, chunks, m = detected
    cal = calibrated(work, p, detected, step)
    assert abs(cal.error) <= calibrate.TOLERANCE and cal.note is None
    # The pass times alone replay more than 5 % short: hand-offs and set-up are what they leave out.
    plain = calibrate.calibration(calibrate.replay_times(work, p, m).passes_only(), schedule, chunks, step)
    assert plain.error < -calibrate.TOLERANCE


@pytest.mark.parametrize("name", ["gpipe", "interleaved1f1b"])
def test_real_cpu_pipelines_replay_within_tolerance(name) -> None:
    work, p, detected, step = trace_work(shared("pipeline_cpu", name))
    cal = calibrated(work, p, detected, step)
    assert abs(cal.error) <= calibrate.TOLERANCE


def test_real_1f1b_without_labels_is_replayed_only_where_its_passes_agree() -> None:
    """torch 2.13's 1F1B emits no micro-batch labels; the passes inferred there disagree between stages,
    so there is no replay rather than a wrong one (or, where they agree, one within tolerance or noted)."""
    work, p, (schedule, chunks, m), step = trace_work(shared("pipeline_cpu", "1f1b"))
    times = calibrate.replay_times(work, p, m)
    if times is not None:
        cal = calibrate.calibration(times, schedule, chunks, step, work)
        assert abs(cal.error) <= calibrate.TOLERANCE or cal.note


def test_nothing_to_replay_gives_none() -> None:
    assert calibrate.calibration_or_none(None, "1f1b", 1, 10) is None
    work, _ = prepared(frame([(0, "F", 0, 0, 2), (1, "F", 0, 3, 5)]))
    assert calibrate.replay_times(work, 2, 1) is None  # no backward
    assert calibrate.replay_times(work, 2, None) is None
    assert calibrate.replay_times(work.clear(), 2, 1) is None
