"""The schedule replay: measured per-stage, per-micro-batch F/B/W times under a schedule's action orders,
every pass started when its stage is free and the pass it depends on has ended (``whatif`` recommends from
it; ``calibrate`` measures the hand-offs and set-up that make it meet a measured step).

Pure functions, int64 nanoseconds. A pass's start is max(its stage's previous end, its dependency's end +
hand-off) + set-up, whatever order the stages are visited in, so the replay is the longest path through the
orders' graph: each action's times are looked up once into flat lists (``_plan``) and the graph is walked
with integer keys, each action visited once (``_walk``). The timed actions are built only when asked for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

from pipebubble.analysis.schedules import Action, Schedule, validate
from pipebubble.errors import StageSpecError

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
    """A schedule replayed on measured times: the step runs from 0 to ``step_time_ns``; ``starts`` and
    ``ends`` hold each stage's actions' times in its order."""

    schedule: Schedule
    starts: tuple[tuple[int, ...], ...]
    ends: tuple[tuple[int, ...], ...]
    step_time_ns: int
    busy_ns: tuple[int, ...]

    @functools.cached_property
    def actions(self) -> tuple[tuple[TimedAction, ...], ...]:
        return tuple(
            tuple(TimedAction(s, a, b, e) for a, b, e in zip(order, starts, ends, strict=True))
            for s, (order, starts, ends) in enumerate(zip(self.schedule.orders, self.starts, self.ends, strict=True))
        )

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


def _fits(schedule: Schedule, times: StageTimes) -> bool:
    """The ``chunked`` times are read whole: they exist, the schedule has chunks and they have its shape."""
    fine = times.chunked
    return schedule.chunks > 1 and fine is not None and (fine.stages, fine.microbatches) == (
        schedule.stages * schedule.chunks, schedule.microbatches)


def _row(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> tuple[StageTimes, int, int, int]:
    """Where an action's times lie, as (times, row, parts, part): the ``chunked`` times' row for its virtual
    stage, whole, when they fit the schedule; else the stage's row, cut into equal chunk parts."""
    if _fits(schedule, times):
        return times.chunked, schedule.virtual_stage(stage, action.chunk), 1, 0
    return times, stage, schedule.chunks, action.chunk


def action_duration(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """Duration of one action. Without measured W, a split schedule assumes the backward divides into
    equal input- and weight-gradient halves (B_input ≈ B_weight ≈ F for the usual B ≈ 2F; Qi et al. 2023,
    section 2, take T_F = T_B = T_W); a measured W in an unsplit schedule runs inside B."""
    src, row, parts, part = _row(schedule, times, stage, action)
    value = _table(schedule.split_backward, (src.forward, src.backward, src.weight), row, True)
    return _split(value[_PHASE[action.phase]][action.microbatch], parts, part)


def action_setup(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """The stage's own time before one action, cut like the pass; an unsplit schedule runs a measured W's
    set-up inside B, and a split of an unsplit measurement keeps it all with B."""
    src, row, parts, part = _row(schedule, times, stage, action)
    if src.setup is None:
        return 0
    value = _table(schedule.split_backward, src.setup, row, False)
    return _split(value[_PHASE[action.phase]][action.microbatch], parts, part)


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
    shape = _shape(schedule)
    costs = [_costs(schedule, times, s, stage) for s, stage in enumerate(shape)]
    ends = _walk(shape, costs, schedule.stages * schedule.chunks * schedule.microbatches * len(_PHASE))
    stuck = [f"stage {s} waits at {order[len(e)]}" for s, (order, e) in
             enumerate(zip(schedule.orders, ends, strict=True)) if len(e) < len(order)]
    if stuck:
        raise StageSpecError(f"schedule {schedule.name!r} deadlocks: {'; '.join(stuck)}")
    tail = times.tail_ns or (0,) * schedule.stages
    step = max((e[-1] + tail[s] for s, e in enumerate(ends) if e), default=0)
    starts = tuple(tuple(e - d for e, d in zip(ended, cost[0], strict=True)) for ended, cost in zip(ends, costs,
                                                                                                   strict=True))
    busy = tuple(sum(cost[0]) for cost in costs)
    return Simulation(schedule, starts, tuple(map(tuple, ends)), step, busy)


def _check_times(schedule: Schedule, times: StageTimes) -> None:
    if (times.stages, times.microbatches) != (schedule.stages, schedule.microbatches):
        raise StageSpecError(
            f"times cover {times.stages} stages x {times.microbatches} micro-batches, "
            f"schedule {schedule.name!r} needs {schedule.stages} x {schedule.microbatches}"
        )


_PHASE = {"F": 0, "B": 1, "W": 2}


@functools.lru_cache(maxsize=16)
def _shape(schedule: Schedule) -> tuple[tuple[list, ...], ...]:
    """What a replay needs of the orders whatever the times, once per schedule: per stage, its actions'
    phases (0 F, 1 B, 2 W), micro-batches, chunks, virtual stages, keys, their dependencies' keys (-1: none)
    and whether that dependency ran on another stage. A key numbers (phase, micro-batch, virtual stage)."""
    p, m = schedule.stages, schedule.microbatches
    width = p * schedule.chunks
    last = width - 1
    out = []
    for s, order in enumerate(schedule.orders):
        phases = [_PHASE[a.phase] for a in order]
        mbs = [a.microbatch for a in order]
        chunks = [a.chunk for a in order]
        ks = [c * p + s for c in chunks]
        # ``_dependency``'s rule: F the previous virtual stage's F, B the next one's B (the last's own F), W its B.
        dep_ks = [k - 1 if ph == 0 else k + 1 if ph == 1 and k < last else k for ph, k in zip(phases, ks, strict=True)]
        dep_phases = [0 if ph == 0 or (ph == 1 and k == last) else 1 for ph, k in zip(phases, ks, strict=True)]
        # A key numbers (phase, micro-batch, virtual stage): (phase · m + micro-batch) · width + virtual stage.
        dep_keys = [-1 if dk < 0 else (dp * m + j) * width + dk for dp, j, dk in zip(dep_phases, mbs, dep_ks,
                                                                                      strict=True)]
        crosses = [dk >= 0 and dk % p != s for dk in dep_ks]
        keys = [(ph * m + j) * width + k for ph, j, k in zip(phases, mbs, ks, strict=True)]
        out.append((phases, mbs, chunks, ks, keys, dep_keys, crosses))
    return tuple(out)


def _costs(schedule: Schedule, times: StageTimes, s: int, shape: tuple) -> tuple[list[int], list[int], list[int]]:
    """Stage ``s``'s actions' durations, set-up + duration, and hand-offs in (0 where the dependency ran on
    this stage), in its order, as ``action_duration``, ``action_setup`` and ``hop_ns`` give them."""
    phases, mbs, chunks, ks, _, _, crosses = shape
    fits, split, v = _fits(schedule, times), schedule.split_backward, schedule.chunks
    src = times.chunked if fits else times
    rows = ks if fits else [s] * len(phases)
    grids = (src.forward, src.backward, src.weight)
    passes = {r: _table(split, grids, r, True) for r in set(rows)}
    dur = [passes[r][ph][j] for ph, r, j in zip(phases, rows, mbs, strict=True)]
    if src.setup is None:
        own = [0] * len(phases)
    else:
        setups = {r: _table(split, src.setup, r, False) for r in set(rows)}
        own = [setups[r][ph][j] for ph, r, j in zip(phases, rows, mbs, strict=True)]
    if not fits and v > 1:  # each chunk does an equal part of the stage's measurement
        dur = [_split(d, v, c) for d, c in zip(dur, chunks, strict=True)]
        own = [_split(d, v, c) for d, c in zip(own, chunks, strict=True)]
    hop = [0 if not x else src.p2p_ns if src.hop is None or ph == 2 else src.hop[ph][r][j]
           for x, ph, r, j in zip(crosses, phases, rows, mbs, strict=True)]
    return dur, [a + b for a, b in zip(own, dur, strict=True)], hop


def _table(split: bool, grids: tuple[Grid, Grid, Grid | None], row: int, halves: bool) -> tuple[tuple[int, ...], ...]:
    """Row ``row`` of ``grids`` (forward, backward, weight) as (F, B, W) values per micro-batch (``halves``: a
    duration, whose unmeasured W is half the backward; else a set-up, all of it with B)."""
    forward, backward, weight = (None if g is None else g[row] for g in grids)
    if not split:
        b = backward if weight is None else tuple(x + y for x, y in zip(backward, weight, strict=True))
        return forward, b, ()
    if weight is not None:
        return forward, backward, weight
    if halves:
        return forward, tuple(b - b // 2 for b in backward), tuple(b // 2 for b in backward)
    return forward, backward, (0,) * len(backward)


def _walk(shape: tuple, costs: list, size: int) -> list[list[int]]:
    """Each stage runs its order until an action's dependency has not ended; the action that ends it wakes
    the stage again, so every action is visited once. Returns each stage's ends (shorter than its order
    where it deadlocked)."""
    done: list[int | None] = [None] * size
    waiting: dict[int, list[int]] = {}
    ends: list[list[int]] = [[] for _ in shape]
    ready = list(range(len(shape)))
    while ready:
        s = ready.pop()
        keys, deps = shape[s][4], shape[s][5]
        _, cost, hops = costs[s]
        ended = ends[s]
        free = ended[-1] if ended else 0
        for i in range(len(ended), len(keys)):
            dep = deps[i]
            if dep >= 0:
                at = done[dep]
                if at is None:
                    waiting.setdefault(dep, []).append(s)
                    break
                at += hops[i]
                if at > free:
                    free = at
            elif free < 0:
                free = 0
            free += cost[i]
            ended.append(free)
            key = keys[i]
            done[key] = free
            if key in waiting:
                ready += [w for w in waiting.pop(key) if w != s]
    return ends


def ideal_step_time_ns(times: StageTimes) -> int:
    """No schedule beats the busiest stage's total work."""
    return max(times.stage_total(s) for s in range(times.stages))
