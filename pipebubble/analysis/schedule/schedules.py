"""Pipeline schedules as per-stage action orders: which forward (F), backward (B) and weight-gradient (W)
pass each stage runs, in what order. Pure functions; the simulator in ``whatif.py`` turns an order into times.

Stage ``s`` of ``p`` hosts model chunks ``s, s + p, s + 2p, ...`` (Megatron-LM's interleaved layout,
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", section 2.2), so
chunk ``c`` of stage ``s`` is virtual stage ``c * p + s``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache
from itertools import chain, repeat, zip_longest
from operator import add, attrgetter

from pipebubble.errors import StageSpecError

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
PHASES = {"F": 0, "B": 1, "W": 2}  #: a phase's number in ``numbered``


@dataclass(frozen=True, order=True)
class Action:
    """One pass of one micro-batch through one model chunk: phase "F", "B" or "W"."""

    phase: str
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.phase}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """Per-stage action orders. ``split_backward``: B is the input gradient only and W runs separately
    (zero-bubble); otherwise B is the whole backward pass."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    orders: tuple[tuple[Action, ...], ...]

    @cached_property
    def split_backward(self) -> bool:
        keys = numbered(self)  # W keys come after every F and B key
        if keys:
            return max(keys) >= 2 * self.microbatches * self.stages * self.chunks
        return "W" in map(attrgetter("phase"), chain.from_iterable(self.orders))

    def virtual_stage(self, stage: int, chunk: int) -> int:
        return chunk * self.stages + stage

    def __hash__(self) -> int:
        # By its shape only (equal schedules have equal shapes): a replay's caches look schedules of thousands
        # of actions up, and hashing every action each time would cost more than the lookup saves.
        return hash((self.name, self.stages, self.microbatches, self.chunks))


def _check_sizes(stages: int, microbatches: int, chunks: int) -> None:
    if stages < 1 or microbatches < 1 or chunks < 1:
        raise StageSpecError(
            "a pipeline needs stages, micro-batches and chunks >= 1, "
            f"got p={stages}, m={microbatches}, v={chunks}"
        )


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019): every forward, then every backward, in micro-batch order
    (the order of torch.distributed.pipelining.ScheduleGPipe)."""
    _check_sizes(stages, microbatches, 1)
    order = tuple(Action("F", j) for j in range(microbatches)) + tuple(
        Action("B", j) for j in range(microbatches)
    )
    return Schedule("gpipe", stages, microbatches, 1, (order,) * stages)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): stage s runs p - s - 1 warm-up forwards, then
    alternates one forward and one backward, then drains the remaining backwards."""
    _check_sizes(stages, microbatches, 1)
    forwards = tuple(Action("F", j) for j in range(microbatches))
    backwards = tuple(Action("B", j) for j in range(microbatches))
    orders = tuple(_interleave(forwards, backwards, stages - s - 1) for s in range(stages))
    return Schedule("1f1b", stages, microbatches, 1, orders)


def interleaved_1f1b(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2; Megatron-LM's interleaved schedule).

    Forwards visit the chunks depth-first in groups of ``g`` micro-batches (g micro-batches on chunk 0,
    the same g on chunk 1, ...); backwards visit the chunks in reverse. Stage s warms up with
    ``(v - 1) * g + 2 * (p - s - 1)`` forwards. Megatron requires m % p == 0 and uses g = p; for other m we
    take torch.distributed.pipelining's rule: r = max(1, m // p) rounds of g = m / r micro-batches, which
    needs m % r == 0 (uneven rounds can deadlock)."""
    _check_sizes(stages, microbatches, chunks)
    if chunks == 1:
        return one_f_one_b(stages, microbatches)
    rounds = max(1, microbatches // stages)
    if microbatches % rounds:
        raise StageSpecError(
            f"interleaved 1F1B runs micro-batches in {rounds} equal rounds (m // p): "
            f"m={microbatches} is not a multiple of {rounds}"
        )
    group = microbatches // rounds
    forwards = _depth_first(microbatches, chunks, group, reverse=False)
    backwards = _depth_first(microbatches, chunks, group, reverse=True)
    orders = []
    for s in range(stages):
        warmup = (chunks - 1) * group + 2 * (stages - s - 1)
        orders.append(_interleave(forwards, backwards, warmup))
    return Schedule("interleaved_1f1b", stages, microbatches, chunks, tuple(orders))


def zero_bubble(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.1): the 1F1B order with the
    backward split into B (input gradient) and W (weight gradient). Stage s keeps 1F1B's p - s - 1 warm-up
    forwards and defers its first s W passes (the same as torch.distributed.pipelining's
    ScheduleInterleavedZeroBubble with one chunk): afterwards each F, B pair is followed by the oldest
    pending W, and the deferred W passes fill the tail of the pipeline."""
    _check_sizes(stages, microbatches, 1)
    forwards = tuple(Action("F", j) for j in range(microbatches))
    backwards = tuple(Action("B", j) for j in range(microbatches))
    weights = tuple(Action("W", j) for j in range(microbatches))
    orders = tuple(_interleave(forwards, backwards, stages - s - 1, weights, s) for s in range(stages))
    return Schedule("zero_bubble", stages, microbatches, 1, orders)


def _depth_first(microbatches: int, chunks: int, group: int, reverse: bool) -> tuple[Action, ...]:
    chunk_order = range(chunks - 1, -1, -1) if reverse else range(chunks)
    out: list[Action] = []
    for first in range(0, microbatches, group):
        members = range(first, min(first + group, microbatches))
        out += [Action("F" if not reverse else "B", j, c) for c in chunk_order for j in members]
    return tuple(out)


def _interleave(
    forwards: tuple[Action, ...], backwards: tuple[Action, ...], warmup: int,
    weights: tuple[Action, ...] = (), defer: int = 0,
) -> tuple[Action, ...]:
    """Warm-up forwards, then F/B pairs, then the remaining backwards. With ``weights`` (each backward's W
    pass) every backward is followed by the oldest W pass not yet run, except that the first ``defer`` W
    passes wait until the end. Built by slicing and zipping the shared actions: a schedule of many stages
    builds thousands of orders."""
    warmup = min(warmup, len(forwards))
    released = weights[:max(0, len(weights) - defer)]  # the W passes run after the backwards from ``defer`` on
    after = (None,) * min(defer, len(backwards)) + released if weights else ()
    body = chain.from_iterable(zip_longest(forwards[warmup:], backwards, after))
    return forwards[:warmup] + tuple(filter(None, body)) + weights[len(released):]  # an Action is never falsy


def _expected(schedule: Schedule) -> Counter[Action]:
    phases = ("F", "B", "W") if schedule.split_backward else ("F", "B")
    m, v = schedule.microbatches, schedule.chunks
    return Counter(Action(ph, j, c) for ph in phases for j in range(m) for c in range(v))


def validate(schedule: Schedule) -> None:
    """Every stage runs each (phase, micro-batch, chunk) exactly once (checked once per schedule)."""
    _validate(schedule)


@lru_cache(maxsize=16)
def numbered(schedule: Schedule) -> list[int] | None:
    """Every stage's actions one after another, each as its key (phase · m + micro-batch) · (p · v) + virtual
    stage (phases F, B, W: ``PHASES``), which numbers each action of a valid schedule once; None when an
    action's phase, micro-batch or chunk is not the schedule's. The builders share action objects between
    stages, so the first stage's are read and the rest looked up by identity (others are read one by one):
    a schedule of many stages holds many actions."""
    p, m, v = schedule.stages, schedule.microbatches, schedule.chunks
    known = {id(a): _base(a, p, m, v) for a in schedule.orders[0]} if schedule.orders else {}
    codes = list(map(known.get, map(id, chain.from_iterable(schedule.orders))))
    if None in codes:  # actions of their own on later stages (orders written out by hand)
        flat = list(chain.from_iterable(schedule.orders))
        known.update((id(a), _base(a, p, m, v)) for a in flat)
        codes = list(map(known.get, map(id, flat)))
    if -1 in known.values():  # every action known is one of the orders'
        return None
    stage = chain.from_iterable(map(repeat, range(len(schedule.orders)), map(len, schedule.orders)))
    return list(map(add, codes, stage))


def _base(action: Action, p: int, m: int, v: int) -> int:
    """An action's key on stage 0 (``numbered``), -1 when its phase, micro-batch or chunk is not known."""
    phase = PHASES.get(action.phase)
    if phase is None or not (0 <= action.microbatch < m and 0 <= action.chunk < v):
        return -1
    return (phase * m + action.microbatch) * p * v + action.chunk * p


@lru_cache(maxsize=64)
def _validate(schedule: Schedule) -> None:
    if len(schedule.orders) != schedule.stages:
        raise StageSpecError(
            f"schedule {schedule.name!r}: {len(schedule.orders)} orders for {schedule.stages} stages"
        )
    size = (3 if schedule.split_backward else 2) * schedule.microbatches * schedule.chunks
    if any(len(order) != size for order in schedule.orders):
        _explain(schedule)
    keys = numbered(schedule)
    if keys is None or len(set(keys)) != len(keys):  # each stage its expected actions exactly once, or not
        _explain(schedule)


def _explain(schedule: Schedule) -> None:
    """Raise what is wrong with the first stage that does not run each expected action exactly once."""
    expected = _expected(schedule)
    for s, order in enumerate(schedule.orders):
        got = Counter(order)
        if got != expected:
            extra, missing = sorted((got - expected).elements()), sorted((expected - got).elements())
            raise StageSpecError(
                f"schedule {schedule.name!r}, stage {s}: each pass must run exactly once; "
                f"repeated or unknown: {', '.join(map(str, extra)) or 'none'}; "
                f"missing: {', '.join(map(str, missing)) or 'none'}"
            )


@lru_cache(maxsize=64)
def make_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The named schedule; ``chunks`` applies to interleaved_1f1b only. Built once per shape (frozen): a
    job's report replays the same schedules several times."""
    if name == "interleaved_1f1b":
        return interleaved_1f1b(stages, microbatches, chunks)
    if chunks != 1:
        raise StageSpecError(f"schedule {name!r} runs one chunk per stage, got chunks={chunks}")
    builders = {"gpipe": gpipe, "1f1b": one_f_one_b, "zero_bubble": zero_bubble}
    if name not in builders:
        raise StageSpecError(f"unknown schedule {name!r}: expected one of {', '.join(SCHEDULES)}")
    return builders[name](stages, microbatches)


# --- closed forms for equal stages ------------------------------------------------------------------------

PassTimes = tuple[Fraction, Fraction, Fraction]
"""One micro-batch's (T_F, T_B, T_W) on one stage: B the input gradient, W the weight gradient; T_W = 0
means B is the whole backward. The default takes the usual B = 2F."""


def closed_form_bubble_time(
    name: str, stages: int, chunks: int = 1, passes: PassTimes = (Fraction(1), Fraction(2), Fraction(0))
) -> Fraction:
    """Idle time per stage. GPipe / 1F1B: (p-1)(T_F+T_B+T_W) (Huang et al. 2019; Narayanan et al. 2021);
    interleaved with v chunks: that divided by v (Narayanan et al. 2021, section 2.2); ZB-H1:
    (p-1)(T_F+T_B-T_W) (Qi et al. 2023, section 2.1). The simulator meets all three exactly for equal
    stages when m >= p; with fewer micro-batches the pipeline never fills and the bubble is larger."""
    t_f, t_b, t_w = (Fraction(x) for x in passes)
    if name == "zero_bubble":
        return max(Fraction(0), (stages - 1) * (t_f + t_b - t_w))
    return (stages - 1) * (t_f + t_b + t_w) / (chunks if name == "interleaved_1f1b" else 1)


def closed_form_step_time(
    name: str, stages: int, microbatches: int, chunks: int = 1,
    passes: PassTimes = (Fraction(1), Fraction(2), Fraction(0)),
) -> Fraction:
    """Ideal step time m(T_F+T_B+T_W) plus the schedule's bubble time per stage."""
    return microbatches * sum(map(Fraction, passes)) + closed_form_bubble_time(name, stages, chunks, passes)


def closed_form_bubble(
    name: str, stages: int, microbatches: int, chunks: int = 1,
    passes: PassTimes = (Fraction(1), Fraction(2), Fraction(0)),
) -> Fraction:
    """Bubble fraction: GPipe / 1F1B (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1), ZB-H1
    (p-1)(T_F+T_B-T_W) / (m(T_F+T_B+T_W) + (p-1)(T_F+T_B-T_W)), whose bubble time is a third of 1F1B's
    when T_F = T_B = T_W."""
    bubble = closed_form_bubble_time(name, stages, chunks, passes)
    return bubble / closed_form_step_time(name, stages, microbatches, chunks, passes)
