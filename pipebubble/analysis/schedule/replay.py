"""The schedule replay: measured per-stage, per-micro-batch F/B/W times under a schedule's action orders,
every pass started when its stage is free and the pass it depends on has ended (``whatif`` recommends from
it; ``calibrate`` measures the hand-offs and set-up that make it meet a measured step).

Pure functions, int64 nanoseconds. A pass's start is max(its stage's previous end, its dependency's end +
hand-off) + set-up, whatever order the stages are visited in, so the replay is the longest path through the
orders' graph. Every action is an integer key (``schedules.numbered``, once per schedule); what it depends
on is a table by key once per shape (``_links``), its times tables by key once per replay (``_tables``,
built from the grids with slices and C-level maps, not per action), and the graph is walked over the keys,
each action visited once (``_walk``). The timed actions are built only when asked for: a job's what-if
replays some 150,000 actions at 64 stages and needs only each replay's step and busy times.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import repeat
from operator import add, floordiv, mul, sub

from pipebubble.analysis.schedule.schedules import PHASES, Action, Schedule, numbered, validate
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
    ``ends`` hold each stage's actions' times in its order (read from ``ended`` and ``durations``, every
    action's end and duration by key, ``schedules.numbered``, when asked for: a what-if needs only the step
    and the busy times)."""

    schedule: Schedule
    step_time_ns: int
    busy_ns: tuple[int, ...]
    ended: tuple[int | None, ...] = field(repr=False)
    durations: tuple[int, ...] = field(repr=False)

    @functools.cached_property
    def ends(self) -> tuple[tuple[int, ...], ...]:
        return self._by_stage(map(self.ended.__getitem__, numbered(self.schedule)))

    @functools.cached_property
    def starts(self) -> tuple[tuple[int, ...], ...]:
        keys = numbered(self.schedule)
        return self._by_stage(map(sub, map(self.ended.__getitem__, keys), map(self.durations.__getitem__, keys)))

    def _by_stage(self, values: Iterable[int]) -> tuple[tuple[int, ...], ...]:
        """Values in the orders' sequence (every stage's actions one after another) cut into stages."""
        values, p = list(values), self.schedule.stages
        n = len(values) // p
        return tuple(tuple(values[s * n:(s + 1) * n]) for s in range(p))

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


def _key(schedule: Schedule, stage: int, action: Action) -> int:
    """The action's key, as ``schedules.numbered`` numbers it."""
    k = schedule.virtual_stage(stage, action.chunk)
    return (PHASES[action.phase] * schedule.microbatches + action.microbatch) * schedule.stages * schedule.chunks + k


def action_duration(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """Duration of one action. Without measured W, a split schedule assumes the backward divides into
    equal input- and weight-gradient halves (B_input ≈ B_weight ≈ F for the usual B ≈ 2F; Qi et al. 2023,
    section 2, take T_F = T_B = T_W); a measured W in an unsplit schedule runs inside B."""
    return _tables(schedule, times)[0][_key(schedule, stage, action)]


def action_setup(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """The stage's own time before one action, cut like the pass; an unsplit schedule runs a measured W's
    set-up inside B, and a split of an unsplit measurement keeps it all with B."""
    return _tables(schedule, times)[1][_key(schedule, stage, action)]


def hop_ns(schedule: Schedule, times: StageTimes, stage: int, action: Action) -> int:
    """The hand-off into ``action`` on ``stage`` from the stage its dependency ran on."""
    return _tables(schedule, times)[2][_key(schedule, stage, action)]


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
    keys = numbered(schedule)
    p = schedule.stages
    deps, crosses = _links(p, schedule.microbatches, schedule.chunks)
    durations, setups, hops = _tables(schedule, times)
    n = len(keys) // p if p else 0
    cost = list(map(add, setups, durations)) if any(setups) else durations
    end, stop = _walk(keys, deps, cost, list(map(mul, hops, crosses)) if any(hops) else hops, p, n)
    stuck = [f"stage {s} waits at {order[at - s * n]}" for s, (order, at) in
             enumerate(zip(schedule.orders, stop, strict=True)) if at < (s + 1) * n]
    if stuck:
        raise StageSpecError(f"schedule {schedule.name!r} deadlocks: {'; '.join(stuck)}")
    tail = times.tail_ns or (0,) * p
    step = max((end[keys[(s + 1) * n - 1]] + tail[s] for s in range(p)), default=0) if n else 0
    busy = tuple(sum(durations[s::p]) for s in range(p))  # a key's stage is key % p
    return Simulation(schedule, step, busy, tuple(end[:-1]), tuple(durations))


def _check_times(schedule: Schedule, times: StageTimes) -> None:
    if (times.stages, times.microbatches) != (schedule.stages, schedule.microbatches):
        raise StageSpecError(
            f"times cover {times.stages} stages x {times.microbatches} micro-batches, "
            f"schedule {schedule.name!r} needs {schedule.stages} x {schedule.microbatches}"
        )


@functools.lru_cache(maxsize=16)
def _links(p: int, m: int, v: int) -> tuple[list[int], list[int]]:
    """Per key (``schedules.numbered``), whatever the order: the key of the pass it depends on
    (``_dependency``; ``3 · m · p · v``: none) and 1 where that pass runs on another stage, else 0. Keys run
    F, B, W, each micro-batch by micro-batch over the virtual stages, so each rule is a slice."""
    width = p * v
    block, last = m * width, width - 1
    forward = list(range(-1, block - 1))  # the previous virtual stage's F, none on the first
    forward[::width] = [3 * block] * m
    backward = list(range(block + 1, 2 * block + 1))  # the next virtual stage's B; on the last, its own F
    backward[last::width] = range(last, block, width)
    deps = forward + backward + list(range(block, 2 * block))  # W: its own B
    # Only F and B hand off, to a neighbouring virtual stage, which lies on another stage when p > 1.
    crosses = [int(p > 1)] * (2 * block) + [0] * block
    crosses[:block:width] = [0] * m  # F on the first virtual stage: no dependency
    crosses[block + last:2 * block:width] = [0] * m  # B on the last: its own F
    return deps, crosses


def _tables(schedule: Schedule, times: StageTimes) -> tuple[list[int], list[int], list[int]]:
    """Every action's duration, set-up and hand-off in (whether or not its dependency ran on another stage),
    indexed by key (``schedules.numbered``; no W keys in an unsplit schedule): from the ``chunked`` times'
    row for its virtual stage, whole, when they fit the schedule; else from its stage's row, duration and
    set-up cut into equal chunk parts."""
    fits, split = _fits(schedule, times), schedule.split_backward
    src, chunks = (times.chunked, 1) if fits else (times, schedule.chunks)
    durations = _by_key(_phases(split, (src.forward, src.backward, src.weight), True), chunks, True)
    if src.setup is None:
        setups = [0] * len(durations)
    else:
        setups = _by_key(_phases(split, src.setup, False), chunks, True)
    if src.hop is None and not src.p2p_ns:
        return durations, setups, [0] * len(durations)
    blank = tuple((src.p2p_ns,) * len(row) for row in src.forward)
    forward, backward = src.hop if src.hop is not None else (blank, blank)
    return durations, setups, _by_key((forward, backward, blank if split else None), chunks, False)


def _phases(split: bool, grids: tuple[Grid, Grid, Grid | None], halves: bool) -> tuple[Grid, Grid, Grid | None]:
    """``grids`` (forward, backward, weight) as the (F, B, W) grids the schedule runs, W None when it runs
    none (``halves``: durations, whose unmeasured W is half the backward; else set-ups, all of theirs with B)."""
    forward, backward, weight = grids
    if not split:
        b = backward if weight is None else tuple(tuple(map(add, x, y)) for x, y in zip(backward, weight, strict=True))
        return forward, b, None
    if weight is not None:
        return forward, backward, weight
    if halves:
        weight = tuple(tuple(map(floordiv, row, repeat(2))) for row in backward)
        return forward, tuple(tuple(map(sub, row, half)) for row, half in zip(backward, weight, strict=True)), weight
    return forward, backward, tuple((0,) * len(row) for row in backward)


def _by_key(grids: tuple[Grid, Grid, Grid | None], chunks: int, cut: bool) -> list[int]:
    """The (F, B, W) grids' values in key order (phase, micro-batch, virtual stage; W None: none). Each row stands for
    ``chunks`` virtual stages (1: the rows are virtual stages), chunk c of a row taking part c of its value
    when ``cut`` (``_split``), else all of it."""
    out: list[int] = []
    for grid in filter(None, grids):
        for column in zip(*grid, strict=True):  # one micro-batch over the rows
            if chunks == 1:
                out += column
            elif cut:  # ``_split``'s part c of d, d // v + (c < d % v), is (d + v - 1 - c) // v
                for c in range(chunks):
                    out += map(floordiv, map(add, column, repeat(chunks - 1 - c)), repeat(chunks))
            else:
                out += column * chunks
    return out


def _walk(keys: list[int], deps: list[int], cost: list[int], hop: list[int], p: int, n: int
          ) -> tuple[list[int | None], list[int]]:
    """Each of the ``p`` stages (``n`` ``keys`` each, one stage after another) runs its order until an
    action's dependency (``deps``) has not ended; the action that ends it wakes the stage again, so every
    action is visited once. An action starts at max(its stage's previous end, its dependency's end + ``hop``)
    and ends ``cost`` later (both by key). Returns every key's end (None where its stage deadlocked before
    it) and where each stage stopped (the end of its keys: done).

    A key has one waiter to wake: only another stage's pass and, for a B, its own stage's W depend on it,
    and a stage waiting for its own pass never runs it (both deadlock)."""
    end: list[int | None] = [None] * len(deps) + [0]  # the last entry: "no dependency", ended at the start
    waiter = [-1] * len(deps)
    stop, free_at = [s * n for s in range(p)], [0] * p
    ready = list(range(p))
    while ready:
        s = ready.pop()
        i, last, free = stop[s], (s + 1) * n, free_at[s]
        while i < last:
            key = keys[i]
            dep = deps[key]
            at = end[dep]
            if at is None:
                waiter[dep] = s
                break
            at += hop[key]
            if at > free:
                free = at
            free += cost[key]
            end[key] = free
            woken = waiter[key]
            if woken >= 0:
                ready.append(woken)
            i += 1
        stop[s], free_at[s] = i, free
    return end, stop


def ideal_step_time_ns(times: StageTimes) -> int:
    """No schedule beats the busiest stage's total work."""
    return max(times.stage_total(s) for s in range(times.stages))
