"""What-if for pipeline schedules: replay measured per-stage, per-micro-batch F/B/W times under a schedule
with a dependency-respecting event simulator, and recommend changes (schedule, micro-batch count, balance).

Pure functions, int64 nanoseconds. Schedules (action orders) and their closed forms live in ``schedules.py``;
``calibrate.py`` measures the hand-offs and set-up times that make the replay meet the measured step.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, replace
from fractions import Fraction

from pipebubble.analysis.schedules import Action, Schedule, make_schedule, validate
from pipebubble.errors import StageSpecError
from pipebubble.report import Recommendation

Grid = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class StageTimes:
    """Measured durations in ns, indexed ``[stage][microbatch]``. ``backward`` is the whole backward pass
    when ``weight`` is None, else the input-gradient part only; ``p2p_ns`` is added to every dependency
    that crosses stages.

    Measured overheads, all optional: ``hop`` (forward, backward) replaces ``p2p_ns`` per pass, the ns
    from the pass it waits for on another stage ending until it may start (send, wire, receive; every
    chunk's hand-off); ``setup`` (forward, backward, weight) is the time the stage spends on each pass
    besides its compute (posting receives, Python between passes, small operators; summed over chunks);
    ``tail_ns`` the compute each stage does after its last pass. ``chunked``: the same measurement per virtual
    stage (row c·p + s is chunk c of stage s), which a replay with that many chunks reads instead of
    cutting each stage's times into equal chunk parts."""

    forward: Grid
    backward: Grid
    weight: Grid | None = None
    p2p_ns: int = 0
    hop: tuple[Grid, Grid] | None = None
    setup: tuple[Grid, Grid, Grid | None] | None = None
    tail_ns: tuple[int, ...] | None = None
    chunked: StageTimes | None = None

    @classmethod
    def uniform(
        cls, per_stage_forward: tuple[int, ...], microbatches: int, backward_ratio: Fraction = Fraction(2)
    ) -> StageTimes:
        """Stage s takes ``per_stage_forward[s]`` per forward and ``ratio`` times that per backward."""
        forward = tuple((f,) * microbatches for f in per_stage_forward)
        backward = tuple((int(f * backward_ratio),) * microbatches for f in per_stage_forward)
        return cls(forward, backward)

    @property
    def stages(self) -> int:
        return len(self.forward)

    @property
    def microbatches(self) -> int:
        return len(self.forward[0]) if self.forward else 0

    def stage_total(self, stage: int) -> int:
        weight = sum(self.weight[stage]) if self.weight else 0
        return sum(self.forward[stage]) + sum(self.backward[stage]) + weight

    def passes_only(self) -> StageTimes:
        """The pass times alone: no hand-offs, set-up or tail (what a perfectly fed pipeline would do)."""
        chunked = self.chunked.passes_only() if self.chunked else None
        return StageTimes(self.forward, self.backward, self.weight, chunked=chunked)


@dataclass(frozen=True)
class TimedAction:
    stage: int
    action: Action
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Simulation:
    """A schedule replayed on measured times: the step runs from 0 to ``step_time_ns``."""

    schedule: Schedule
    actions: tuple[tuple[TimedAction, ...], ...]
    step_time_ns: int
    busy_ns: tuple[int, ...]

    @property
    def idle_ns(self) -> tuple[int, ...]:
        return tuple(self.step_time_ns - b for b in self.busy_ns)

    @property
    def bubble(self) -> Fraction:
        """Σ idle / (p · step time), exact (ARCHITECTURE.md's bubble_fraction)."""
        return Fraction(sum(self.idle_ns), len(self.busy_ns) * self.step_time_ns or 1)

    @property
    def bubble_fraction(self) -> float:
        return float(self.bubble)


def _split(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` cut into ``parts`` near-equal integers that sum to ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def _row(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> tuple[StageTimes, int, int, int]:
    """Where an action's times lie, as (times, row, parts, part): the ``chunked`` times' row for its virtual
    stage, whole, when they fit the schedule; else the stage's row, cut into equal chunk parts."""
    fine = times.chunked
    fits = fine is not None and (fine.stages, fine.microbatches) == (schedule.stages * schedule.chunks,
                                                                      schedule.microbatches)
    if schedule.chunks > 1 and fits:
        return fine, schedule.virtual_stage(stage, action.chunk), 1, 0
    return times, stage, schedule.chunks, action.chunk


def action_duration(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """Duration of one action. Without measured W, a split schedule assumes the backward divides into
    equal input- and weight-gradient halves (B_input ≈ B_weight ≈ F for the usual B ≈ 2F; Qi et al. 2023,
    section 2, take T_F = T_B = T_W); a measured W in an unsplit schedule runs inside B."""
    src, row, parts, part = _row(schedule, times, stage, action)
    return _split(_pick(schedule, (src.forward, src.backward, src.weight), row, action, True), parts, part)


def action_setup(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """The stage's own time before one action, cut like the pass; an unsplit schedule runs a measured W's
    set-up inside B, and a split of an unsplit measurement keeps it all with B."""
    src, row, parts, part = _row(schedule, times, stage, action)
    return 0 if src.setup is None else _split(_pick(schedule, src.setup, row, action, False), parts, part)


def _pick(schedule: Schedule, grids: tuple[Grid, Grid, Grid | None], row: int, action: Action, halves: bool) -> int:
    forward, backward, weight = grids
    j = action.microbatch
    if action.phase == "F":
        return forward[row][j]
    b, w = backward[row][j], weight[row][j] if weight else None
    if not schedule.split_backward:
        return b + (w or 0)
    if w is None:
        return (b - b // 2 if halves else b) if action.phase == "B" else (b // 2 if halves else 0)
    return b if action.phase == "B" else w


def hop_ns(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """The hand-off into ``action`` on ``stage`` from the stage its dependency ran on."""
    src, row, _, _ = _row(schedule, times, stage, action)
    if src.hop is None or action.phase == "W":
        return src.p2p_ns
    return src.hop[0 if action.phase == "F" else 1][row][action.microbatch]


Key = tuple[str, int, int]  # (phase, microbatch, virtual stage)


def _dependency(schedule: Schedule, stage: int, action: Action) -> Key | None:
    """The pass this one waits for (Narayanan et al. 2021; Qi et al. 2023, section 2): F needs the previous
    virtual stage's F, B the next virtual stage's B (the last virtual stage's B its own F), W its own B."""
    k = schedule.virtual_stage(stage, action.chunk)
    last = schedule.stages * schedule.chunks - 1
    j = action.microbatch
    if action.phase == "F":
        return ("F", j, k - 1) if k > 0 else None
    if action.phase == "B":
        return ("B", j, k + 1) if k < last else ("F", j, k)
    return ("B", j, k)


@functools.lru_cache(maxsize=16)
def simulate(schedule: Schedule, times: StageTimes) -> Simulation:
    """Start every action when its stage is free and its dependency has ended (plus the hand-off when the
    dependency ran on another stage); its compute follows its set-up. Raises StageSpecError if the orders
    deadlock. Pure, on frozen values: a job's report asks for the same replay several times (the measured
    schedule's, for the summary, the calibration and the what-if baseline), and it is run once."""
    validate(schedule)
    _check_times(schedule, times)
    sim = _Sim(schedule, times)
    ready = list(range(schedule.stages))
    while ready:
        ready.extend(sim.advance(ready.pop()))
    return sim.result()


def _check_times(schedule: Schedule, times: StageTimes) -> None:
    if (times.stages, times.microbatches) != (schedule.stages, schedule.microbatches):
        raise StageSpecError(
            f"times cover {times.stages} stages x {times.microbatches} micro-batches, "
            f"schedule {schedule.name!r} needs {schedule.stages} x {schedule.microbatches}"
        )


class _Sim:
    """Event-driven replay: each stage runs its order until it must wait; a finishing pass wakes the
    stages waiting for it, so every action is visited once."""

    def __init__(self, schedule: Schedule, times: StageTimes) -> None:
        self.schedule, self.times = schedule, times
        self.ends: dict[Key, int] = {}
        self.waiting: dict[Key, list[int]] = defaultdict(list)
        self.done: list[list[TimedAction]] = [[] for _ in range(schedule.stages)]

    def advance(self, s: int) -> list[int]:
        woken: list[int] = []
        order, done = self.schedule.orders[s], self.done[s]
        while len(done) < len(order):
            action = order[len(done)]
            dep = _dependency(self.schedule, s, action)
            if dep is not None and dep not in self.ends:
                self.waiting[dep].append(s)
                break
            free = max(done[-1].end_ns if done else 0, self._arrival(s, action, dep))
            start = free + action_setup(self.schedule, self.times, s, action)
            end = start + action_duration(self.schedule, self.times, s, action)
            done.append(TimedAction(s, action, start, end))
            key = (action.phase, action.microbatch, self.schedule.virtual_stage(s, action.chunk))
            self.ends[key] = end
            woken += [w for w in self.waiting.pop(key, []) if w != s]
        return woken

    def _arrival(self, s: int, action: Action, dep: Key | None) -> int:
        if dep is None:
            return 0
        crosses = dep[2] % self.schedule.stages != s
        return self.ends[dep] + (hop_ns(self.schedule, self.times, s, action) if crosses else 0)

    def result(self) -> Simulation:
        stuck = [f"stage {s} waits at {order[len(d)]}" for s, (order, d) in
                 enumerate(zip(self.schedule.orders, self.done, strict=True)) if len(d) < len(order)]
        if stuck:
            raise StageSpecError(f"schedule {self.schedule.name!r} deadlocks: {'; '.join(stuck)}")
        tail = self.times.tail_ns or (0,) * self.schedule.stages
        step = max((d[-1].end_ns + tail[s] for s, d in enumerate(self.done) if d), default=0)
        busy = tuple(sum(t.end_ns - t.start_ns for t in d) for d in self.done)
        return Simulation(self.schedule, tuple(tuple(d) for d in self.done), step, busy)


def ideal_step_time_ns(times: StageTimes) -> int:
    """No schedule beats the busiest stage's total work."""
    return max(times.stage_total(s) for s in range(times.stages))


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


def what_if(
    times: StageTimes,
    schedule: str,
    chunks: int = 1,
    microbatch_options: tuple[int, ...] | None = None,
    measured_step_ns: int | None = None,
    current_note: str = "",
) -> tuple[Recommendation, ...]:
    """Replay ``times`` under the current schedule, other schedules, other micro-batch counts (default
    2m, 4m and 64) and rebalanced stages; the current setup comes first among equals, all sorted by
    predicted step time. Candidates a schedule cannot run (e.g. interleaved with m % (m // p) != 0)
    are left out. With ``measured_step_ns`` every speed-up is the measured step over the predicted one,
    and the current row's note (``current_note``, else ``off_note``) says how far its replay is off."""
    m = times.microbatches
    current = simulate(make_schedule(schedule, times.stages, m, chunks), times)
    base = measured_step_ns or current.step_time_ns
    note = current_note or (off_note(current.step_time_ns, measured_step_ns) if measured_step_ns else "")
    recs = [_recommend(f"current: {_name(schedule, chunks)}, m={m}", current, base, note)]
    for name, v in CANDIDATE_SCHEDULES:
        if (name, v) != (schedule, chunks):
            note = CHUNK_NOTE if v > 1 else ZB_NOTE if name == "zero_bubble" and not times.weight else ""
            recs += _try(_name(name, v), name, v, times, base, note)
    for m_new in dict.fromkeys(microbatch_options or (2 * m, 4 * m, 64)):
        if m_new != m and m_new >= 1:
            scaled = rescale_microbatches(times, m_new)
            recs += _try(f"m={m_new}", schedule, chunks, scaled, base, SAME_BATCH_NOTE)
    recs += _try("rebalanced stages", schedule, chunks, rebalance(times), base, REBALANCE_NOTE)
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


def _try(label: str, name: str, v: int, times: StageTimes, base: int, note: str) -> list[Recommendation]:
    try:
        sim = simulate(make_schedule(name, times.stages, times.microbatches, v), times)
    except StageSpecError:
        return []
    return [_recommend(label, sim, base, note)]


def _recommend(label: str, sim: Simulation, base: int, note: str = "") -> Recommendation:
    s = sim.schedule
    return Recommendation(
        f"{label} → bubble {sim.bubble_fraction * 100:.1f} %", s.name, s.microbatches, s.chunks,
        sim.step_time_ns, sim.bubble_fraction, base / sim.step_time_ns if sim.step_time_ns else 1.0, note,
    )


def _spread(total: int, parts: int) -> tuple[int, ...]:
    return tuple(_split(total, parts, i) for i in range(parts))


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


def rebalance(times: StageTimes) -> StageTimes:
    """Every stage's passes scaled to the mean total work: the slowest stage's load spread to the others
    (assumes work divides freely between stages, as moving layers approximately does); hand-offs, set-up
    and tails stay as measured."""
    totals = [times.stage_total(s) for s in range(times.stages)]
    target = Fraction(sum(totals), len(totals))
    scale = [target / t if t else Fraction(1) for t in totals]
    return _scaled(times, scale)


def _scaled(times: StageTimes, scale: list[Fraction]) -> StageTimes:
    """Every pass of stage s (of each of its chunks, in ``chunked``) times ``scale[s]``."""
    def grid(g: Grid | None) -> Grid | None:
        if g is None:
            return None
        return tuple(tuple(round(x * scale[r % len(scale)]) for x in row) for r, row in enumerate(g))

    chunked = _scaled(times.chunked, scale) if times.chunked else None
    return replace(
        times, forward=grid(times.forward), backward=grid(times.backward), weight=grid(times.weight), chunked=chunked
    )
