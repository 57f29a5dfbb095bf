"""The replay and the schedule builders against the plain implementations they replaced (copied below as
``reference_*``, unchanged but for their names): the same orders, the same validation errors, and the same
start and end of every action, step time, busy time and deadlock message, over random schedules (the four
builders and shuffled or broken orders), sizes, chunks and measured times (weights, hand-offs, set-up,
tails, p2p and per-virtual-stage times that fit the schedule or do not)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from pipebubble.analysis.schedule.replay import StageTimes, action_duration, action_setup, hop_ns, simulate
from pipebubble.analysis.schedule.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    make_schedule,
    validate,
)
from pipebubble.errors import StageSpecError

# --- the reference: the schedule builders' orders and the replay as they were ----------------------------


def reference_interleave(forwards, backwards, warmup, defer_w):
    warmup = min(warmup, len(forwards))
    order = list(forwards[:warmup])
    pending = []
    steady = len(forwards) - warmup
    for i, backward in enumerate(backwards):
        if i < steady:
            order.append(forwards[warmup + i])
        order.append(backward)
        if defer_w:
            pending.append(Action("W", backward.microbatch, backward.chunk))
            if i >= defer_w[0]:
                order.append(pending.pop(0))
    return tuple(order + pending)


def reference_depth_first(microbatches, chunks, group, reverse):
    chunk_order = range(chunks - 1, -1, -1) if reverse else range(chunks)
    out = []
    for first in range(0, microbatches, group):
        members = range(first, min(first + group, microbatches))
        out += [Action("F" if not reverse else "B", j, c) for c in chunk_order for j in members]
    return tuple(out)


def reference_orders(name, p, m, v):
    """The builders' orders (``make_schedule`` has checked the sizes)."""
    forwards = tuple(Action("F", j) for j in range(m))
    backwards = tuple(Action("B", j) for j in range(m))
    if name == "gpipe":
        return (forwards + backwards,) * p
    if name == "1f1b" or (name == "interleaved_1f1b" and v == 1):
        return tuple(reference_interleave(forwards, backwards, p - s - 1, ()) for s in range(p))
    if name == "zero_bubble":
        return tuple(reference_interleave(forwards, backwards, p - s - 1, (s,)) for s in range(p))
    group = m // max(1, m // p)
    forwards = reference_depth_first(m, v, group, reverse=False)
    backwards = reference_depth_first(m, v, group, reverse=True)
    return tuple(reference_interleave(forwards, backwards, (v - 1) * group + 2 * (p - s - 1), ()) for s in range(p))


def reference_validate(schedule):
    if len(schedule.orders) != schedule.stages:
        raise StageSpecError(
            f"schedule {schedule.name!r}: {len(schedule.orders)} orders for {schedule.stages} stages"
        )
    m, v = schedule.microbatches, schedule.chunks
    code = {ph: i for i, ph in enumerate(("F", "B", "W") if schedule.split_backward else ("F", "B"))}
    size = len(code) * m * v
    for s, order in enumerate(schedule.orders):
        seen = {(code[a.phase] * m + a.microbatch) * v + a.chunk for a in order
                if a.phase in code and 0 <= a.microbatch < m and 0 <= a.chunk < v}
        if len(order) == size and len(seen) == size:
            continue
        phases = ("F", "B", "W") if schedule.split_backward else ("F", "B")
        expected = Counter(Action(ph, j, c) for ph in phases for j in range(m) for c in range(v))
        got = Counter(order)
        if got != expected:
            extra, missing = sorted((got - expected).elements()), sorted((expected - got).elements())
            raise StageSpecError(
                f"schedule {schedule.name!r}, stage {s}: each pass must run exactly once; "
                f"repeated or unknown: {', '.join(map(str, extra)) or 'none'}; "
                f"missing: {', '.join(map(str, missing)) or 'none'}"
            )


_PHASE = {"F": 0, "B": 1, "W": 2}


def _split(total, parts, index):
    return total // parts + (1 if index < total % parts else 0)


def _fits(schedule, times):
    fine = times.chunked
    return schedule.chunks > 1 and fine is not None and (fine.stages, fine.microbatches) == (
        schedule.stages * schedule.chunks, schedule.microbatches)


def _row(schedule, times, stage, action):
    if _fits(schedule, times):
        return times.chunked, schedule.virtual_stage(stage, action.chunk), 1, 0
    return times, stage, schedule.chunks, action.chunk


def reference_action_duration(schedule, times, stage, action):
    src, row, parts, part = _row(schedule, times, stage, action)
    value = _table(schedule.split_backward, (src.forward, src.backward, src.weight), row, True)
    return _split(value[_PHASE[action.phase]][action.microbatch], parts, part)


def reference_action_setup(schedule, times, stage, action):
    src, row, parts, part = _row(schedule, times, stage, action)
    if src.setup is None:
        return 0
    value = _table(schedule.split_backward, src.setup, row, False)
    return _split(value[_PHASE[action.phase]][action.microbatch], parts, part)


def reference_hop_ns(schedule, times, stage, action):
    src, row, _, _ = _row(schedule, times, stage, action)
    if src.hop is None or action.phase == "W":
        return src.p2p_ns
    return src.hop[0 if action.phase == "F" else 1][row][action.microbatch]


def reference_simulate(schedule, times):
    """(starts, ends, step time, busy) per stage, or StageSpecError."""
    reference_validate(schedule)
    if (times.stages, times.microbatches) != (schedule.stages, schedule.microbatches):
        raise StageSpecError("times of another shape")
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
    return starts, tuple(map(tuple, ends)), step, busy


def _shape(schedule):
    p, m = schedule.stages, schedule.microbatches
    width = p * schedule.chunks
    last = width - 1
    out = []
    for s, order in enumerate(schedule.orders):
        phases = [_PHASE[a.phase] for a in order]
        mbs = [a.microbatch for a in order]
        chunks = [a.chunk for a in order]
        ks = [c * p + s for c in chunks]
        dep_ks = [k - 1 if ph == 0 else k + 1 if ph == 1 and k < last else k for ph, k in zip(phases, ks, strict=True)]
        dep_phases = [0 if ph == 0 or (ph == 1 and k == last) else 1 for ph, k in zip(phases, ks, strict=True)]
        dep_keys = [-1 if dk < 0 else (dp * m + j) * width + dk for dp, j, dk in zip(dep_phases, mbs, dep_ks,
                                                                                      strict=True)]
        crosses = [dk >= 0 and dk % p != s for dk in dep_ks]
        keys = [(ph * m + j) * width + k for ph, j, k in zip(phases, mbs, ks, strict=True)]
        out.append((phases, mbs, chunks, ks, keys, dep_keys, crosses))
    return tuple(out)


def _costs(schedule, times, s, shape):
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
    if not fits and v > 1:
        dur = [_split(d, v, c) for d, c in zip(dur, chunks, strict=True)]
        own = [_split(d, v, c) for d, c in zip(own, chunks, strict=True)]
    hop = [0 if not x else src.p2p_ns if src.hop is None or ph == 2 else src.hop[ph][r][j]
           for x, ph, r, j in zip(crosses, phases, rows, mbs, strict=True)]
    return dur, [a + b for a, b in zip(own, dur, strict=True)], hop


def _table(split, grids, row, halves):
    forward, backward, weight = (None if g is None else g[row] for g in grids)
    if not split:
        b = backward if weight is None else tuple(x + y for x, y in zip(backward, weight, strict=True))
        return forward, b, ()
    if weight is not None:
        return forward, backward, weight
    if halves:
        return forward, tuple(b - b // 2 for b in backward), tuple(b // 2 for b in backward)
    return forward, backward, (0,) * len(backward)


def _walk(shape, costs, size):
    done = [None] * size
    waiting = {}
    ends = [[] for _ in shape]
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


# --- random cases ----------------------------------------------------------------------------------------


def _grid(rng: random.Random, rows: int, m: int, low: int, high: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(rng.randint(low, high) for _ in range(m)) for _ in range(rows))


def _times(rng: random.Random, rows: int, m: int, split_w: bool) -> StageTimes:
    weight = _grid(rng, rows, m, 0, 60) if split_w else None
    times = StageTimes(_grid(rng, rows, m, 0, 80), _grid(rng, rows, m, 0, 160), weight, rng.choice([0, 0, 3, 17]))
    if rng.random() < 0.6:
        setup = (_grid(rng, rows, m, 0, 9), _grid(rng, rows, m, 0, 9), _grid(rng, rows, m, 0, 9) if weight else None)
        hop = (_grid(rng, rows, m, 0, 25), _grid(rng, rows, m, 0, 25)) if rng.random() < 0.8 else None
        times = replace(times, hop=hop, setup=setup)
    return times


def _case(seed: int) -> tuple[Schedule, StageTimes]:
    rng = random.Random(seed)
    name = rng.choice(SCHEDULES)
    p, m = rng.randint(1, 6), rng.randint(1, 12)
    v = rng.randint(1, 4) if name == "interleaved_1f1b" else 1
    try:
        schedule = make_schedule(name, p, m, v)
    except StageSpecError:
        schedule = make_schedule("1f1b", p, m)
    times = _times(rng, p, m, rng.random() < 0.4)
    if rng.random() < 0.3:
        times = replace(times, tail_ns=tuple(rng.randint(0, 30) for _ in range(p)))
    if rng.random() < 0.4:  # per virtual stage: of the schedule's shape, or (rarely) not
        rows = p * schedule.chunks + (rng.random() < 0.2)
        times = replace(times, chunked=_times(rng, rows, m, times.weight is not None))
    if rng.random() < 0.3:  # another order of the same passes (most deadlock), or a broken one
        orders = [list(o) for o in schedule.orders]
        for order in orders:
            if rng.random() < 0.5:
                rng.shuffle(order)
        if rng.random() < 0.2:
            orders[rng.randrange(p)][0] = Action(rng.choice("FBWX"), rng.randint(-1, m), rng.randint(0, v))
        schedule = Schedule("custom", p, m, schedule.chunks, tuple(map(tuple, orders)))
    return schedule, times


def _outcome(run, *args):
    try:
        return run(*args)
    except StageSpecError as error:
        return str(error)


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_builders_give_the_reference_orders(name: str) -> None:
    for p in range(1, 7):
        for m in range(1, 13):
            for v in range(1, 5) if name == "interleaved_1f1b" else (1,):
                try:
                    schedule = make_schedule(name, p, m, v)
                except StageSpecError:
                    continue
                assert schedule.orders == reference_orders(name, p, m, v), (p, m, v)


@pytest.mark.parametrize("block", range(8))
def test_the_replay_meets_the_reference_action_for_action(block: int) -> None:
    for seed in range(block * 100, (block + 1) * 100):
        schedule, times = _case(seed)
        assert _outcome(validate, schedule) == _outcome(reference_validate, schedule), seed
        new = _outcome(simulate, schedule, times)
        want = _outcome(reference_simulate, schedule, times)
        got = new if isinstance(new, str) else (new.starts, new.ends, new.step_time_ns, new.busy_ns)
        assert got == want, seed
        if isinstance(want, str):
            continue
        for s, order in enumerate(schedule.orders):
            for a in order:
                assert action_duration(schedule, times, s, a) == reference_action_duration(schedule, times, s, a)
                assert action_setup(schedule, times, s, a) == reference_action_setup(schedule, times, s, a)
                assert hop_ns(schedule, times, s, a) == reference_hop_ns(schedule, times, s, a)
