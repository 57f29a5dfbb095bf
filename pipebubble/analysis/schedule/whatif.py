"""What-if for pipeline schedules: measured per-stage, per-micro-batch F/B/W times replayed under other
schedules, micro-batch counts and a rebalanced split (``replay.simulate``, a dependency-respecting event
simulator), and the recommendations made from them.

Pure functions, int64 nanoseconds. Schedules (action orders) and their closed forms live in ``schedules.py``;
``calibrate.py`` measures the hand-offs and set-up times that make the replay meet the measured step.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from itertools import repeat
from operator import mul

from pipebubble.analysis.schedule.replay import (  # noqa: F401  (the replay's names, as callers know them)
    Grid,
    Simulation,
    StageTimes,
    TimedAction,
    _dependency,
    _split,
    action_duration,
    action_setup,
    hop_ns,
    ideal_step_time_ns,
    simulate,
)
from pipebubble.analysis.schedule.schedules import make_schedule
from pipebubble.errors import StageSpecError
from pipebubble.report import Recommendation

# --- what-if recommendations ------------------------------------------------------------------------------

CANDIDATE_SCHEDULES = (
    ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("zero_bubble", 1)
)
SAME_BATCH_NOTE = (
    "same global batch: each micro-batch does m_now/m_new of today's work (per-stage mean, linear scaling); "
    "fixed per-micro-batch costs (launch, p2p latency) are not scaled"
)
CHUNK_NOTE = "each stage's model split into v equal chunks; every extra hand-off between stages costs a measured hop"
ZB_NOTE = "W not measured: backward assumed to split into equal input- and weight-gradient halves"
REBALANCE_NOTE = "layers moved from slow to fast stages until every stage does the mean total work"
REBALANCE_FLOPS_NOTE = ("layers (FLOPs) moved until every stage computes as long, each at its own FLOP/s: a slower "
                        "GPU takes fewer")


def what_if(
    times: StageTimes,
    schedule: str,
    chunks: int = 1,
    microbatch_options: tuple[int, ...] | None = None,
    measured_step_ns: int | None = None,
    current_note: str = "",
    compute_ns: int | None = None,
    flops: list[int] | None = None,
) -> tuple[Recommendation, ...]:
    """Replay ``times`` under the current schedule, other schedules, other micro-batch counts (default
    2m, 4m and 64) and rebalanced stages; the current setup comes first among equals, all sorted by
    predicted step time. Candidates a schedule cannot run (e.g. interleaved with m % (m // p) != 0)
    are left out. With ``measured_step_ns`` every speed-up is the measured step over the predicted one,
    and the current row's note (``current_note``, else ``off_note``) says how far its replay is off.

    ``compute_ns``: the compute measured in one step, summed over the stages (every row does the same work:
    same global batch). With it, every row's bubble is the measured bubble's definition, 1 − compute /
    (p · the row's step), so the current row's is the measured one wherever its replay meets the measured
    step; the replay's own (only its F/B/W passes busy: compute outside them, in set-up and tail, counts
    as idle) stays beside it as ``replay_bubble_fraction``. Without it, the bubble is the replay's own."""
    m = times.microbatches
    current = simulate(make_schedule(schedule, times.stages, m, chunks), times)
    base = measured_step_ns or current.step_time_ns
    note = current_note or (off_note(current.step_time_ns, measured_step_ns) if measured_step_ns else "")
    recs = [_recommend(f"current: {_name(schedule, chunks)}, m={m}", current, base, note, compute_ns)]
    for name, v in CANDIDATE_SCHEDULES:
        if (name, v) != (schedule, chunks):
            note = CHUNK_NOTE if v > 1 else ZB_NOTE if name == "zero_bubble" and not times.weight else ""
            recs += _try(_name(name, v), name, v, times, base, note, compute_ns)
    for m_new in dict.fromkeys(microbatch_options or (2 * m, 4 * m, 64)):
        if m_new != m and m_new >= 1:
            scaled = rescale_microbatches(times, m_new)
            recs += _try(f"m={m_new}", schedule, chunks, scaled, base, SAME_BATCH_NOTE, compute_ns)
    recs += _try("rebalanced stages", schedule, chunks, rebalance(times, flops), base,
                 REBALANCE_FLOPS_NOTE if flops else REBALANCE_NOTE, compute_ns)
    return tuple(sorted(recs, key=lambda r: (r.step_time_ns, not r.label.startswith("current"))))


def replay_error(replayed_ns: int, measured_ns: int) -> float:
    """(replayed − measured) / measured: negative when the replay is shorter than the step measured."""
    return (replayed_ns - measured_ns) / measured_ns if measured_ns else 0.0


def off_note(replayed_ns: int, measured_ns: int, why: str = "") -> str:
    """How far a replay is from the measured step (and ``why``, when known); empty within 0.1 %."""
    error = replay_error(replayed_ns, measured_ns)
    if abs(error) < 0.001:
        return ""
    side = "shorter" if error < 0 else "longer"
    return (
        f"replay {replayed_ns / 1e6:.2f} ms is {abs(error) * 100:.1f} % {side} than the measured "
        f"{measured_ns / 1e6:.2f} ms step{f' ({why})' if why else ''}; speed-ups are against the measured step"
    )


def _name(schedule: str, chunks: int) -> str:
    return f"{schedule} v={chunks}" if schedule == "interleaved_1f1b" else schedule


def _try(
    label: str, name: str, v: int, times: StageTimes, base: int, note: str, compute_ns: int | None = None
) -> list[Recommendation]:
    try:
        sim = simulate(make_schedule(name, times.stages, times.microbatches, v), times)
    except StageSpecError:
        return []
    return [_recommend(label, sim, base, note, compute_ns)]


def measured_bubble(sim: Simulation, compute_ns: int | None) -> float:
    """The replayed step's bubble as the measured one is defined: 1 − ``compute_ns`` / (p · step), the compute
    being the measured step's (``what_if``); the replay's own without it."""
    capacity = sim.schedule.stages * sim.step_time_ns
    if compute_ns is None or not capacity:
        return sim.bubble_fraction
    return min(1.0, max(0.0, 1 - compute_ns / capacity))


def _recommend(label: str, sim: Simulation, base: int, note: str = "", compute_ns: int | None = None) -> Recommendation:
    s = sim.schedule
    bubble = measured_bubble(sim, compute_ns)
    return Recommendation(
        f"{label} → bubble {bubble * 100:.1f} %", s.name, s.microbatches, s.chunks,
        sim.step_time_ns, bubble, base / sim.step_time_ns if sim.step_time_ns else 1.0, note,
        replay_bubble_fraction=sim.bubble_fraction,
    )


def _spread(total: int, parts: int) -> tuple[int, ...]:
    """``total`` cut into ``parts`` near-equal integers, the larger first (``_split`` of every part)."""
    whole, rest = divmod(total, parts)
    return (whole + 1,) * rest + (whole,) * (parts - rest)


def rescale_microbatches(times: StageTimes, microbatches: int) -> StageTimes:
    """The same global batch cut into ``microbatches`` pieces: each stage's total F, B and W time kept,
    spread evenly (to the nanosecond) over the new micro-batches; hand-offs and set-up are per micro-batch
    costs, so each new micro-batch keeps the stage's mean."""
    def grid(g: Grid | None) -> Grid | None:
        return None if g is None else tuple(_spread(sum(row), microbatches) for row in g)

    def fixed(g: Grid | None) -> Grid | None:
        return None if g is None else tuple((round(sum(row) / len(row)),) * microbatches for row in g)

    hop = tuple(map(fixed, times.hop)) if times.hop else None
    setup = tuple(map(fixed, times.setup)) if times.setup else None
    chunked = rescale_microbatches(times.chunked, microbatches) if times.chunked else None
    return replace(times, forward=grid(times.forward), backward=grid(times.backward), weight=grid(times.weight),
                   hop=hop, setup=setup, chunked=chunked)


def rebalance(times: StageTimes, flops: list[int] | None = None) -> StageTimes:
    """Every stage's passes scaled to the mean total work: the slowest stage's load spread to the others
    (assumes work divides freely between stages, as moving layers approximately does); hand-offs, set-up
    and tails stay as measured.

    With each stage's FLOPs (``flops``), FLOPs move, not time: a stage runs what it is given at its own
    FLOP/s (r_s = F_s / T_s), so the stages even out at T = ΣF / Σr, each stage's passes scaled by T / T_s.
    A slow GPU then takes fewer layers than an even split of the time would give it (T is the harmonic mean
    of the stages' times at equal FLOPs, the arithmetic mean at equal rates)."""
    totals = [times.stage_total(s) for s in range(times.stages)]
    if flops is not None and len(flops) == len(totals) and all(flops) and all(totals):
        target = Fraction(sum(flops)) / sum(Fraction(f, t) for f, t in zip(flops, totals, strict=True))
    else:
        target = Fraction(sum(totals), len(totals))
    scale = [target / t if t else Fraction(1) for t in totals]
    return _scaled(times, scale)


def _rounded(numerator: int, denominator: int) -> int:
    """round(Fraction(numerator, denominator)) (halves to even) in integers: a what-if scales every pass."""
    floor, rest = divmod(numerator, denominator)
    return floor + (2 * rest > denominator or (2 * rest == denominator and floor % 2 == 1))


def _row(row: tuple[int, ...], numerator: int, denominator: int) -> tuple[int, ...]:
    """Every value of ``row`` times numerator / denominator, rounded (``_rounded``), by C-level maps."""
    return tuple(map(_rounded, map(mul, row, repeat(numerator)), repeat(denominator)))


def _scaled(times: StageTimes, scale: list[Fraction]) -> StageTimes:
    """Every pass of stage s (of each of its chunks, in ``chunked``) times ``scale[s]``."""
    def grid(g: Grid | None) -> Grid | None:
        if g is None:
            return None
        ratios = [(f.numerator, f.denominator) for f in scale]
        return tuple(_row(row, *ratios[r % len(ratios)]) for r, row in enumerate(g))

    chunked = _scaled(times.chunked, scale) if times.chunked else None
    return replace(
        times, forward=grid(times.forward), backward=grid(times.backward), weight=grid(times.weight), chunked=chunked
    )
