"""The schedule simulator, the closed forms, the what-if recommendations and `pipebubble theory`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipebubble.analysis.schedule.schedules import (
    Action,
    Schedule,
    closed_form_bubble,
    closed_form_bubble_time,
    make_schedule,
    one_f_one_b,
)
from pipebubble.analysis.schedule.whatif import (
    StageTimes,
    action_duration,
    action_setup,
    hop_ns,
    ideal_step_time_ns,
    off_note,
    rebalance,
    rescale_microbatches,
    simulate,
    what_if,
)
from pipebubble.errors import StageSpecError


def grid(rows: list[int], m: int) -> tuple[tuple[int, ...], ...]:
    return tuple((t,) * m for t in rows)


def spans(sim, stage: int) -> list[tuple[str, int, int]]:
    return [(str(t.action), t.start_ns, t.end_ns) for t in sim.actions[stage]]


# --- equal stages against the closed forms ------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("f", "b"), [(1_000, 2_000), (3_000, 5_000), (7, 7)])
def test_equal_stages_give_exactly_p_minus_1_over_m_plus_p_minus_1(name: str, f: int, b: int) -> None:
    times = StageTimes(grid([f] * 4, 8), grid([b] * 4, 8))
    sim = simulate(make_schedule(name, 4, 8), times)
    assert sim.bubble == Fraction(3, 11)
    assert sim.step_time_ns == (8 + 4 - 1) * (f + b)
    assert closed_form_bubble(name, 4, 8) == Fraction(3, 11)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 12), (2, 6), (3, 3), (8, 16), (4, 6), (4, 5)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_meets_the_closed_form_for_m_at_least_p(p: int, m: int, v: int) -> None:
    # Each chunk takes 1/v of the stage: Narayanan et al.'s assumption behind (p-1)/(v·m+p-1).
    times = StageTimes(grid([60 * v] * p, m), grid([120 * v] * p, m))
    sim = simulate(make_schedule("interleaved_1f1b", p, m, v), times)
    assert sim.bubble == Fraction(p - 1, v * m + p - 1) == closed_form_bubble("interleaved_1f1b", p, m, v)


def test_interleaved_with_uneven_rounds_is_rejected_and_m_below_p_is_worse_than_theory() -> None:
    # torch.distributed.pipelining needs m % max(1, m // p) == 0; uneven rounds deadlock.
    with pytest.raises(StageSpecError, match="not a multiple"):
        make_schedule("interleaved_1f1b", 4, 9, 2)
    # With fewer micro-batches than stages the warm-up cannot fill the pipeline.
    sim = simulate(make_schedule("interleaved_1f1b", 4, 2, 2), StageTimes(grid([2] * 4, 2), grid([4] * 4, 2)))
    assert sim.bubble > closed_form_bubble("interleaved_1f1b", 4, 2, 2)


def test_zb_h1_meets_its_closed_form_and_a_third_of_1f1b_bubble() -> None:
    p, m, t = 4, 8, 1_000
    split = StageTimes(grid([t] * p, m), grid([t] * p, m), grid([t] * p, m))
    zb = simulate(make_schedule("zero_bubble", p, m), split)
    ofob = simulate(make_schedule("1f1b", p, m), split)  # runs B and W together
    assert zb.bubble == closed_form_bubble("zero_bubble", p, m, 1, (1, 1, 1)) == Fraction(1, 9)
    assert ofob.bubble == Fraction(3, 11)
    assert 3 * zb.idle_ns[0] == ofob.idle_ns[0] == (p - 1) * 3 * t
    assert zb.step_time_ns < ofob.step_time_ns


def test_closed_form_bubble_times() -> None:
    assert closed_form_bubble_time("1f1b", 4, 1, (1, 2, 0)) == 9
    assert closed_form_bubble_time("interleaved_1f1b", 4, 3, (1, 2, 0)) == 3
    assert closed_form_bubble_time("zero_bubble", 4, 1, (1, 1, 1)) == 3
    assert closed_form_bubble_time("zero_bubble", 4, 1, (1, 1, 5)) == 0  # W larger than F + B: no bubble
    assert closed_form_bubble("interleaved_1f1b", 4, 8, 2) == Fraction(3, 19)


# --- hand-computed small cases ------------------------------------------------------------------------


def test_1f1b_two_stages_by_hand() -> None:
    # stage 0: F=2, B=3; stage 1: F=4, B=6; every cross-stage hand-off takes 1.
    times = StageTimes(grid([2, 4], 2), grid([3, 6], 2), p2p_ns=1)
    sim = simulate(one_f_one_b(2, 2), times)
    # s0: F0 0-2, F1 2-4, B0 waits for s1's B0 (ends 13) + 1 -> 14-17, B1 waits for 23 + 1 -> 24-27.
    assert spans(sim, 0) == [("F0", 0, 2), ("F1", 2, 4), ("B0", 14, 17), ("B1", 24, 27)]
    # s1: F0 after 2 + 1 -> 3-7, B0 7-13 (own F, no hand-off), F1 13-17, B1 17-23.
    assert spans(sim, 1) == [("F0", 3, 7), ("B0", 7, 13), ("F1", 13, 17), ("B1", 17, 23)]
    assert sim.step_time_ns == 27
    assert sim.busy_ns == (10, 20)
    assert sim.bubble == Fraction(17 + 7, 2 * 27)


def test_zero_bubble_two_stages_by_hand() -> None:
    # F, B (input gradient), W per stage: s0 2, 3, 1; s1 4, 2, 2. Stage 1 defers its first W.
    times = StageTimes(grid([2, 4], 2), grid([3, 2], 2), grid([1, 2], 2))
    sim = simulate(make_schedule("zero_bubble", 2, 2), times)
    # s0: B0 waits for s1's B0 (ends 8) and runs its W0 at once; B1 waits for s1's B1 (ends 14).
    assert spans(sim, 0) == [
        ("F0", 0, 2), ("F1", 2, 4), ("B0", 8, 11), ("W0", 11, 12), ("B1", 14, 17), ("W1", 17, 18)
    ]
    # s1: F1 waits for B0 (its stage is busy until 8); the deferred W0, W1 fill the tail.
    assert spans(sim, 1) == [
        ("F0", 2, 6), ("B0", 6, 8), ("F1", 8, 12), ("B1", 12, 14), ("W0", 14, 16), ("W1", 16, 18)
    ]
    assert sim.step_time_ns == 18
    assert sim.bubble == Fraction(6 + 2, 36)


def test_measured_hops_setup_and_tail_by_hand() -> None:
    # The 1F1B case above with its hand-offs measured per pass (1 each, as p2p_ns=1 gave), stage 1 spending
    # 1 of its own before every pass and computing 5 after its last.
    ones = grid([1, 1], 2)
    times = StageTimes(grid([2, 4], 2), grid([3, 6], 2), hop=(ones, ones),
                       setup=(grid([0, 1], 2), grid([0, 1], 2), None), tail_ns=(0, 5))
    sim = simulate(one_f_one_b(2, 2), times)
    # s1: F0 free at 2 + 1, computes after its set-up 4-8; B0 9-15; F1 16-20; B1 21-27, then 5 of tail.
    assert spans(sim, 1) == [("F0", 4, 8), ("B0", 9, 15), ("F1", 16, 20), ("B1", 21, 27)]
    # s0: B0 waits for s1's B0 (15) + 1 -> 16-19; B1 for 27 + 1 -> 28-31.
    assert spans(sim, 0) == [("F0", 0, 2), ("F1", 2, 4), ("B0", 16, 19), ("B1", 28, 31)]
    assert sim.step_time_ns == 32  # stage 1's tail ends last
    assert sim.busy_ns == (10, 20)  # set-up and tail occupy a stage without being its pass work
    assert simulate(one_f_one_b(2, 2), times.passes_only()).step_time_ns == 25


def test_chunked_times_are_replayed_whole_per_virtual_stage() -> None:
    # p=2, v=2: stage 0 holds virtual stages 0 and 2, stage 1 holds 1 and 3; chunk 1 of stage 0 is slow.
    per_virtual = StageTimes(grid([1, 2, 9, 2], 4), grid([2, 4, 18, 4], 4))
    times = StageTimes(grid([10, 4], 4), grid([20, 8], 4), chunked=per_virtual)
    plan = make_schedule("interleaved_1f1b", 2, 4, 2)
    f0, f1 = Action("F", 0, 0), Action("F", 0, 1)
    assert [action_duration(plan, times, 0, a) for a in (f0, f1)] == [1, 9]
    assert [action_duration(plan, replace(times, chunked=None), 0, a) for a in (f0, f1)] == [5, 5]
    assert action_duration(make_schedule("1f1b", 2, 4), times, 0, f0) == 10  # one chunk: the stage's times
    sim = simulate(plan, times)
    assert sim.busy_ns == (4 * 30, 4 * 12)
    assert rescale_microbatches(times, 8).chunked.forward[2] == (5, 5, 5, 5, 4, 4, 4, 4)  # 36 over 8
    assert rebalance(times).chunked.forward[2] == (6,) * 4  # 9 · 84/120: stage 0 moves to the mean work


def test_gpipe_imbalanced_step_time_is_exact() -> None:
    # All forwards then all backwards: two flow shops of identical jobs, each sum(t) + (m-1)·max(t).
    f, b, m = [1_000, 1_000, 3_000, 1_500], [2_000, 2_500, 6_000, 2_000], 8
    sim = simulate(make_schedule("gpipe", 4, m), StageTimes(grid(f, m), grid(b, m)))
    assert sim.step_time_ns == sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)
    assert sim.busy_ns[2] == m * (3_000 + 6_000)


@given(
    f=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    m=st.integers(1, 10),
    ratio=st.integers(1, 3),
)
def test_gpipe_flow_shop_formula(f: list[int], m: int, ratio: int) -> None:
    b = [ratio * x for x in f]
    sim = simulate(make_schedule("gpipe", len(f), m), StageTimes(grid(f, m), grid(b, m)))
    assert sim.step_time_ns == sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)


def test_slowest_stage_dominates_1f1b() -> None:
    m = 64
    times = StageTimes(grid([1, 1, 4, 1], m), grid([2, 2, 8, 2], m))
    sim = simulate(make_schedule("1f1b", 4, m), times)
    assert m * 12 <= sim.step_time_ns <= (m + 4 - 1) * 12


# --- properties -----------------------------------------------------------------------------------------


@st.composite
def cases(draw):
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]))
    p, m = draw(st.integers(1, 5)), draw(st.integers(1, 10))
    v = draw(st.integers(2, 4)) if name == "interleaved_1f1b" else 1
    durations = st.lists(st.lists(st.integers(1, 50), min_size=m, max_size=m), min_size=p, max_size=p)
    weight = draw(st.none() | durations)
    as_grid = lambda rows: tuple(map(tuple, rows))  # noqa: E731
    forward, backward = as_grid(draw(durations)), as_grid(draw(durations))
    times = StageTimes(forward, backward, weight and as_grid(weight), draw(st.integers(0, 5)))
    if draw(st.booleans()):  # measured hand-offs, set-up and tails
        small = st.lists(st.lists(st.integers(0, 9), min_size=m, max_size=m), min_size=p, max_size=p).map(as_grid)
        setup = (draw(small), draw(small), draw(small) if weight else None)
        tail = tuple(draw(st.lists(st.integers(0, 9), min_size=p, max_size=p)))
        times = replace(times, hop=(draw(small), draw(small)), setup=setup, tail_ns=tail)
    return name, p, m, v, times


def _schedule_or_skip(name: str, p: int, m: int, v: int) -> Schedule:
    try:
        return make_schedule(name, p, m, v)
    except StageSpecError:
        assume(False)
        raise


@settings(max_examples=300, deadline=None)
@given(cases())
def test_simulation_properties(case) -> None:
    name, p, m, v, times = case
    schedule = _schedule_or_skip(name, p, m, v)
    sim = simulate(schedule, times)
    assert 0 <= sim.bubble < 1
    assert sim.step_time_ns >= ideal_step_time_ns(times)
    assert sum(sim.busy_ns) == sum(times.stage_total(s) for s in range(p))  # set-up and tails are not busy
    tail = times.tail_ns or (0,) * p
    assert sim.step_time_ns == max(row[-1].end_ns + tail[s] for s, row in enumerate(sim.actions))
    ends = {}
    for s, row in enumerate(sim.actions):
        assert [t.action for t in row] == list(schedule.orders[s])  # each action once, in order
        assert all(a.end_ns <= b.start_ns for a, b in zip(row, row[1:], strict=False))  # one at a time
        assert all(t.start_ns <= t.end_ns for t in row)  # a 1 ns pass cut into 2 chunks leaves a 0 ns one
        for t in row:
            ends[(t.action.phase, t.action.microbatch, schedule.virtual_stage(s, t.action.chunk))] = t
    assert Counter(k[0] for k in ends) == Counter(a.phase for o in schedule.orders for a in o)
    last = p * v - 1
    for (phase, j, k), t in ends.items():
        after_b = ("B", j, k + 1) if k < last else ("F", j, k)
        dep = {"F": ("F", j, k - 1), "B": after_b, "W": ("B", j, k)}[phase]
        setup = action_setup(schedule, times, t.stage, t.action)
        if dep in ends:
            hop = hop_ns(schedule, times, t.stage, t.action) if dep[2] % p != t.stage else 0
            assert t.start_ns >= ends[dep].end_ns + hop + setup
        else:
            assert phase == "F" and k == 0


# --- invalid schedules ----------------------------------------------------------------------------------


def _with_stage0(order: tuple[Action, ...]) -> Schedule:
    base = one_f_one_b(2, 2)
    return Schedule("custom", 2, 2, 1, (order, base.orders[1]))


def test_a_missing_or_repeated_pass_is_rejected() -> None:
    times = StageTimes(grid([1, 1], 2), grid([2, 2], 2))
    with pytest.raises(StageSpecError, match=r"stage 0: .*repeated or unknown: F0; missing: F1"):
        simulate(_with_stage0((Action("F", 0), Action("F", 0), Action("B", 0), Action("B", 1))), times)


def test_an_order_that_deadlocks_is_rejected() -> None:
    times = StageTimes(grid([1, 1], 2), grid([2, 2], 2))
    with pytest.raises(StageSpecError, match=r"deadlocks: stage 0 waits at B0; stage 1 waits at F0"):
        simulate(_with_stage0((Action("B", 0), Action("F", 0), Action("F", 1), Action("B", 1))), times)


def test_the_last_stage_cannot_run_a_backward_before_its_forward() -> None:
    schedule = Schedule("custom", 1, 1, 1, ((Action("B", 0), Action("F", 0)),))
    with pytest.raises(StageSpecError, match=r"deadlocks: stage 0 waits at B0$"):
        simulate(schedule, StageTimes(((1,),), ((2,),)))


def test_times_of_the_wrong_shape_and_bad_sizes_are_rejected() -> None:
    with pytest.raises(StageSpecError, match="needs 2 x 3"):
        simulate(one_f_one_b(2, 3), StageTimes(grid([1, 1], 2), grid([2, 2], 2)))
    with pytest.raises(StageSpecError, match="unknown schedule"):
        make_schedule("pipedream", 2, 2)
    with pytest.raises(StageSpecError, match="one chunk per stage"):
        make_schedule("gpipe", 2, 2, 2)
    with pytest.raises(StageSpecError, match=">= 1"):
        make_schedule("1f1b", 0, 2)


# --- what-if --------------------------------------------------------------------------------------------


def test_what_if_predicts_other_schedules_and_microbatch_counts() -> None:
    times = StageTimes(grid([1_000] * 4, 8), grid([2_000] * 4, 8))
    recs = what_if(times, "1f1b")
    by_label = {r.label.split(" → ")[0]: r for r in recs}
    assert [r.step_time_ns for r in recs] == sorted(r.step_time_ns for r in recs)
    current = by_label["current: 1f1b, m=8"]
    assert (current.speedup, current.bubble_fraction) == (1.0, 3 / 11)
    assert by_label["m=64"].label == "m=64 → bubble 4.5 %"  # 3/67, same total work
    assert by_label["m=64"].step_time_ns == 24_000 + 3 * 375
    assert by_label["interleaved_1f1b v=2"].bubble_fraction == 3 / 19
    assert by_label["zero_bubble"].bubble_fraction == 1 / 9  # B split into equal halves
    assert "W not measured" in by_label["zero_bubble"].note
    assert by_label["gpipe"].step_time_ns == current.step_time_ns
    assert by_label["m=64"].to_dict()["note"].startswith("same global batch")


def test_what_if_speedups_are_against_the_measured_step() -> None:
    times = StageTimes(grid([1_000] * 4, 8), grid([2_000] * 4, 8))  # replays 33 µs
    recs = {r.label.split(" → ")[0]: r for r in what_if(times, "1f1b", measured_step_ns=36_000)}
    current = recs["current: 1f1b, m=8"]
    assert current.step_time_ns == 33_000 and current.speedup == 36_000 / 33_000
    assert current.note == (
        "replay 0.03 ms is 8.3 % shorter than the measured 0.04 ms step; speed-ups are against the measured step"
    )
    assert recs["m=64"].speedup == 36_000 / (24_000 + 3 * 375)
    exact = {r.label.split(" → ")[0]: r for r in what_if(times, "1f1b", measured_step_ns=33_000)}
    assert exact["current: 1f1b, m=8"].note == "" and exact["current: 1f1b, m=8"].speedup == 1.0
    noted = what_if(times, "1f1b", measured_step_ns=36_000, current_note="why")
    assert next(r.note for r in noted if r.label.startswith("current")) == "why"
    assert off_note(1_000_500, 1_000_000) == ""  # within 0.1 %
    assert off_note(301_547_961, 360_051_121, "hand-offs not measured").startswith(
        "replay 301.55 ms is 16.2 % shorter than the measured 360.05 ms step (hand-offs not measured);"
    )


def test_what_if_bubbles_count_the_measured_compute_as_the_measured_bubble_does() -> None:
    """Compute outside the passes (each stage's 2 µs tail, an optimizer step) is busy in the measured bubble; with
    the step's measured compute every row's bubble is 1 − compute / (p · its step), so the current row's is the
    measured bubble where its replay meets the step, and the replay's own (passes alone busy) is kept beside it."""
    times = StageTimes(grid([1_000] * 4, 8), grid([2_000] * 4, 8), tail_ns=(2_000,) * 4)  # replays 35 µs
    compute = 4 * (8 * 3_000 + 2_000)  # the passes and the tails
    recs = {r.label.split(" → ")[0]: r for r in what_if(times, "1f1b", measured_step_ns=35_000, compute_ns=compute)}
    current = recs["current: 1f1b, m=8"]
    assert current.step_time_ns == 35_000
    assert current.bubble_fraction == pytest.approx(1 - compute / (4 * 35_000)) == pytest.approx(36 / 140)
    assert current.replay_bubble_fraction == pytest.approx(44 / 140)  # its idle counts the tails
    assert current.label == "current: 1f1b, m=8 → bubble 25.7 %"
    for r in recs.values():
        assert r.bubble_fraction == pytest.approx(1 - compute / (4 * r.step_time_ns))
        assert r.replay_bubble_fraction > r.bubble_fraction
    plain = {r.label.split(" → ")[0]: r for r in what_if(times, "1f1b", measured_step_ns=35_000)}
    assert plain["current: 1f1b, m=8"].bubble_fraction == current.replay_bubble_fraction  # no compute: the replay's


def test_what_if_rebalance_helps_an_imbalanced_pipeline() -> None:
    times = StageTimes(grid([1_000, 1_000, 2_000, 1_000], 8), grid([2_000, 2_000, 4_000, 2_000], 8))
    recs = {r.label.split(" → ")[0]: r for r in what_if(times, "1f1b")}
    balanced = recs["rebalanced stages"]
    assert balanced.step_time_ns == (8 + 3) * 3_750  # every stage at the mean, 1.25 + 2.5 µs
    assert balanced.speedup == 55_000 / 41_250 == recs["current: 1f1b, m=8"].step_time_ns / 41_250


def test_what_if_skips_candidates_the_schedule_cannot_run() -> None:
    times = StageTimes(grid([100] * 4, 9), grid([200] * 4, 9))
    recs = what_if(times, "1f1b", microbatch_options=(9, 18))
    names = {(r.schedule, r.chunks, r.microbatches) for r in recs}
    assert ("interleaved_1f1b", 2, 9) not in names  # 9 micro-batches make uneven rounds
    assert ("1f1b", 1, 18) in names and ("1f1b", 1, 9) in names


def test_rescale_and_rebalance_keep_the_work() -> None:
    times = StageTimes(grid([1_000, 3_000], 4), grid([2_000, 6_000], 4), grid([1_000, 1_000], 4))
    scaled = rescale_microbatches(times, 3)
    assert scaled.microbatches == 3 and scaled.forward[0] == (1_334, 1_333, 1_333)
    assert [scaled.stage_total(s) for s in range(2)] == [times.stage_total(s) for s in range(2)]
    balanced = rebalance(times)
    mean = (times.stage_total(0) + times.stage_total(1)) // 2
    assert balanced.stage_total(0) == balanced.stage_total(1) == mean


def test_rescale_keeps_per_microbatch_overheads_and_rebalance_keeps_them_all() -> None:
    hop = (grid([5, 7], 4), grid([3, 3], 4))
    setup = (((1, 2, 3, 6), (0, 0, 0, 0)), grid([4, 4], 4), None)
    times = StageTimes(grid([1_000, 3_000], 4), grid([2_000, 6_000], 4), hop=hop, setup=setup, tail_ns=(0, 9))
    scaled = rescale_microbatches(times, 2)
    assert scaled.hop == (grid([5, 7], 2), grid([3, 3], 2))  # a hand-off per micro-batch, whatever its size
    assert scaled.setup == (((3, 3), (0, 0)), grid([4, 4], 2), None) and scaled.tail_ns == (0, 9)
    balanced = rebalance(times)
    assert (balanced.hop, balanced.setup, balanced.tail_ns) == (hop, setup, (0, 9))
    assert times.passes_only() == StageTimes(times.forward, times.backward)


# --- `pipebubble theory` --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner_app():
    import pipebubble.cli as cli

    cli._register()
    cli._register()  # idempotent
    assert [c.callback.__name__ for c in cli.app.registered_commands].count("theory") == 1
    return CliRunner(), cli.app


def test_theory_text(runner_app) -> None:
    runner, app = runner_app
    result = runner.invoke(app, ["theory", "--stages", "4", "--microbatches", "8"])
    assert result.exit_code == 0, result.output
    assert "gpipe / 1f1b           (p-1)/(m+p-1)" in result.output
    assert "= 3/11 = 27.3 %" in result.output
    assert "simulated 1f1b: step 33.000 ms (busiest stage's work 24.000 ms), bubble 27.3 %" in result.output
    assert "  s3  |.........F0 B0    F1 B1    F2 B2" in result.output


def test_theory_json(runner_app) -> None:
    runner, app = runner_app
    args = ["theory", "-p", "4", "-m", "8", "-s", "interleaved_1f1b", "-v", "4", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["schedule"], out["chunks"]) == ("interleaved_1f1b", 4)
    assert out["simulated"]["bubble_fraction"] == 3 / 35
    assert len(out["simulated"]["actions"]) == 4 * 8 * 4 * 2
    assert {f["exact"] for f in out["closed_forms"]} == {"3/11", "3/35", "1/9"}


def test_theory_stage_times_and_errors(runner_app) -> None:
    runner, app = runner_app
    args = ["theory", "-p", "4", "-m", "8", "--schedule", "gpipe", "--stage-times", "1,1,1.5,1"]
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0 and "step 45.000 ms" in ok.output  # 4.5 + 7·1.5 + 9 + 7·3 ms
    bad = runner.invoke(app, ["theory", "-p", "4", "-m", "8", "--stage-times", "1,2"])
    assert isinstance(bad.exception, StageSpecError) and "4 positive numbers" in str(bad.exception)
    assert "Examples" in runner.invoke(app, ["theory", "--help"]).output
